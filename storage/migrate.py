"""Alembic, driven from code: the app and the worker bring the schema to head at start-up.

New revision after changing models.py:
    .venv/bin/alembic -c storage/alembic.ini revision --autogenerate -m "what changed"
(the ini reads the database URL from $TOKENSWIFT_DB; point it at a scratch file migrated to head).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply the missing revisions in one transaction (SQLite DDL is transactional with our BEGIN), so
    two processes starting together serialise on the write lock and the second finds nothing to do."""
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
