"""The store as the drafts service (drafts.py) and its helpers see it: queueing, continuing, editing and branching a
draft, its tokens and context, a chapter's plan, and the workers' model (tokens.py).

A Protocol that the Store satisfies: tests/test_store_ops.py checks each signature against the Store's, and
that the room's modules call nothing else on it."""

from __future__ import annotations

from typing import Protocol

from storage.branches import TokenAt
from storage.plans import Chapter, Plan
from storage.records import GenerationRecord, JobSettings, ModelSpec, Tokens, WorkerStatus
from ui.display.store_ops import LiveStore


class DraftsStore(LiveStore, Protocol):
    def enqueue_generation(
        self,
        prompt: str,
        settings: JobSettings,
        *,
        session_id: int | None = None,
        model: str | None = None,
        heads: str | None = None,
        memory: str = "",
        authors_note: str = "",
        world_info: str = "",
        prompt_ids: list[int] | None = None,
        chapter_id: int | None = None,
    ) -> GenerationRecord: ...
    def continue_generation(
        self, parent_id: int, settings: JobSettings, *, session_id: int | None = None
    ) -> GenerationRecord: ...
    def save_edit(self, gen_id: int, text: str) -> GenerationRecord: ...
    def branch(self, gen_id: int, position: int, token: int, prefix_text: str, token_text: str,
               max_new_tokens: int | None = None) -> GenerationRecord: ...
    def token_at(self, gen_id: int, position: int) -> TokenAt: ...
    def get_tokens(self, gen_id: int) -> Tokens: ...
    def set_context_text(self, gen_id: int, memory: str, authors_note: str,
                         world_info: str | None = None) -> GenerationRecord: ...
    def chapter(self, chapter_id: int) -> tuple[int, Chapter]: ...
    def plan(self, session_id: int) -> Plan: ...
    def desired_model(self) -> ModelSpec | None: ...
    def list_workers(self) -> list[WorkerStatus]: ...
