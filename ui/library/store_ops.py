"""The store as the Library sees it: books and their drafts, renamed and deleted, and what the Write tab uses (a draft
opens there).

A Protocol that the Store satisfies: tests/test_store_ops.py checks each signature against the Store's, and
that the room's modules call nothing else on it."""

from __future__ import annotations

from typing import Protocol

from storage.models import BOOK
from storage.overview import DraftSummary
from storage.records import SessionRecord
from ui.write.store_ops import WriteStore


class LibraryStore(WriteStore, Protocol):
    def list_sessions(self, kind: str = BOOK) -> list[SessionRecord]: ...
    def draft_counts(self) -> dict[int, int]: ...
    def last_worked_book(self) -> int | None: ...
    def overview(self, session_id: int) -> list[DraftSummary]: ...
    def delete_session(self, session_id: int) -> None: ...
    def delete_generation(self, gen_id: int) -> None: ...
