"""The SQLite (or any SQLAlchemy URL) store shared by the UI, the REST API and the worker."""

from storage.db import open_store
from storage.errors import Conflict, NotFound, StoreError
from storage.repo import Store

__all__ = ["Conflict", "NotFound", "Store", "StoreError", "open_store"]
