"""The SQLite or PostgreSQL store (any SQLAlchemy URL) shared by the UI, the REST API and the workers."""

from storage.db import open_store
from storage.errors import Conflict, NotFound, StoreError
from storage.repo import Store

__all__ = ["Conflict", "NotFound", "Store", "StoreError", "open_store"]
