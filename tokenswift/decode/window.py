"""The context window an engine's cache holds (the plan: text/context_window.py): its chunked prefill, and the
window rebuilt at a context shift's boundary or at a World Info checkpoint whose entries changed, from the slots
filled ahead where a lookahead runs (lookahead.py). The engine (engine.py) owns the story and the drafter; a Window
owns where the story sits in the cache and when that moves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tokenswift.decode.lookahead import Lookahead, fills_ahead
from tokenswift.draft.build import DraftNeeds
from tokenswift.model.fastpath import FastPasses
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.prefill import prefill
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.windows import history_row
from tokenswift.text.context_window import ContextUse, PinnedText, WindowPlan

POSTS = 16  # updates of what the lookahead may fill per shift step: every 128 tokens by default (lookahead.CHUNK)


@dataclass
class Loaded:
    """A window just prefilled: `length` slots in the cache, the last one's logits and queries, and the states of
    the last rows a drafter reads (DraftNeeds.rows; the layer drafter: its window, the others: one)."""
    length: int
    logits: torch.Tensor
    queries: list[torch.Tensor]
    hidden: torch.Tensor
    ready: int = 0  # the leading slots filled ahead (lookahead.py)


@dataclass(frozen=True)
class Rebuild:
    """A rebuild due before the next token: at a World Info checkpoint (`at`), or at the plan's boundary (None)."""
    at: int | None


class Window:
    def __init__(self, lm: LoadedModel, cache: KVCache, buf: torch.Tensor, sampler: Sampler, needs: DraftNeeds,
                 fast: FastPasses | None, plan: WindowPlan, prompt_len: int, ban_eos: bool, history_length: int,
                 pinned_source: Callable[[], PinnedText] | None = None, lookahead: bool | None = False):
        """buf: the engine's token buffer (slot = position), which a load rewrites. pinned_source: the draft's current
        Memory and note, asked for at each shift (an edit applies there). lookahead: fill the next window ahead of
        its shift (EngineOptions.lookahead; lookahead.fills_ahead)."""
        self.lm, self.cache, self.buf, self.sampler, self.needs, self.fast = lm, cache, buf, sampler, needs, fast
        self.prompt_len, self.ban_eos, self.history_length = prompt_len, ban_eos, history_length
        self.pinned_source = pinned_source
        # Cache slots (= RoPE positions) index the window; the engine's ids are the whole story. A slot past the
        # window's Author's Note holds story index slot + offset (the noise key of design §3).
        self.plan, self.offset, self.next_boundary, self.shifts = plan, 0, 0, 0
        # World Info: the next checkpoint (world_info.py) and the entries in the window now.
        self.next_check, self.entries = 0, ()
        self.next_post = 0
        threads = lm.threads or torch.get_num_threads()
        ahead = fills_ahead(lm.model, threads, fast is not None, lookahead)
        self.lookahead = Lookahead(lm.model, cache, needs) if ahead else None

    def load(self, ids: Sequence[int], fresh: bool, at: int | None = None) -> Loaded:
        """Fill the cache with window(b) + story[b:t] for the next token t and its boundary b (built at `at`, a
        World Info checkpoint, when given; else where the plan says): all of it on a fresh run (the first token
        is sampled from the prefill), else all but the root."""
        t = len(ids)
        b = self.plan.boundary(t)
        at = self.plan.built(ids, t) if at is None else at
        self.next_boundary, self.next_check = self.plan.next_boundary(t), self.plan.next_checkpoint(t)
        self.entries = self.plan.active(ids, at)
        # Until an instruction draft's answer has ended (AfterAnswer); the captured passes sample in their graphs,
        # which know no such rule: there the end of text stays banned.
        after = self.plan.pinned.after_answer if self.plan.answered_from is None else None
        self.sampler.answer_end = after.section_break if after and self.ban_eos and self.fast is None else None
        built = self.plan.window(ids, b, at)
        tokens = built + list(ids[at:])
        self.buf[:len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        self.offset = t - len(tokens)
        if self.fast is not None:
            self.fast.set_key_offset(self.offset)
        length = len(tokens) if fresh else len(tokens) - 1
        # When the window was built, the run prefilled it (all of it at the prompt, where the first token was
        # sampled from it; else all but its last token, the root then): a resume prefills that much again and
        # replays the tokens since as the steps computed them (prefill.py).
        prefilled = len(built) if at == self.prompt_len else len(built) - 1
        chosen = 0
        if self.sampler.adaptive is not None:
            # Adaptive-P's history starts where the window was built: a resume recomputes it from the rows since.
            self.sampler.adaptive.restart(at)
            chosen = t - at
        ready, early = 0, None
        if self.lookahead is not None:  # the last row (its logits) and Adaptive-P's are computed here
            ready, early = self.lookahead.take(tokens, self.cache, length - max(chosen, 1), self.needs.states)
            self.next_post = 0
        return self._prefill(ids, length, prefilled, chosen, ready, early)

    def due(self, ids: Sequence[int]) -> Rebuild | None:
        """Before predicting the token after ids: a rebuild at a boundary (the same rebuild a resume does); at a World
        Info checkpoint whose entries differ from the window's, one there with them; after the section break that
        ends an instruction draft's answer, one as the story's own (context_window.AfterAnswer). None: none due."""
        t = len(ids)
        end = self.sampler.answer_end
        if end is not None and ids[-1] == end:
            self.plan = self.plan.after_answer(ids)
            return Rebuild(None)
        if t >= self.next_boundary:
            return Rebuild(None)
        if t < self.next_check:
            return None
        self.next_check = self.plan.next_checkpoint(t)
        return Rebuild(t) if self.plan.active(ids, t) != self.entries else None

    def ahead(self, ids: Sequence[int]) -> None:
        """Tell the lookahead how much of the next window the story settles now (POSTS times a shift step: working it
        out walks the window)."""
        if self.lookahead is None or len(ids) < self.next_post or self.plan.dynamic:
            return
        self.next_post = len(ids) + max(1, self.plan.step // POSTS)
        self.lookahead.want(self.plan.ahead(ids, self.next_boundary))

    def close(self) -> None:
        """Stop filling ahead: the run is over, or pauses while another engine takes its turn (bench's slices,
        bench/runs.alternate); a step after this asks again."""
        if self.lookahead is not None:
            self.lookahead.stop()
            self.next_post = 0

    def rebuild(self, ids: Sequence[int], due: Rebuild) -> Loaded:
        """The window `due` asks for, with the Memory and note as they are now where it moves to a new boundary."""
        base = self.plan.answered_from or self.plan
        if due.at is None and self.pinned_source is not None and (pinned := self.pinned_source()) != base.pinned:
            self.plan = base.with_pinned(pinned).after_answer(ids)
        self.shifts += 1
        return self.load(ids, fresh=False, at=due.at)

    def context_use(self, length: int) -> ContextUse:
        """What the model sees with `length` slots filled (and the root beyond them)."""
        pinned, frame = self.plan.pinned_size(self.entries), self.plan.frame_size()
        return ContextUse(pinned - frame, length + 1 - pinned, self.shifts, frame)

    @torch.inference_mode()
    def _prefill(self, ids: Sequence[int], upto: int, replay_from: int, chosen: int, ready: int = 0,
                 early: torch.Tensor | None = None) -> Loaded:
        """Slots [ready, upto) (those before are filled, `early` the drafter's states of their last ones), those from
        replay_from on as exact rows (prefill.py). chosen: the last rows whose next tokens Adaptive-P's history
        holds."""
        keep = self.needs.states
        out = prefill(self.lm.model, self.buf[ready:upto], self.cache, max(keep, chosen), last=True,
                      keep_layers=self.needs.feature_layers, replay_from=min(replay_from, upto) - ready, start=ready)
        if chosen:
            self._recall(ids, out.hidden[-chosen:], upto - chosen)
        rows = self.needs.rows(out) if early is None else torch.cat((early, self.needs.rows(out)))
        return Loaded(upto, out.logits, out.queries, rows[-keep:], ready)

    def _recall(self, ids: Sequence[int], hidden: torch.Tensor, first: int) -> None:
        """Adaptive-P's history from the states of slots first.. : each row's logits as a step takes them (one row
        through the LM head), sampled as the step sampled them, and the token the run chose there."""
        for i in range(hidden.shape[0]):
            slot = first + i
            position = slot + 1 + self.offset
            self.sampler.recall(self.lm.model.logits_of(hidden[i:i + 1]),
                                history_row(self.buf, slot + 1, self.history_length, []), position, ids[position])
