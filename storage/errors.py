"""Errors the store raises. The API maps them to HTTP codes: NotFound 404, Conflict 409, StoreError 503."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database cannot be written or read (full disk, read-only file, locked for too long)."""


class NotFound(LookupError):
    def __init__(self, what: str, ident: object):
        super().__init__(f"no {what} {ident}")
        self.what = what
        self.ident = ident


class Conflict(ValueError):
    """The request does not fit the current state (e.g. resuming a finished generation)."""


class Invalid(ValueError):
    """A value the request names is out of range (the API answers 422 naming `field`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
