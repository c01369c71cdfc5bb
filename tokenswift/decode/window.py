"""The Engine's context window: the chunked prefill, and the window rebuilt at a context shift's boundary or at a
World Info checkpoint whose entries changed (the plan: text/context_window.py). Mixed into engine.Engine, which
holds the state these read (ids, plan, cache, buf, drafter, metrics)."""

from __future__ import annotations

import time

import torch

from tokenswift.model.prefill import prefill
from tokenswift.text.context_window import ContextUse


class EngineWindow:
    def _observe_window(self, hidden: torch.Tensor) -> None:
        """After a prefill: the states of the window's last rows, up to the root."""
        n = hidden.shape[0]
        self._observe(hidden, self.buf[self.length - n + 1:self.length + 1].tolist(), self.length - n)

    def _load_window(self, fresh: bool, at: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Fill the cache with window(b) + story[b:t] for the next token t and its boundary b (built at `at`, a
        World Info checkpoint, when given; else where the plan says): all of it on a fresh run (the first token
        is sampled from the prefill), else all but the root."""
        t = len(self.ids)
        b = self.plan.boundary(t)
        at = self.plan.built(self.ids, t) if at is None else at
        self.next_boundary, self.next_check = self.plan.next_boundary(t), self.plan.next_checkpoint(t)
        self.entries = self.plan.active(self.ids, at)
        # Until an instruction draft's answer has ended (AfterAnswer); the captured passes sample in their graphs,
        # which know no such rule: there the end of text stays banned.
        after = self.plan.pinned.after_answer if self.plan.answered_from is None else None
        self.sampler.answer_end = after.section_break if after and self.s.ban_eos and self.fast is None else None
        built = self.plan.window(self.ids, b, at)
        tokens = built + self.ids[at:]
        self.buf[:len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        self.offset = t - len(tokens)
        if self.fast is not None:
            self.fast.set_key_offset(self.offset)
        self.length = len(tokens) if fresh else len(tokens) - 1
        # When the window was built, the run prefilled it (all of it at the prompt, where the first token was
        # sampled from it; else all but its last token, the root then): a resume prefills that much again and
        # replays the tokens since as the steps computed them (prefill.py).
        prefilled = len(built) if at == self.prompt_len else len(built) - 1
        if self.sampler.adaptive is None:
            return self._prefill(self.length, prefilled)
        # Adaptive-P's history starts where the window was built: a resume recomputes it from the rows since.
        self.sampler.adaptive.restart(at)
        return self._prefill(self.length, prefilled, chosen=t - at)

    def _shift_if_due(self) -> None:
        """Before predicting the token at a boundary: rebuild the window (the same rebuild a resume does); at a
        World Info checkpoint whose entries differ from the window's, rebuild it there with them; after the section
        break that ends an instruction draft's answer, rebuild it as the story's own (context_window.AfterAnswer)."""
        t, at = len(self.ids), None
        end = self.sampler.answer_end
        answered = end is not None and self.ids[-1] == end
        if answered:
            self.plan = self.plan.after_answer(self.ids)
        elif t < self.next_boundary:
            if t < self.next_check:
                return
            self.next_check = self.plan.next_checkpoint(t)
            if self.plan.active(self.ids, t) == self.entries:
                return
            at = t
        self._sync()
        t0 = time.perf_counter()
        base = self.plan.answered_from or self.plan
        if at is None and self.pinned_source is not None and (pinned := self.pinned_source()) != base.pinned:
            self.plan = base.with_pinned(pinned).after_answer(self.ids)
        _, queries, hidden = self._load_window(fresh=False, at=at)
        if self.drafter is not None:
            self.drafter.start(self.cache, self.length, queries)  # the partial cache is reselected
            self._observe_window(hidden)  # the fused and layer drafters read the new window's states
        self._sync()
        self.shifts += 1
        self.metrics.add_shift(time.perf_counter() - t0)

    def context_use(self) -> ContextUse:
        pinned, frame = self.plan.pinned_size(self.entries), self.plan.frame_size()
        return ContextUse(pinned - frame, self.length + 1 - pinned, self.shifts, frame)

    @torch.inference_mode()
    def _prefill(self, upto: int, replay_from: int,
                 chosen: int = 0) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Slots [0, upto), those from replay_from on as exact rows (prefill.py). Returns the last token's logits and
        queries, and the states (Engine._states' rows) of the last rows a drafter reads (the layer drafter: its
        window; the others: one). chosen: the last rows whose next tokens Adaptive-P's history holds."""
        keep = self.needs.states
        out = prefill(self.lm.model, self.buf[:upto], self.cache, max(keep, chosen), last=True,
                      keep_layers=self.feature_layers, replay_from=min(replay_from, upto))
        if chosen:
            self._recall(out.hidden[-chosen:], upto - chosen)
        return out.logits, out.queries, self._states(out)[-keep:]

    def _recall(self, hidden: torch.Tensor, first: int) -> None:
        """Adaptive-P's history from the states of slots first.. : each row's logits as a step takes them (one row
        through the LM head), sampled as the step sampled them, and the token the run chose there."""
        for i in range(hidden.shape[0]):
            slot = first + i
            position = slot + 1 + self.offset
            self.sampler.recall(self.lm.model.logits_of(hidden[i:i + 1]), self._window(slot + 1, []), position,
                                self.ids[position])
