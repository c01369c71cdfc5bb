"""The lease clock: when a job's heartbeat was last written, and how old it is.

On PostgreSQL it is the database server's clock (in naive UTC, as every time in the store), so that a worker
judging another machine's lease never depends on the two machines' clocks agreeing. On SQLite, whose
processes share one machine, it is that machine's clock.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, func
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from storage.records import utcnow


def lease_now(s: Session) -> datetime | ColumnElement[datetime]:
    """A value for heartbeat_at, or for comparing with it in a query."""
    if s.get_bind().dialect.name == "postgresql":
        return func.timezone("UTC", func.now(), type_=DateTime)
    return utcnow()
