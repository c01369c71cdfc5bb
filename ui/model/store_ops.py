"""The store as the Model tab sees it: the model the workers are asked to load, and what they report.

A Protocol that the Store satisfies: tests/test_store_ops.py checks each signature against the Store's, and
that the room's modules call nothing else on it."""

from __future__ import annotations

from typing import Protocol

from storage.records import ModelSpec, WorkerStatus


class ModelStore(Protocol):
    def desired_model(self) -> ModelSpec | None: ...
    def set_desired_model(self, spec: ModelSpec) -> None: ...
    def list_workers(self) -> list[WorkerStatus]: ...
    def queue_length(self) -> int: ...
