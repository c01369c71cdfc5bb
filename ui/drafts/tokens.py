"""Prompt length against the model's context, checked before a draft is queued (API and Write tab).

This process never loads a model's weights, but a tokenizer is small and quick to load, and it counts as
the worker will (the same tokenizer, tokenswift.model.hf_files.load_tokenizer, called as LoadedModel.encode
calls it). One PromptTokens belongs to the app (ui/server.create_app, or ui/api/api.create_app alone) and keeps
the tokenizer of each model it was asked about. When none can be loaded (a hub id not in the cache, a directory without
a tokenizer) `measure` answers None, and the worker's own check stays the last word, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from storage.home import gguf_cache
from ui.display import views
from ui.drafts.store_ops import DraftsStore

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_S = 60.0  # a model whose tokenizer failed to load is tried again after this long (it may be downloaded)


@dataclass(frozen=True)
class Measured:
    model: str
    tokens: int  # the prompt's tokens, as the worker will count them
    context: int | None  # the model's context (None: unknown; use the worker's)


@dataclass(frozen=True)
class _Loaded:
    tokenizer: object
    context: int | None


class PromptTokens:
    def __init__(self, store: DraftsStore, *, retry_s: float = RETRY_S):
        self.store, self.retry_s = store, retry_s
        self._loaded: dict[str, _Loaded] = {}
        self._failed: dict[str, float] = {}  # model -> monotonic time its tokenizer failed to load
        # One load per model at a time; and a tokenizer shared by request threads is used by one at a time.
        self._lock = threading.Lock()

    def target(self) -> tuple[str, int | None] | None:
        """The model a new draft runs on, with the context a worker reported for it: the saved choice (a
        worker loads it before its next draft), else what a live worker holds. None: no model yet."""
        workers, desired = self.store.list_workers(), self.store.desired_model()
        live = views.live_worker(workers)
        model = desired.model if desired else (live.model if live else None)
        if not model:
            return None
        return model, next((w.max_context for w in workers if w.model == model and w.max_context), None)

    def measure(self, text: str) -> Measured | None:
        """The prompt's length in the target model's tokens; None if there is no model or no tokenizer."""
        target = self.target()
        if target is None:
            return None
        model, reported = target
        with self._lock:
            loaded = self._load(model)
            if loaded is None:
                return None
            tokens = len(loaded.tokenizer(text).input_ids)
        return Measured(model, tokens, reported or loaded.context)

    def use(self, model: str, work: Callable[[object, int | None], T]) -> T | None:
        """work(tokenizer, context) with `model`'s tokenizer, one caller at a time; None if it cannot be loaded."""
        with self._lock:
            loaded = self._load(model)
            return None if loaded is None else work(loaded.tokenizer, loaded.context)

    def _load(self, model: str) -> _Loaded | None:
        if model in self._loaded:
            return self._loaded[model]
        if time.monotonic() - self._failed.get(model, float("-inf")) < self.retry_s:
            return None
        try:
            loaded = _load(model)
        except Exception as error:  # noqa: BLE001 - any failure: leave the check to the worker
            log.warning("cannot load the tokenizer of %s (%s: %s); the worker checks prompt lengths",
                        model, type(error).__name__, error)
            self._failed[model] = time.monotonic()
            return None
        self._loaded[model] = loaded
        self._failed.pop(model, None)
        return loaded


def _load(model: str) -> _Loaded:
    from tokenswift.model.gguf_checkpoint import hf_directory, is_gguf
    from tokenswift.model.hf_files import context_limit, load_tokenizer, read_config

    path = Path(model).expanduser()
    if is_gguf(path):  # a tokenizer needs no weights: config and tokenizer only, or the worker's whole conversion
        path = hf_directory(path, gguf_cache(), weights=False)
    elif not path.is_dir():  # a hub id, from the local cache only
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(model, local_files_only=True))
    tokenizer = load_tokenizer(path)
    try:
        context = context_limit(read_config(path))
    except Exception:  # noqa: BLE001 - the tokens are still worth knowing; the context may come from a worker
        context = None
    return _Loaded(tokenizer, context)
