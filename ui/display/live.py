"""What one browser tab has read of one generation, advanced by cheap incremental reads of the store.

Each timer tick is one read transaction (Store.progress_since) for the row and only the chunks and metric
points past the cursor, so a 100K-token draft costs the same per tick as a short one; the text shown live
is a bounded tail, and the word count is kept incrementally (a word split across two chunks is counted once).
A tick given the store's commit counter (storage/changes.py) reads nothing at all while nothing was committed,
as the API's status reads do (ui/drafts/texts.py): between the worker's flushes a tab's ticks cost no store read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from storage.changes import Changes
from storage.drafts import prompt_parts
from storage.records import GenerationRecord, MetricPoint
from ui.display.store_ops import LiveStore

TAIL_CHARS = 6_000
ACTIVE = ("queued", "running")
# The timers' polls (the Write and Compare ticks, the model banner's) go around Gradio's queue. At each status
# message of an event, Gradio's page client refreshes the loading status of every component any event names, cloning
# each one's value: a queued event sends four such messages (pending, estimation, process_starts, process_completed),
# an unqueued one two. A poll only reads the store: the queue's order and limits give it nothing. But the page fires a
# State's change listeners only from a queued event's messages: a poll sets no State that has listeners
# (write_parts' `ended` is a hidden box for that).
POLL = {"queue": False, "show_progress": "hidden"}
FINISHED = ("done", "cancelled", "failed")


@dataclass
class Watch:
    gen_id: int
    record: GenerationRecord
    tail: str = ""  # the last TAIL_CHARS of prompt (shown_prompt) + generated text
    last_seq: int = -1
    words: int = 0  # words generated (the prompt is not counted)
    mid_word: bool = False  # the generated text so far ends inside a word
    generated_chars: int = 0
    points: list[MetricPoint] = field(default_factory=list)
    version: int | None = None  # the store's commit counter before the last read (None: unknown)
    charts_due: bool = False  # metric points arrived that the charts do not show yet
    charts_at: float = 0.0  # time.monotonic() of the last chart drawing
    # A Pause click and the Write tick run in the server's threads and may refresh one tab's Watch at the same moment.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def charts_now(self, pointed: bool, every_s: float, now: float) -> bool:
        """Whether this tick redraws the charts: new points at most every `every_s` while the draft runs (a page
        that redraws four Plotly charts takes CPU from the worker on a small machine), and the last points as soon
        as it stops."""
        self.charts_due |= pointed
        if not self.charts_due or (self.active and now - self.charts_at < every_s):
            return False
        self.charts_due, self.charts_at = False, now
        return True

    @classmethod
    def open(cls, store: LiveStore, gen_id: int) -> Watch:
        record = store.get_generation(gen_id, with_text=False)
        watch = cls(gen_id, record, tail=shown_prompt(store, record)[-TAIL_CHARS:])
        watch.refresh(store)
        return watch

    def refresh(self, store: LiveStore, changes: Changes | None = None) -> tuple[bool, bool, bool]:
        """Read what is new: (status or counters changed, text changed, metric points changed). With `changes`
        (timer ticks), nothing is read while nothing was committed since the last read; without (after a
        click), the store is read whatever the counter says."""
        with self.lock:
            return self._refresh(store, changes)

    def _refresh(self, store: LiveStore, changes: Changes | None) -> tuple[bool, bool, bool]:
        version = changes.version() if changes is not None else None  # before the read: see ui/drafts/texts.py
        if version is not None and version == self.version:
            return False, False, False
        after = self.points[-1].tokens if self.points else -1
        snap = store.progress_since(self.gen_id, after_seq=self.last_seq, after_tokens=after)
        record = snap.record
        moved = (record.status, record.produced_tokens, record.control, record.error) != (
            self.record.status, self.record.produced_tokens, self.record.control, self.record.error
        ) or self.last_seq < 0
        self.record, self.version = record, version
        for chunk in snap.chunks:
            if chunk.seq > self.last_seq:
                self._add_text(chunk.text)
                self.last_seq = chunk.seq
        self.points.extend(p for p in snap.points if not self.points or p.tokens > self.points[-1].tokens)
        return moved, bool(snap.chunks), bool(snap.points)

    def _add_text(self, text: str) -> None:
        if not text:
            return
        words = len(text.split())
        if words and self.mid_word and not text[0].isspace():
            words -= 1  # the first word continues the previous chunk's last one
        self.words += words
        self.mid_word = not text[-1].isspace()
        self.generated_chars += len(text)
        self.tail = (self.tail + text)[-TAIL_CHARS:]

    @property
    def generated_tail(self) -> str:
        """The tail without the prompt."""
        return self.tail[-self.generated_chars:] if self.generated_chars else ""

    @property
    def latest(self) -> MetricPoint | None:
        return self.points[-1] if self.points else None

    @property
    def active(self) -> bool:
        return self.record.status in ACTIVE



def whole_text(store: LiveStore, gen_id: int) -> str:
    """Prompt + generated text as shown_prompt shows it, read fresh from the store (the text a writer's edit starts
    from: Store.save_edit takes an instruction draft's story alone)."""
    record = store.get_generation(gen_id)
    return shown_prompt(store, record) + (record.text or "")


def shown_prompt(store: LiveStore, record: GenerationRecord) -> str:
    """The prompt as the Write tab shows it: an opening whole; an instruction draft's story so far, without the
    instruction its text starts with (the model's answer is the story; the whole-text view shows it apart)."""
    instruction = store.instruction(record.id)
    text, story = prompt_parts(record.prompt_text, instruction)
    return text if instruction is None else story
