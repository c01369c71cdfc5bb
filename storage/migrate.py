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
