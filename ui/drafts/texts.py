"""Draft texts for pollers (the API's GET, "Show whole text"): assembled once, extended by the chunks that are
new, and not read again at all while nothing was committed (storage/changes.py), so a poll costs O(new text)
in the store and, between the worker's flushes, no store read.

One DraftTexts belongs to the app (ui/server.create_app, or ui/api/api.create_app alone) and keeps the last few
drafts asked for. An entry is keyed by the draft's id and creation time (SQLite may reuse the id of a deleted
draft) and extended only from the chunk sequence it has reached (chunks are append-only).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from storage import Store
from storage.changes import Changes
from storage.records import GenerationRecord, MetricPoint

MAX_DRAFTS = 16


@dataclass(frozen=True)
class Draft:
    """A draft as last read: its row, its latest metric point and its generated text, chunk by chunk."""

    record: GenerationRecord
    metric: MetricPoint | None
    text: str
    ends: list[int]  # ends[i]: where chunk i ends in `text`
    version: int | None  # the store's data_version before this was read (None: not cacheable)

    def since(self, seq: int) -> str:
        """The text of chunks seq, seq+1, ..."""
        return self.text[self.ends[seq - 1]:] if 0 < seq <= len(self.ends) else ("" if seq else self.text)


class DraftTexts:
    def __init__(self, store: Store, max_drafts: int = MAX_DRAFTS):
        self.store, self.max_drafts = store, max_drafts
        self.changes = Changes(store)
        self._entries: OrderedDict[int, Draft] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, gen_id: int) -> Draft:
        """The draft now (NotFound if it is gone): from memory when nothing was committed since it was read,
        else extended by what is new."""
        version = self.changes.version()  # before the read: a commit during it makes the next call re-read
        with self._lock:
            entry = self._entries.get(gen_id)
        if entry is not None and version is not None and entry.version == version:
            return entry
        snap = self.store.progress_since(gen_id, after_seq=len(entry.ends) - 1 if entry else -1)
        record = snap.record
        if entry is not None and (entry.record.created_at != record.created_at or len(entry.ends) > record.chunk_count):
            entry, snap = None, self.store.progress_since(gen_id)  # another draft under a reused id
        text, ends = (entry.text, list(entry.ends)) if entry else ("", [])
        for chunk in snap.chunks:
            text += chunk.text
            ends.append(len(text))
        metric = snap.points[-1] if snap.points else (entry.metric if entry else None)
        draft = Draft(record, metric, text, ends, version)
        with self._lock:
            kept = self._entries.get(gen_id)
            if kept is None or kept.record.created_at != record.created_at or len(kept.ends) <= len(ends):
                self._entries[gen_id] = draft
            self._entries.move_to_end(gen_id)
            while len(self._entries) > self.max_drafts:
                self._entries.popitem(last=False)
        return draft

    def whole(self, gen_id: int) -> str:
        """Prompt + generated text."""
        draft = self.read(gen_id)
        return draft.record.prompt_text + draft.text
