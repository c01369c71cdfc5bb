"""The store as the Plan tab sees it: a book's premise, characters and chapters, and what the Write tab uses (a
chapter's draft opens there).

A Protocol that the Store satisfies: tests/test_store_ops.py checks each signature against the Store's, and
that the room's modules call nothing else on it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage.models import BOOK
from storage.plans import Chapter, Character
from storage.records import SessionRecord
from ui.write.store_ops import WriteStore


class PlanStore(WriteStore, Protocol):
    def list_sessions(self, kind: str = BOOK) -> list[SessionRecord]: ...
    def last_worked_book(self) -> int | None: ...
    def set_premise(self, session_id: int, premise: str) -> None: ...
    def set_characters(self, session_id: int, characters: Sequence[Character]) -> None: ...
    def add_chapter(self, session_id: int, title: str, beats: Sequence[str] = (),
                    position: int | None = None) -> Chapter: ...
    def edit_chapter(self, chapter_id: int, title: str | None = None,
                     beats: Sequence[str] | None = None) -> Chapter: ...
    def move_chapter(self, chapter_id: int, position: int) -> Chapter: ...
    def delete_chapter(self, chapter_id: int) -> None: ...
