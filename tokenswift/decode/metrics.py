"""Run metrics (design §7): acceptance α, n-gram acceptance β, tokens per iteration, timings, time saved.

α = accepted draft tokens / ((γ+1) × iterations), as the paper's Eq. 4; β the same for the accepted
tokens that lie on an n-gram candidate; tokens per iteration likewise. All three count TokenSwift
iterations only: the plain steps an adaptive run takes where they are faster (adaptive.py) draft nothing
and are counted apart. Time saved is measured, not assumed: tokens × the AR latency probed in the same
run at the current context − the time actually spent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RunMetrics:
    mode: str
    depth: int = 4  # γ + 1: the most draft tokens one iteration can accept
    steps: int = 0  # TokenSwift iterations (every step, in AR mode)
    plain_steps: int = 0  # AR steps taken inside a TokenSwift run
    tokens: int = 0
    accepted: int = 0  # draft tokens accepted (tokens beyond the one the target always contributes)
    ngram_accepted: int = 0
    ngram_hits: int = 0  # iterations in which a token only an n-gram proposed was accepted
    draft_s: float = 0.0
    verify_s: float = 0.0
    overhead_s: float = 0.0  # everything outside the two model passes: trie, sampling, commit, n-grams
    prefill_s: float = 0.0
    ar_latency_s: float = 0.0  # AR step time at the current context: the median of clock.AR_SAMPLES timings
    time_saved_s: float = 0.0
    # Iterations before the AR step time settled (clock.SETTLED): tokens and seconds, priced at its settled median.
    unpriced_tokens: int = 0
    unpriced_s: float = 0.0
    accept_histogram: list[int] = field(default_factory=lambda: [0] * 9)
    verify_batch: int = 0  # verify rows (padded candidate batch) of the latest iteration: the adaptive choice
    verify_batches: dict[str, int] = field(default_factory=dict)  # iterations per verify batch size
    shifts: int = 0  # context shifts (context_window.py): windows rebuilt past the model's context
    shift_s: float = 0.0  # seconds spent rebuilding them (part of the elapsed time; AR pays them too)
    shift_rows: int = 0  # the rebuilt windows' slots
    shift_ready: int = 0  # of which filled ahead of the shift (lookahead.py)
    rewinds: int = 0  # banned phrases rewound (banned.py); the tokens rewound count in `tokens`
    rewind_s: float = 0.0  # seconds spent restarting there (part of the elapsed time; AR pays them too)
    # First calls of the fast path's passes (CUDA-graph capture, kernel compilation, warm-up): one-off costs, kept
    # out of the decoding times above, so out of time saved and of what the adaptive policy weighs.
    capture_s: float = 0.0
    path: str = "eager passes"  # which path ran the passes and why (options.PathChoice.describe)

    @property
    def elapsed_s(self) -> float:
        return self.draft_s + self.verify_s + self.overhead_s + self.shift_s + self.rewind_s

    def add_step(self, emitted: int, accepted: int, ngram_accepted: int, ngram_hit: bool,
                 draft_s: float, verify_s: float, overhead_s: float) -> None:
        self.steps += 1
        self.tokens += emitted
        self.accepted += accepted
        self.ngram_accepted += ngram_accepted
        self.ngram_hits += int(ngram_hit)
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.overhead_s += overhead_s
        self.accept_histogram[min(accepted, len(self.accept_histogram) - 1)] += 1
        spent = draft_s + verify_s + overhead_s
        if self.ar_latency_s:
            self.time_saved_s += (emitted + self.unpriced_tokens) * self.ar_latency_s - (spent + self.unpriced_s)
            self.unpriced_tokens, self.unpriced_s = 0, 0.0
        else:
            self.unpriced_tokens += emitted
            self.unpriced_s += spent

    def add_shift(self, seconds: float, rows: int, ready: int) -> None:
        """A context shift of `rows` slots, `ready` of them filled ahead: not counted against time saved, since plain
        decoding shifts at the same tokens."""
        self.shifts += 1
        self.shift_s += seconds
        self.shift_rows += rows
        self.shift_ready += ready

    def add_rewind(self, seconds: float) -> None:
        """A banned phrase's rewind: the engine started again where it began (not against time saved either)."""
        self.rewinds += 1
        self.rewind_s += seconds

    def add_plain_step(self, seconds: float) -> None:
        """One token from a plain step of a TokenSwift run: time saved stays as it was (it is the baseline)."""
        self.plain_steps += 1
        self.tokens += 1
        self.verify_s += seconds

    def to_dict(self) -> dict:
        steps = max(self.steps, 1)
        elapsed = self.elapsed_s
        out = asdict(self)
        del out["unpriced_tokens"], out["unpriced_s"]  # the accounting's own state, not a figure of the run
        out.update(
            elapsed_s=elapsed,
            tokens_per_s=self.tokens / elapsed if elapsed > 0 else 0.0,
            alpha=self.accepted / (self.depth * steps) if self.mode == "tokenswift" else 0.0,
            beta=self.ngram_accepted / (self.depth * steps) if self.mode == "tokenswift" else 0.0,
            tokens_per_step=(self.tokens - self.plain_steps) / steps,
            plain_share=self.plain_steps / max(self.steps + self.plain_steps, 1),
        )
        return out


def distinct_n(ids: list[int], n: int) -> float:
    """Unique n-grams / total n-grams of a token sequence (0 when there are none)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def distinct(ids: list[int]) -> list[float]:
    return [distinct_n(ids, n) for n in (1, 2, 3, 4)]


# Where TokenSwift's text is not promised to equal plain decoding's token for token (design §3): the two compute
# a position's logits in differently shaped passes, and where rounding exceeds the gap between the two best
# noisy scores the sampled token flips and the texts part: often in 16-bit numbers, rarely in float32 (about once
# in 10^4-10^5 tokens, design §3), practically never in float64 (where the tests prove the equality). On a CPU,
# float32 and q4 run every verify row through the C kernels exactly as a plain step (native_rows.py): no caveat
# there. (q4 runs nowhere else. float32 falls back to torch's operators where no C compiler builds the kernels,
# and then can part as on a GPU; the notice, drawn from the worker's device and dtype, does not know that case.)
NOT_TOKEN_EXACT = {"float32": ("float32", "rarely (about once in 10,000-100,000 tokens) "),
                   "bfloat16": ("bfloat16", ""), "float16": ("float16", "")}


def same_text_caveat(precision: str | None, device: str | None) -> str | None:
    """What limits the "same text as plain decoding" promise at this --dtype on this device; None where it holds."""
    if precision not in NOT_TOKEN_EXACT or (device == "cpu" and precision == "float32"):
        return None
    name, how = NOT_TOKEN_EXACT[precision]
    return (f"in {name} TokenSwift's text can {how}part from plain decoding's at a near tie: as good a text, not "
            "the same one (Compare shows where they part)")
