"""The decoding state and one iteration of each mode: plain autoregressive and TokenSwift (design §1).

State: `length` tokens committed to the full KV cache and one sampled-but-uncached root token at position
`length`. Everything is rebuilt from the token ids alone (prefill, partial cache, n-gram table), so a run
resumed from stored ids continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenswift.decode.adaptive import CandidatePolicy, ladder
from tokenswift.decode.clock import StepClock
from tokenswift.decode.metrics import RunMetrics
from tokenswift.decode.ngram import NgramTable
from tokenswift.decode.options import EngineOptions
from tokenswift.decode.window import Loaded, Window
from tokenswift.draft.build import build_drafter, draft_needs
from tokenswift.draft.choice import drafter_for
from tokenswift.draft.drafting import Drafter
from tokenswift.model.fastpath import FastPasses, padded_capacity
from tokenswift.model.forward import shared_head_rows
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.masks import causal_mask, with_prefix
from tokenswift.model.native import sampler_rows
from tokenswift.sampling.alternatives import Alternatives, from_rows
from tokenswift.sampling.dry_xtc import breaker_ids
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import build_trie, verify_inputs, walk
from tokenswift.sampling.windows import history_row
from tokenswift.settings import CAPACITY_SPARE, NGRAM_LEN, Settings, max_nodes
from tokenswift.text.context_window import ContextUse, PinnedText, WindowPlan, leading_bos, window_plan


@dataclass
class StepResult:
    tokens: list[int]  # emitted this iteration; the last one is the new root


class Engine:
    def __init__(self, lm: LoadedModel, settings: Settings, ids: list[int], prompt_len: int,
                 options: EngineOptions | None = None, plan: WindowPlan | None = None,
                 pinned_source: Callable[[], PinnedText] | None = None, bans: dict[int, tuple[int, ...]] | None = None):
        """ids: prompt + tokens generated so far (at least the prompt). options: TokenSwift's speculation or plain
        decoding, the fast path, the adaptive batch (options.py); none of them changes the text.
        plan: the context windows (context_window.py); None: the model's context, no Memory or note.
        pinned_source: the draft's current Memory and note, asked for at each shift (an edit applies there).
        bans: {story index: token ids} the sampler forbids there (banned.py)."""
        options = options or EngineOptions()
        self.lm, self.s, self.spec, self.prompt_len = lm, settings, options.speculation, prompt_len
        spec, self.chosen = self.spec, drafter_for(lm, self.spec)  # the drafter that drafts here ("auto" resolved)
        if plan is None:
            prompt = list(ids[:prompt_len])
            plan = window_plan(settings, prompt, leading_bos(lm, prompt), PinnedText(), lm.max_context)
        plan = plan.answered_from or plan
        self.ts = spec.mode == "tokenswift"
        self.depth = len(spec.tree)  # gamma + 1: alpha's denominator, as the paper's Eq. 4
        # The most tokens one iteration can commit: the root plus the deepest tree or n-gram path.
        self.max_commit = 1 + max(self.depth, NGRAM_LEN if spec.ngram_topk else 0)
        self.verify_slots = max_nodes(spec.tree, spec.ngram_topk) if self.ts else 1
        longest = min(plan.size, len(plan.window(ids, prompt_len)) + plan.reserve + settings.max_new_tokens)
        capacity = longest + self.verify_slots + CAPACITY_SPARE
        lm.check_positions(capacity)
        fast = options.fast
        if fast is not None:
            capacity = padded_capacity(capacity)  # compiled kernels specialise on it: keep to a few sizes
        cfg = lm.config
        self.cache = KVCache(cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim, lm.device, lm.cache_dtype,
                             slot_major=fast is not None)
        self.ids = list(ids)
        self.buf = torch.zeros(capacity, dtype=torch.int64, device=lm.device)
        # Rows for _to_device: the tokens an iteration emits, the slots its commit moves.
        self._staged = torch.empty(2, self.max_commit, dtype=torch.int64, pin_memory=lm.device.type == "cuda")
        breakers = breaker_ids(lm.token_texts, settings.dry_breakers) if settings.dry_multiplier else None
        self.sampler = Sampler(settings, cfg.vocab_size, lm.device, lm.eos_ids, breakers, bans,
                               sampler_rows(lm.device, cfg.vocab_size))
        self.metrics = RunMetrics(spec.mode, depth=self.depth, path=options.path(cfg).describe())
        self.drafter: Drafter | None = None
        self.ngrams: NgramTable | None = None
        self.length = 0
        self.clock = StepClock()
        # A fused-feature draft layer (draft_layer.py) reads these layers' outputs beside the last one's.
        self.needs = draft_needs(lm, spec.mode, self.chosen)
        self.fast = None
        if fast is not None and self.needs.feature_layers:
            raise ValueError(f"drafter: this draft layer reads layers {list(self.needs.feature_layers)} besides the "
                             "last, which only the eager passes return: run it off the fast path, or use the heads")
        if fast is not None:
            self.fast = FastPasses(lm, self.cache, fast, self.sampler, self.buf, queries=self.needs.queries,
                                   alternatives=options.alternatives)
        # Past an instruction draft's answer, the story's own plan (context_window.AfterAnswer).
        self.window = Window(lm, self.cache, self.buf, self.sampler, self.needs, self.fast, plan.after_answer(ids),
                             prompt_len, settings.ban_eos, settings.history_length, pinned_source, options.lookahead)
        # Graphs need fixed shapes; a GPU pads anyway (one kernel configuration per batch size).
        self.pad_verify = self.fast is not None or lm.device.type == "cuda"
        self.shared_head_rows = shared_head_rows(lm.model, lm.dtype)
        self.adaptive, self.record = options.adaptive, options.alternatives
        self.policy: CandidatePolicy | None = None
        self._tops: list[torch.Tensor] = []  # alternatives of the tokens sampled since take_alternatives

    def start(self) -> list[int]:
        """Prefill; the tokens it emits: the first sampled token when fresh, none on a resume (its last is the root)."""
        t0 = time.perf_counter()
        fresh = len(self.ids) == self.prompt_len
        loaded = self.window.load(self.ids, fresh)
        self.length = loaded.length
        emitted: list[int] = []
        if fresh:
            upto = self.length
            token = self._sample(loaded.logits, self._history(upto, []), upto + self.window.offset)
            self._append([token])
            emitted = [token]
        if self.ts:
            self.drafter = build_drafter(self.lm, self.spec, self.chosen, self.sampler, self.buf, self.prompt_len,
                                         self.fast)
            if self.adaptive:
                self.policy = CandidatePolicy(ladder(self.drafter.widths, self.spec.ngram_topk))
            self._restart_drafter(loaded)
            self.ngrams = NgramTable(NGRAM_LEN)
            self._advance_ngrams()
        self._sync()
        self.metrics.prefill_s = time.perf_counter() - t0
        self.clock.ended()
        return emitted

    def _observe(self, hidden: torch.Tensor | None, following: list[int], first: int) -> None:
        """The states of the tokens just committed at slots first.. (DraftNeeds.rows), and the token after each."""
        if hidden is not None and self.drafter.uses_hidden:
            self.drafter.observe(hidden, following, first)

    def _restart_drafter(self, loaded: Loaded) -> None:
        """A window just prefilled: the partial cache chosen afresh, its last rows' states observed (fused, layer)."""
        self.drafter.start(self.cache, self.length, loaded.queries)
        n = loaded.hidden.shape[0]
        self._observe(loaded.hidden, self.buf[self.length - n + 1:self.length + 1].tolist(), self.length - n)

    def _shift_if_due(self) -> None:
        """Rebuild the window where one is due before the next token (Window.due), and restart the drafter on it."""
        due = self.window.due(self.ids)
        if due is None:
            self.window.ahead(self.ids)
            return
        self._sync()
        t0 = time.perf_counter()
        loaded = self.window.rebuild(self.ids, due)
        self.length = loaded.length
        if self.drafter is not None:
            self._restart_drafter(loaded)
        self._sync()
        self.metrics.add_shift(time.perf_counter() - t0, loaded.length, loaded.ready)

    def context_use(self) -> ContextUse:
        return self.window.context_use(self.length)

    def close(self) -> None:
        """The run is over, or pauses for another engine's turn: stop filling its next window ahead (till a step)."""
        self.window.close()

    root = property(lambda self: self.ids[-1])

    def _append(self, tokens: list[int]) -> None:
        n = len(self.ids) - self.window.offset
        self.buf[n:n + len(tokens)] = self._to_device(tokens, 0)
        self.ids.extend(tokens)

    def _to_device(self, values: list[int], row: int) -> torch.Tensor:
        """Host ints on the device without a stream sync (a pageable copy waits for all queued work): through row
        `row` of a pinned buffer, rewritten once per iteration, whose closing host read waits for the copy."""
        staged = self._staged[row, :len(values)]
        staged.copy_(torch.tensor(values, dtype=torch.int64))
        return staged.to(self.lm.device, non_blocking=True, copy=True)

    def _history(self, end: int, path: list[int]) -> torch.Tensor | None:
        """The sampling history of ids[:end] + path (windows.history_row)."""
        return history_row(self.buf, end, self.s.history_length, path)

    def _sync(self) -> None:
        """Wait for the device before reading the clock (eager CUDA). On the fast path every phase ends in the host
        read it needs, which waits for the work before it (a synchronize more would stall the launches behind it)."""
        if self.lm.device.type == "cuda" and self.fast is None:
            torch.cuda.synchronize(self.lm.device)

    def _built(self) -> float:
        return self.fast.build_s if self.fast is not None else 0.0

    def _less_builds(self, seconds: float, before: float) -> float:
        """`seconds` less the pass building (capture, compilation) done since _built() read `before`: that goes to
        metrics.capture_s, a one-off cost that neither time saved nor the adaptive policy may count."""
        built = self._built() - before
        self.metrics.capture_s += built
        return seconds - built

    def _advance_ngrams(self) -> None:
        self.ngrams.advance(self.ids, max(self.prompt_len, len(self.ids) - self.spec.lag(self.s)))

    # -- plain autoregressive decoding ---------------------------------------------------------------

    @torch.inference_mode()
    def ar_step(self) -> StepResult:
        self._shift_if_due()
        b0, t0 = self._built(), time.perf_counter()
        token, _, _ = self._ar_forward_and_sample()
        self._sync()
        dt = self._less_builds(time.perf_counter() - t0, b0)
        self.metrics.add_step(1, 0, 0, False, 0.0, dt, 0.0)
        self.metrics.ar_latency_s = dt
        return StepResult([token])

    def _ar_forward_and_sample(self, drafts: bool = False) -> tuple[int, torch.Tensor | None, list[int] | None]:
        """drafts: on the fast path with drafts in its passes, the fused drafter gets its next proposals too."""
        n = self.length
        token, hidden, drafted = self._ar_token(n, drafts)
        self.length = n + 1
        self._append([token])
        return token, hidden, drafted

    def _ar_token(self, n: int, drafts: bool = False) -> tuple[int, torch.Tensor | None, list[int] | None]:
        """Run the token in slot n (writing its K/V; it attends to slots [0, n]), sample position n + 1. Also returns
        the token's rows for the drafter, and with `drafts` the pass's drafts below the token (else None)."""
        if self.fast is not None:
            # forward and sampling in one graph: one host sync per token
            token, hidden, drafted = self.fast.ar_token(n, drafts)
            if self.record:
                self._tops.append(self.fast.alternatives([0]))
            return token, hidden, drafted
        pos = torch.tensor([n], device=self.lm.device)
        window = self.lm.config.sliding_window
        # A sliding-window model must mask old keys here too, or AR and verification would differ.
        mask = causal_mask(n, 1, pos, window, self.lm.device) if window is not None else None
        out = self.lm.model(self.buf[n:n + 1], pos, self.cache, n, mask, keep_layers=self.needs.feature_layers)
        token = self._sample(out.logits, self._history(n + 1, []), n + 1 + self.window.offset)
        return token, self.needs.rows(out), None

    # -- TokenSwift ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def ts_step(self) -> StepResult:
        warm = self.clock.warm()  # a cold step's time is not the policy's to learn from (clock.StepClock)
        self._shift_if_due()
        self._maybe_probe_ar(warm)
        shape = None  # the configured batch
        if self.policy is not None:
            # A plain step cannot give the partial cache the query a due selection needs: verify then.
            shape = self.policy.choose(plain_ok=not self.drafter.wants_queries(1))
            if shape is None:
                return self._plain_step(warm)
        L, root = self.length, self.root
        b0, t0 = self._built(), time.perf_counter()
        # 1. Draft: each depth's candidates, as deep as the shape (the drafter: drafting.py, fused_drafter.py).
        depth = len(shape.widths) if shape is not None else len(self.drafter.widths)
        levels = self.drafter.propose(root, L, self._history(L + 1, []), depth, L + 1 + self.window.offset)
        self._sync()
        t1 = time.perf_counter()
        draft_s = self._less_builds(t1 - t0, b0)
        # 2. Candidates: the tree plus the k most frequent 4-gram continuations of the drafter's n-gram key.
        k, slots = self.spec.ngram_topk, self.verify_slots
        if shape is not None:  # the adaptive policy's share of the proposals
            levels, k, slots = shape.cut(levels), shape.k, shape.slots
        prefix = self.drafter.ngram_prefix(root, levels)
        key = prefix[-1] if prefix else root
        paths = [(*prefix, *c) for c in self.ngrams.top_k(key, k)] if k else []
        # No candidate may predict past the next boundary (or World Info checkpoint): the token there may need
        # the next window.
        room = min(self.window.next_boundary, self.window.next_check) - 1 - len(self.ids)
        levels, paths = levels[:room], [p[:room] for p in paths]
        trie = build_trie(root, levels, paths)
        pad = slots if self.pad_verify else len(trie.tokens)
        capture = self.drafter.wants_queries(self.max_commit)
        b2, t2 = self._built(), time.perf_counter()
        # 3. Verify: the target over the full cache with every candidate at once, under the tree mask.
        rows, all_queries, targets, hidden, drafted = self._verify(trie, L, pad, capture)
        self._sync()
        t3 = time.perf_counter()
        verify_s = self._less_builds(t3 - t2, b2)
        # 4. Accept: walk the trie with the target's own position-keyed samples.
        if targets is not None:  # the fast path sampled every node inside the verify graph
            accepted, emitted = walk(trie, targets)
            if self.record:  # emitted[i] is the target's token after accepted[i]
                self._tops.append(self.fast.alternatives(accepted))
        else:
            accepted, emitted = walk(trie, lambda node: self._target_token(rows(node), trie, node, L))
        end = self.sampler.answer_end
        if end is not None and end in emitted:  # answer over: the rest reads the window asking for more (AfterAnswer)
            cut = emitted.index(end) + 1
            accepted, emitted = accepted[:cut], emitted[:cut]
        # 5. Commit: the accepted path's K/V behind the prefix (nodes 0..j stay: slots L..L+j), partial cache, n-grams.
        if (moved := next((i for i, node in enumerate(accepted) if node != i), len(accepted))) < len(accepted):
            self.cache.commit(self._to_device([L + i for i in accepted[moved:]], 1), L + moved)
        self.length = L + len(accepted)
        queries = [q[accepted[-1]] for q in all_queries] if capture else None
        self.drafter.commit(self.cache, L, self.length, queries)
        self._observe(hidden[accepted] if hidden is not None else None, emitted, L)
        if drafted is not None:
            self.drafter.given(self.fast.drafts.levels(drafted, accepted[-1]))
        self._append(emitted)
        self._advance_ngrams()
        self._sync()
        t4 = time.perf_counter()
        overhead_s = (t2 - t1) + (t4 - t3)
        self.metrics.add_step(len(emitted), len(emitted) - 1, sum(trie.from_ngram[i] for i in accepted),
                              any(trie.from_ngram[i] and not trie.from_tree[i] for i in accepted), draft_s, verify_s,
                              overhead_s)
        self.metrics.verify_batch = slots
        self.metrics.verify_batches[str(slots)] = self.metrics.verify_batches.get(str(slots), 0) + 1
        if self.policy is not None:  # the shape's own time, and apart the switch from plain steps (adaptive.py)
            seconds = draft_s + verify_s + overhead_s - self.drafter.switch_s if warm else None
            self.policy.observe(levels, paths, emitted[:-1], seconds, self.drafter.switch_s)
        self.clock.ended()
        return StepResult(emitted)

    def _plain_step(self, warm: bool) -> StepResult:
        """One AR step inside a TokenSwift run (the adaptive policy's plain gear): the root's K/V and the next sample,
        then the bookkeeping of an accepted root alone. warm: its time counts as the plain step's (clock.StepClock)."""
        b0, t0, L = self._built(), time.perf_counter(), self.length
        # Only a pass that makes drafts asks the policy (else each of ~100K plain steps would, for nothing).
        drafts = self.fast is not None and self.fast.drafts is not None and not self.policy.plain_next()
        token, hidden, drafted = self._ar_forward_and_sample(drafts=drafts)
        self.drafter.commit(self.cache, L, self.length, None)
        self._observe(hidden, [token], L)
        if drafted is not None:
            self.drafter.given(self.fast.drafts.levels(drafted, 0))
        self._advance_ngrams()
        self._sync()
        dt = self._less_builds(time.perf_counter() - t0, b0)
        self.metrics.add_plain_step(dt)
        if warm:  # this step measured AR at the current context
            self._timed_plain(dt)
        self.clock.ended()
        return StepResult([token])

    def _verify(self, trie, L: int, pad: int, capture: bool):
        """rows(node) -> that candidate row's logits [1, vocab]; each layer's queries [T, heads, dim] when
        capture is set; the target's token after every trie node when the fast path sampled them (else
        None); every row's last-layer state; every row's drafts when the fast path made them (else None).

        Off the fast path the LM head runs only on the rows the walk visits (the accepted path and one
        more), not on every candidate; a small batch takes one product for all its rows where that costs about
        what one row does (16-bit weights; the CPU's C products up to PRODUCT_ROWS rows, torch's float32 column product
        up to COLUMN_ROWS)."""
        if self.fast is not None:
            logits, queries, targets, hidden, drafted = self.fast.verify(trie, L, pad)
            return (lambda node: logits[node:node + 1]), queries, targets, hidden, drafted
        tokens, positions, tree_mask = (t.to(self.lm.device) for t in verify_inputs(trie, L, pad))
        mask = with_prefix(tree_mask, L, positions, self.lm.config.sliding_window)
        out = self.lm.model(tokens, positions, self.cache, L, mask, logits="none", capture_queries=capture,
                            exact_rows=True, keep_layers=self.needs.feature_layers)
        if len(trie.tokens) <= self.shared_head_rows:
            logits = self.lm.model.logits_of(out.hidden[: len(trie.tokens)])
            rows = lambda node: logits[node:node + 1]  # noqa: E731
        else:
            rows = lambda node: self.lm.model.logits_of(out.hidden[node:node + 1])  # noqa: E731
        return rows, out.queries, None, self.needs.rows(out), None

    def _target_token(self, logits: torch.Tensor, trie, node: int, L: int) -> int:
        """The target's token after `node`, from that row's logits [1, vocab]."""
        path, i = [], node
        while i > 0:
            path.append(trie.tokens[i])
            i = trie.parents[i]
        path.reverse()
        return self._sample(logits, self._history(L + 1, path), L + len(path) + 1 + self.window.offset)

    def _maybe_probe_ar(self, warm: bool) -> None:
        """Measure one plain AR step at the current context, so time saved is against this very run; only on a
        warm step where one is due (clock.py). It writes the root's K/V at slot `length`, as the verify pass next."""
        if not self.clock.probe_due(warm):
            return
        self._sync()
        b0, t0 = self._built(), time.perf_counter()
        self._ar_token(self.length)
        self._tops.clear()  # the probe's token is thrown away, and so are its alternatives
        self._sync()
        self._timed_plain(self._less_builds(time.perf_counter() - t0, b0))

    def _timed_plain(self, seconds: float) -> None:
        """A warm plain step's time (a probe's, the plain gear's): the policy's, and time saved's once settled."""
        self.metrics.ar_latency_s = self.clock.plain_step(seconds) or self.metrics.ar_latency_s
        if self.policy is not None:
            self.policy.observe_plain(seconds)

    def _sample(self, logits: torch.Tensor, window: torch.Tensor | None, position: int) -> int:
        """The target's token at story position `position` from one row of logits [1, vocab]; when recording, also
        its alternatives, from the scores it is drawn from (alternatives.py)."""
        token, scores = self.sampler.draw(logits, window, position)
        if self.record:
            self._tops.append(self.sampler.alternatives(scores, token))
        return int(token[0])

    def take_alternatives(self) -> list[Alternatives] | None:
        """The alternatives of the tokens emitted since the last call, one per token (None: not recorded)."""
        if not self.record:
            return None
        rows, self._tops = self._tops, []
        return from_rows(torch.cat(rows)) if rows else []

