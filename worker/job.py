"""Runs one claimed job: the engine's iterations, persisted every <= flush_s or <= flush_tokens.

A resumed job (after pause, crash or shutdown) is rebuilt from the ids in the store: the engine gets
prompt + generated ids and, being deterministic in (seed, position), continues the very same stream.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from storage import Store, StoreError
from storage.drafts import prompt_parts
from storage.records import Job, MetricPoint, ModelSpec, Owner, Progress
from worker.config import WorkerConfig

log = logging.getLogger(__name__)

# What a control request ends the run as.
FINISH = {"pause": "paused", "cancel": "cancelled"}


@dataclass
class Pending:
    """Tokens decoded since the last flush."""

    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    alternatives: list | None = field(default_factory=list)  # one per id; None once a token came without

    def add(self, ids: list[int], text: str, alternatives: list | None = None) -> None:
        if self.alternatives is not None and (alternatives is not None or not ids):
            self.alternatives.extend(alternatives or [])
        else:
            self.alternatives = None
        self.ids.extend(ids)
        self.text.append(text)

    def take(self) -> tuple[list[int], str, list | None]:
        ids, text, alternatives = self.ids, "".join(self.text), self.alternatives
        self.ids, self.text, self.alternatives = [], [], []
        return ids, text, alternatives


@dataclass(frozen=True)
class FlushPolicy:
    every_s: float = 1.0
    every_tokens: int = 256


DISK_FAULTS = ("disk is full", "readonly", "read-only", "no space left")


def disk_fault(error: StoreError) -> bool:
    """A store that cannot take writes (a transient fault the job waits out paused), not one that is gone."""
    return any(words in str(error).lower() for words in DISK_FAULTS)


def kept_cache(lm, kind: str, job_id: int):
    """lm with the KV cache the draft's runs keep (Store.record_start), so that a resume writes what its first run
    would have, whatever this worker defaults to; the worker's own where its model cannot keep that one."""
    from tokenswift.model.loading import compact_cache

    if kind == lm.kv_cache:
        return lm
    try:
        return compact_cache(lm, kind)
    except ValueError as error:
        log.warning("job %s: its runs kept a %s KV cache, which this worker's model cannot (%s); it goes on with %s, "
                    "so its text from here may differ", job_id, kind, error, lm.kv_cache)
        return lm


def kept_dtype(job: Job, device: str, own: str) -> str:
    """The precision the job's text was written in where this worker's device is of the kind that wrote it; else the
    worker's own `own` (another kind of device computes other text whatever the precision, and a precision chosen
    for one, float32 on a CPU, may not suit the other)."""
    if job.dtype is None or job.dtype == own:
        return own
    if job.device != device.split(":")[0]:
        log.warning("job %s: its runs were on %s in %s; on %s it goes on in %s, so its text from here may differ",
                    job.id, job.device, job.dtype, device, own)
        return own
    return job.dtype


class JobRun:
    def __init__(self, store: Store, owner: Owner, job: Job, lm, spec: ModelSpec, policy: FlushPolicy,
                 stopping: Callable[[], bool], wait: Callable[[float], object] = time.sleep,
                 retry_s: float = WorkerConfig.store_retry_s,
                 options=None):
        """retry_s: while the store refuses even the pause, try again this often. options:
        tokenswift.decode.options.EngineOptions (the holder's for this model; None = the defaults)."""
        self.store, self.owner, self.job, self.lm, self.spec = store, owner, job, lm, spec
        self.options = options
        self.policy, self.stopping, self.wait, self.retry_s = policy, stopping, wait, retry_s
        self.pending = Pending()
        self.gen = None
        self.started = time.monotonic()
        self.saved_base = 0.0  # time saved by earlier runs of this job
        self.written = 0  # ids of the prompt its family wrote, which the generator counts as its own (_engine)
        self.fast_failure: str | None = None  # why the fast path failed, when it did (the worker falls back)
        self.device_lost: str | None = None  # a sticky device error: only a new worker process can go on

    def run(self) -> str:
        """done | paused | cancelled | released (worker stopping, or the fast path failed) | lost (job taken
        away) | failed.

        A StoreError goes up to the worker loop: the store is unreachable (a database restart, a lost
        connection), not the job at fault. The job stays ours in the store; the loop tries again, requeues it
        as abandoned by this very process, and resumes it from what was saved."""
        try:
            return self._run()
        except StoreError as error:
            if not disk_fault(error):
                raise  # the store is unreachable (a restart, a lost connection): the worker loop retries and resumes
            return self._pause_for_fault(error)  # full disk, read-only file: the job must stay resumable
        except Exception as error:  # noqa: BLE001 - any other failure ends this job, never the worker
            return self._after_error(error)
        finally:
            # The generator's Memory-and-note source refers back to this run: without this the engine's KV cache
            # (gigabytes on a GPU) would live until a garbage collection, while the next job is already running.
            self.gen = None

    def _after_error(self, error: Exception) -> str:
        """A fast path that failed, or a device left unusable (a sticky CUDA error), is no fault of the job: it goes
        back to the queue, for the next path down or a new worker process. Anything else fails the job."""
        from tokenswift.model.fastpath import FastPathError

        if sticky_device_error(error):
            self.device_lost = str(error)
            return self._hand_back(error, "for a new worker process (this one's device is unusable)")
        if isinstance(error, FastPathError):
            self.fast_failure = str(error)
            return self._hand_back(error, "to run on the next path down")
        return self._fail(error)

    def _hand_back(self, error: Exception, where: str) -> str:
        """Requeue the job from its last saved token. The tokens not saved yet are dropped: the next run decodes the
        very same ones from the saved ones (same seed, same positions)."""
        log.error("job %s: %s; handing it back %s", self.job.id, error, where)
        self.pending.take()
        return "released" if self.store.release(self.job.id, self.owner) else "lost"

    def _pause_for_fault(self, error: StoreError) -> str:
        """Stop as paused with the reason shown. What was not saved yet is dropped: the resumed run decodes
        the very same tokens again from the saved ones (same seed, same positions), so nothing is lost. If
        the store refuses even that small write, keep trying until it takes it or the worker stops (then
        the job stays running under a dead owner, and the next worker requeues it)."""
        cause = getattr(error.__cause__, "orig", None) or error  # the driver's words: "database or disk is full"
        reason = (f"the store could not be written ({cause}). Free disk space (or "
                  "make the database writable), then resume: everything saved is intact")
        log.error("job %s: %s", self.job.id, reason)
        while not self.stopping():
            try:
                return "paused" if self.store.pause_for_fault(self.job.id, self.owner, reason) else "lost"
            except StoreError as again:
                log.error("job %s: could not record the pause either (%s); retrying", self.job.id, again)
                self.wait(self.retry_s)
        return "released"

    def _run(self) -> str:
        from tokenswift.settings import DraftSettings
        from tokenswift.text.prompting import prompt_ids as make_prompt
        from worker.edits import kept_ids

        asked = DraftSettings.from_json(self.job.settings_json)
        settings = asked.settings
        prompt_ids, resume_from = self.job.prompt_ids, self.job.resume_from
        if prompt_ids is None:  # the API has no tokenizer: the first run tokenizes and records the ids
            base = self.store.edit_base(self.job.id) if self.job.parent_id is not None else None
            kept = kept_ids(self.lm, base, self.job.prompt_text) if base is not None else None
            if kept is not None:  # an edit: its family's own ids for the text it left as it was
                prompt_ids, resume_from = kept
            else:  # An instruction draft's story so far (a writer's edit) goes on inside the assistant's turn.
                text, story = prompt_parts(self.job.prompt_text, self.job.instruction)
                prompt_ids = make_prompt(self.lm, text, settings.prompt_format, story)
        kv_cache = self.store.record_start(self.job.id, self.owner, prompt_ids, self.spec.model, self.spec.heads,
                                           resume_from, self.lm.kv_cache, self.lm.precision, self.lm.device.type)
        if kv_cache is None:
            return "lost"
        self.lm = kept_cache(self.lm, kv_cache, self.job.id)
        done_ids = self.store.get_tokens(self.job.id).generated_ids
        if len(done_ids) >= settings.max_new_tokens:  # finished before a crash could mark it
            return self._flush("done", "length")
        previous = self.store.latest_metric(self.job.id)
        self.saved_base = (previous.time_saved_s or 0.0) if previous else 0.0
        self.started = time.monotonic()
        self.gen, detok = self._engine(settings, asked.speed, prompt_ids, done_ids, resume_from)
        return self._loop(detok)

    def _engine(self, settings, spec, prompt_ids: list[int], done_ids: list[int], resume_from: int | None):
        from tokenswift.decode.generate import Generator
        from tokenswift.decode.options import EngineOptions
        from tokenswift.draft.choice import drafter_for
        from tokenswift.text.detok import IncrementalDetokenizer

        # Memory, Author's Note and World Info as the writer left them: an edit made since the last run applies
        # from here, and one made while this run goes on applies from its next context shift.
        # An instruction draft keeps its chat turns in every window, the Memory inside the system turn.
        instruction = self.job.instruction
        pinned = draft_pinned(self.lm, self.job.memory, self.job.authors_note, self.job.world_info, instruction)
        drafter = drafter_for(self.lm, spec, fallback=True)
        if spec.drafter == "layer" and drafter == "fused":
            # Drafts change speed only: the heads' drafts write the very same text (the model notice says why).
            log.warning("job %s: no usable draft layer (%s); drafting with the heads", self.job.id,
                        self.lm.draft_error or "none loaded")
        # The app records each token's alternatives (the Write tab's alternatives and branches; speed: README).
        options = dataclasses.replace(self.options or EngineOptions(), alternatives=True,
                                      speculation=spec.replace(drafter=drafter))
        if settings.adaptive_target >= 0:  # its history is kept on the host: the eager passes (the same text)
            options = dataclasses.replace(options, fast=None, choice=None)
        # A continuation, a branch or an edit starts with ids its family wrote: the run that wrote them goes on
        # (its windows, its cache values), so the text is what that run would have written next. Past an end of
        # text it could not go on: such ids are prompt.
        start = len(prompt_ids) if resume_from is None else resume_from
        if prompt_ids[start:] and prompt_ids[-1] in self.lm.eos_ids:
            start = len(prompt_ids)
        self.written = len(prompt_ids) - start
        settings = settings.replace(max_new_tokens=settings.max_new_tokens + self.written)
        gen = Generator(self.lm, settings, prompt_ids[:start], generated_ids=prompt_ids[start:] + done_ids,
                        options=options, pinned=pinned,
                        pinned_source=lambda: draft_pinned(self.lm, *self.store.context_text(self.job.id), instruction))
        detok = IncrementalDetokenizer(self.lm.tokenizer, list(prompt_ids))
        if done_ids:
            # Replay what is already stored (its text too) so the next piece joins it exactly: a
            # character split across tokens at the crash point is still held back and comes out whole.
            detok.push(list(done_ids))
        return gen, detok

    def _loop(self, detok) -> str:
        last_flush = time.monotonic()
        for event in self.gen.steps():
            self.pending.add(event.tokens, detok.push(event.tokens), event.alternatives)
            request = None if event.done else self.store.control_for(self.job.id, self.owner)
            if request == "lost":
                return "lost"
            if request is None and self.stopping():
                request = "release"
            due = len(self.pending.ids) >= self.policy.every_tokens
            due = due or time.monotonic() - last_flush >= self.policy.every_s
            if event.done or request or due:
                finish = "done" if event.done else FINISH.get(request)
                if finish in ("done", "cancelled"):  # final: an incomplete last character goes out as is
                    self.pending.add([], detok.flush())
                outcome = self._flush(finish, event.finish_reason)
                if outcome != "saved" or finish:
                    return outcome
                if request == "release":
                    return "released" if self.store.release(self.job.id, self.owner) else "lost"
                last_flush = time.monotonic()
        self.pending.add([], detok.flush())  # the engine stopped without a final event
        return self._flush("done", "length")

    def _flush(self, finish: str | None, reason: str | None = None) -> str:
        ids, text, alternatives = self.pending.take()
        elapsed = self.job.elapsed_s + time.monotonic() - self.started
        progress = Progress(ids, text, elapsed, self._metric(elapsed), alternatives)
        kept = self.store.append_progress(self.job.id, self.owner, progress, finish=finish,
                                          finish_reason=reason if finish == "done" else None)
        if not kept:
            return "lost"
        return finish or "saved"

    def _metric(self, elapsed: float) -> MetricPoint | None:
        if self.gen is None:
            return None
        try:
            m = self.gen.metrics().to_dict()
        except Exception:  # noqa: BLE001 - a broken engine must not cost the tokens being saved
            return None
        tokens = len(self.gen.produced) - self.written
        use = self.gen.context_use()
        return MetricPoint(
            tokens=tokens, elapsed_s=elapsed, steps=m.get("steps"), alpha=m.get("alpha"), beta=m.get("beta"),
            tokens_per_step=m.get("tokens_per_step"), ngram_hits=m.get("ngram_accepted"),
            tokens_per_s=m.get("tokens_per_s"), ar_latency_s=m.get("ar_latency_s"),
            time_saved_s=self.saved_base + (m.get("time_saved_s") or 0.0),
            plain_share=m.get("plain_share"),
            context_pinned=use.memory if use else None, context_recent=use.recent if use else None,
            shifts=m.get("shifts"), shift_s=m.get("shift_s"),
        )

    def _fail(self, error: Exception) -> str:
        message = describe(error)
        log.error("job %s failed: %s", self.job.id, message, exc_info=error)
        try:
            if self.pending.ids:  # what was decoded before the failure is valid output: keep it
                self._flush(None)
            return "failed" if self.store.mark_failed(self.job.id, self.owner, message) else "lost"
        except Exception as second:  # noqa: BLE001 - e.g. a full disk; the job is requeued (lease)
            log.error("could not record the failure of job %s: %s", self.job.id, describe(second))
            return "failed"


def draft_pinned(lm, memory: str, note: str, world_info: str, instruction: str | None):
    """The window's pinned ids for a draft's stored Memory, Author's Note and World Info JSON (checked when stored)."""
    from tokenswift.text.context_window import pinned_ids
    from tokenswift.text.world_info import WorldInfo

    return pinned_ids(lm, memory, note, instruction, WorldInfo.from_json(world_info))


def sticky_device_error(error: BaseException | None) -> bool:
    """A CUDA error that leaves the process's device context unusable (an illegal address, a device-side assert),
    here or behind the error that wraps it: only a new process can use the device again."""
    while error is not None:
        if type(error).__name__ == "AcceleratorError" or sticky_text(str(error)):
            return True
        error = error.__cause__
    return False


def sticky_text(text: str) -> bool:
    return "CUDA error" in text or "device-side assert" in text


def describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    if "out of memory" in str(error).lower():
        text += " (try a shorter target, fewer draft candidates (tree, k), or a smaller dtype)"
    return text
