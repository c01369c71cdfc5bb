"""Alembic, driven from code: the app and the worker bring the schema to head at start-up.

New revision after changing models.py (autogenerate diffs models.py against a database at head):
    export TOKENSWIFT_DB=sqlite:////tmp/scratch.db
    .venv/bin/python -c "from storage import open_store; open_store('$TOKENSWIFT_DB')"
    .venv/bin/alembic -c storage/alembic.ini revision --autogenerate -m "what changed"
then read the file it writes in storage/migrations/versions (batch mode is on for SQLite's ALTER).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

MIGRATIONS = Path(__file__).with_name("migrations")
# pg_advisory_xact_lock's key: any constant the app uses for nothing else ("TSWIFT" in ASCII).
MIGRATION_LOCK = 0x545357494654


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply the missing revisions in one transaction (SQLite DDL is transactional with our BEGIN), so
    two processes starting together serialise on the write lock and the second finds nothing to do. On
    PostgreSQL (transactional DDL too) an advisory lock held to the commit serialises them the same way:
    without it, two workers starting at once would both try to create the tables."""
    config = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":  # wait as long as the other's migration takes
            connection.execute(text("SET LOCAL lock_timeout = 0"))
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
