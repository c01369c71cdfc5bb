"""The store as a draft followed live sees it (live.py): the draft's record, its instruction and its progress.

A Protocol that the Store satisfies: tests/test_store_ops.py checks each signature against the Store's, and
that the room's modules call nothing else on it."""

from __future__ import annotations

from typing import Protocol

from storage.records import GenerationRecord, Snapshot


class LiveStore(Protocol):
    def get_generation(self, gen_id: int, *, with_text: bool = True) -> GenerationRecord: ...
    def instruction(self, gen_id: int) -> str | None: ...
    def progress_since(self, gen_id: int, after_seq: int = -1, after_tokens: int | None = None) -> Snapshot: ...
