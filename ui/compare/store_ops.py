"""The store as Compare sees it: the book its runs go in, and what the drafts service uses.

A Protocol that the Store satisfies: tests/test_store_ops.py checks each signature against the Store's, and
that the room's modules call nothing else on it."""

from __future__ import annotations

from typing import Protocol

from storage.models import BOOK
from storage.records import SessionRecord
from ui.drafts.store_ops import DraftsStore


class CompareStore(DraftsStore, Protocol):
    def create_session(self, title: str = "Untitled", author: str = "", kind: str = BOOK) -> SessionRecord: ...
