"""Alembic environment: uses the caller's connection (storage.migrate.upgrade) or, from the alembic
command line, the URL in $TOKENSWIFT_DB."""

import os

from alembic import context
from sqlalchemy import create_engine

from storage.models import Base

# SQLite can barely ALTER: batch mode rebuilds a table (create new, copy, drop, rename) instead.
OPTIONS = {"target_metadata": Base.metadata, "render_as_batch": True, "compare_type": True}


def run_with(connection) -> None:
    context.configure(connection=connection, **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    engine = create_engine(os.environ["TOKENSWIFT_DB"])
    with engine.connect() as connection:
        run_with(connection)


if context.is_offline_mode():
    context.configure(url=os.environ["TOKENSWIFT_DB"], literal_binds=True, **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_online()
