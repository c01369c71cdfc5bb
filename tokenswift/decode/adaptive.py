"""A candidate batch that adapts to the context length and the measured pass costs (design §8).

At a short context the verify pass costs about one token's weight read whatever its size, so the full
121-row batch is free. At 100K the pass reads the whole cache and its attention turns compute-bound near
295 / (query heads per KV head) rows on an H100, so fewer candidates emit more tokens per second. Each
iteration the policy picks one of a few nested shapes (tree widths, n-gram k), maximising

    rate(S) = E[tokens per iteration | S] / E[seconds per iteration | S]

- Tokens: after an iteration we know exactly what any shape contained in the one used would have emitted.
  The walk follows the target's own tokens, which do not depend on the candidates, so a smaller shape
  accepts the longest prefix of the accepted path that its trie contains. Each iteration thus updates
  the estimate of every shape the one used contains (the first shape contains them all).
- Seconds: per shape, the median of its latest measured iteration times; at most every `explore_every`
  iterations, and within `explore_share` of the time, the shape measured longest ago runs again, so the
  times follow the growing context. A median, not a moving average: on a shared CPU one slow iteration (another
  process's burst) held a shape's average up for a dozen iterations and, at a 5-15% margin, sent the policy to
  plain steps or the wrong shape; it moves a median of 3 not at all, while a lasting change takes it over in
  two of that shape's timings, as fast as the average did (a median of 9 took five, and a shape re-timed only
  now and then kept a stale time for long stretches).

- Plain steps: when one AR step (timed by the engine at the current context) emits more tokens per second
  than the best shape, nothing is drafted: the engine takes plain steps, and one TokenSwift iteration keeps
  α and the pass costs current, once the plain steps since the last one took 1 / `plain_explore_share`
  times its cost (so exploring costs about that share of the time, a sixth of it where the best shape is far
  behind plain steps: `_plain_share`). Three explorations in four run the
  best shape, the one closest to overtaking plain steps; the fourth the shape timed longest ago. Rotating
  through every shape spent most of the share on the largest, which on a CPU costs six plain steps and
  never pays, while the two-row shape crossed over unnoticed as the context grew. On a
  CPU, where a verify pass costs nearly its rows in compute, this keeps TokenSwift from running slower than
  plain decoding; on a GPU the verify batch is nearly free and the plain gear stays unused.
  The other way round too: while a shape is faster, by less than PLAIN_CHECK_MARGIN, one plain step is taken once
  drafting since the last one took 1 / `plain_explore_share` times a plain step, so the plain time it is compared
  with stays as current as the shape's. Timed only by the engine's probe (every 8 s), the plain time was one
  noisy burst's for the whole run: 19.6 ms where plain steps took 14, and the 2-row shape, at 20 ms for 1.4
  tokens, drafted at 0.96× plain decoding's speed (`bench`, 2K, q4). A plain step emits its token, so checking
  costs only the margin.
  An exploration after plain steps first has the drafter catch up on their rows (the draft layer runs them
  lazily): that switch is timed apart and not charged to the shape, whose time is then what it costs among
  drafting iterations. Charged to it, the 2-row shape took 20 ms where it takes 13 at 2K, lost to a 9 ms plain
  step at 1.5 tokens an iteration, and never ran twice in a row to show otherwise. The switch counts against
  the exploration's share instead.

The choice only decides which candidates are verified, or whether any are. The trie and the walk are
lossless for any candidate set, and a plain step samples the very position-keyed token the walk would
take at the root, so the emitted text is the same whatever the policy does.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tokenswift.settings import NGRAM_LEN, max_nodes

# While drafting, plain steps are re-timed only where the best shape is less than this many times as fast: a plain
# time caught in one slow moment ran 40% high on this CPU (19.6 ms where plain steps took 14).
PLAIN_CHECK_MARGIN = 1.5
# While plain steps are faster, explorations take their full share of the time where the best shape writes at
# NEAR_PLAIN of plain decoding's speed or more, FAR_SHARE of it at FAR_FROM_PLAIN or less
# (CandidatePolicy._plain_share).
NEAR_PLAIN, FAR_FROM_PLAIN, FAR_SHARE = 0.9, 0.5, 1 / 6


@dataclass(frozen=True)
class Shape:
    widths: tuple[int, ...]  # top-k taken from each draft distribution (depth 1 first)
    k: int  # n-gram candidates

    @property
    def slots(self) -> int:
        """Rows of the padded verify batch: fixed per shape, so each shape is one captured graph."""
        return max_nodes(self.widths, self.k)

    def cut(self, levels: Sequence[Sequence[int]]) -> list[list[int]]:
        """This shape's share of the drafter's proposals (each level sorted best first)."""
        return [list(level[:w]) for level, w in zip(levels, self.widths, strict=False)]

    def contains(self, other: Shape) -> bool:
        """Whether every candidate of `other` is one of this shape's (so its outcome is known from ours)."""
        return (len(other.widths) <= len(self.widths) and other.k <= self.k
                and all(b <= a for a, b in zip(self.widths, other.widths, strict=False)))

    def label(self) -> str:
        return f"{'-'.join(map(str, self.widths))}/k{self.k}"


def ladder(widths: Sequence[int], k: int) -> list[Shape]:
    """Shapes from the configured one down to a chain, then chains without n-gram paths down to a single
    guess, and stars: the best few guesses of the first level alone. The first contains every other. The
    short ones are for a CPU, where a float32 pass of up to four rows costs about one row's weight read
    (model.COLUMN_ROWS) and more rows cost compute; there a star often beats the chain of the same rows, as the
    first head's second and third guesses are right more often than the deeper heads.

    For the paper's drafter, (1,3,3,3) with k=20: 121, 56, 28, 13, 5, 3 and 2 verify rows (its first level
    is the base head's one guess, so it has no star). For the fused one, (3,3,3): 120, 55, 31, 12, 4, 3, 2 and
    the stars of 4 and 3 rows."""
    widths = tuple(widths)
    steps = [
        (widths, k),
        (tuple(min(w, 2) for w in widths), k // 2),
        (tuple(min(w, 2) if d < 2 else 1 for d, w in enumerate(widths)), k // 4),
        (tuple(1 for _ in widths), k // 8),
        (tuple(1 for _ in widths), 0),
        (tuple(1 for _ in widths[:2]), 0),
        (tuple(1 for _ in widths[:1]), 0 if widths else min(k, 1)),
        *(((min(widths[0], n),), 0) for n in (3, 2) if widths),
    ]
    shapes: list[Shape] = []
    for w, kk in steps:
        shape = Shape(w, kk)
        if shape.slots > 1 and shape not in shapes:  # a root alone is a plain step
            shapes.append(shape)
    return shapes


def accepted_under(shape: Shape, levels: Sequence[Sequence[int]], paths: Sequence[Sequence[int]],
                   accepted: Sequence[int]) -> int:
    """How many of the `accepted` draft tokens (depth 1 first) `shape`'s trie would have accepted, given the
    levels and n-gram paths of a shape that contains it."""
    tree = 0
    while (tree < len(accepted) and tree < len(shape.widths)
           and accepted[tree] in levels[tree][: shape.widths[tree]]):
        tree += 1
    best = tree
    for path in paths[: shape.k]:
        m = 0
        while m < min(len(path), len(accepted)) and path[m] == accepted[m]:
            m += 1
        best = max(best, m)
    return best


def best_shape(tokens: Sequence[float | None], seconds: Sequence[float | None]) -> int:
    """Index of the shape with the most expected tokens per second (ties: the larger shape, listed first)."""
    rates = [t / s if t is not None and s else -1.0 for t, s in zip(tokens, seconds, strict=True)]
    return max(range(len(rates)), key=lambda i: (rates[i], -i))


class CandidatePolicy:
    def __init__(self, shapes: Sequence[Shape], explore_every: int = 16, token_decay: float = 0.02,
                 time_samples: int = 3, plain_explore_share: float | None = 0.03, explore_share: float = 0.05):
        """explore_every: the fewest iterations between two re-timings of other shapes than the best;
        explore_share: the most of the time they take. plain_explore_share: the most of the time spent on
        TokenSwift iterations while plain steps are faster (a sixth of it where the best shape is far behind them:
        _plain_share); None: never take plain steps. time_samples: how
        many of a shape's latest timings (and of the plain steps') its time is the median of.

        token_decay: an iteration emits 1 or 2 tokens on a small shape, so an average over ~10 of them (0.1)
        swung by +-0.1 token and, at a 5-15% margin, sent the policy to plain steps for long stretches where
        the two-row pass was faster; ~50 iterations (0.02) halve the swing. The first 1/token_decay
        observations are a plain mean, so the first one does not linger."""
        self.shapes = list(shapes)
        # For each shape, the shapes whose outcome its iterations tell (itself included): fixed, so worked out once.
        self.contained = [[j for j, other in enumerate(self.shapes) if shape.contains(other)] for shape in self.shapes]
        self.explore_every, self.token_decay = explore_every, token_decay
        self.explore_share = explore_share
        self.last_explored = 0
        self.clock = 0.0  # seconds of TokenSwift iterations so far
        self.clock_used = [0.0] * len(self.shapes)  # the clock when each shape last ran: also its recency
        self.plain_explore_share = plain_explore_share
        self.plain_times: deque[float] = deque(maxlen=time_samples)  # the latest plain steps' times
        self.plain_seconds: float | None = None  # their median
        self.plain_run_s = 0.0  # seconds of plain steps since the last TokenSwift iteration
        self.plain_clock = 0.0  # the clock when a plain step was last timed
        self.switch_s = 0.0  # the latest cost of switching from plain steps to drafts (observe's switch_s)
        n = len(self.shapes)
        self.tokens: list[float | None] = [None] * n  # moving average of tokens per iteration
        self.token_counts = [0] * n
        self.times = [deque(maxlen=time_samples) for _ in range(n)]  # the latest seconds per iteration
        self.seconds: list[float | None] = [None] * n  # their median
        self.timed = [0] * n  # iterations timed per shape
        self.iteration = 0
        self.current = 0
        self.explorations = 0  # TokenSwift iterations taken while plain steps were faster
        self.warm_order = sorted(range(n), key=lambda i: (self.shapes[i].slots, i))  # smallest first
        self.ruled_out: set[int] = set()  # shapes that cannot beat plain steps (_hopeless): never run

    def choose(self, plain_ok: bool = True) -> Shape | None:
        """The shape of the next iteration, or None for a plain step (only when plain_ok, or when nothing can be
        drafted)."""
        pick = self._pick()
        if pick is not None:
            self.plain_run_s = 0.0
        elif plain_ok or not self.shapes:
            return None
        else:  # a pass the drafter needs (a due partial-cache selection), not an exploration: the plain run goes on,
            pick = best_shape(self.tokens, self.seconds)  # or one every ~240 tokens would keep explorations away
        self.current = pick
        return self.shapes[pick]

    def _pick(self) -> int | None:
        if not self.shapes:  # nothing to draft (no heads, no n-grams): every step is a plain one
            return None
        # Each shape runs twice first: its first time includes one-off costs (graph capture, kernel
        # compilation) and is not kept. Smallest first, so that a shape that cannot pay is known before it runs.
        for i in self.warm_order:
            if self.timed[i] < 2 and i not in self.ruled_out:
                if not self._hopeless(i):
                    return i
                self.ruled_out.add(i)
        best = best_shape(self.tokens, self.seconds)
        if self._plain_is_faster(best):
            explore = self._exploration(best, self.plain_run_s)
            if explore is not None:
                self.explorations += 1
            return explore
        if self._plain_is_stale(best):
            return None
        if self.iteration - self.last_explored >= self.explore_every:
            # Re-time the shape timed longest ago among those its share of the time affords: on a CPU the
            # largest shape costs seven plain steps and never pays, and timing it every ~100 iterations cost
            # a tenth of the run. Where shapes cost about the same (a GPU), each is re-timed about every
            # (shapes - 1) / explore_share iterations, ~120 for seven shapes.
            share = self.explore_share / max(1, len(self.shapes) - 1)  # each shape's part of the share
            affordable = [i for i, t in enumerate(self.seconds)
                          if t is not None and t <= share * (self.clock - self.clock_used[i])]
            if affordable:
                self.last_explored = self.iteration
                return min(affordable, key=lambda i: self.clock_used[i])
        return best

    def plain_next(self) -> bool:
        """Whether the iteration after the plain step about to run will be a plain step too: plain steps are
        faster, no shape waits for its warm-up, and the next exploration is not due even with two more plain
        steps' time. Then that step need not make the fused drafter's proposals for the next root: on a GPU they
        cost 18% of the default model's plain step (3.11 ms against 2.63 at 2K, an H200). A wrong guess costs
        only time: the drafter makes the proposals itself (fused_drafter.propose)."""
        if not self.shapes:
            return True
        if any(self.timed[i] < 2 and i not in self.ruled_out for i in self.warm_order):
            return False
        best = best_shape(self.tokens, self.seconds)
        if not self.plain_seconds or not self._plain_is_faster(best):
            return False
        return self._exploration(best, self.plain_run_s + 2 * self.plain_seconds) is None

    def _exploration(self, best: int, plain_run_s: float) -> int | None:
        """While plain steps are faster: the shape to run once they have taken `plain_run_s` since the last
        iteration that drafted, or None (not yet)."""
        explore = self._least_recent() if self.explorations % 4 == 3 else best
        if self.seconds[explore] + self.switch_s > self._plain_share(best) * plain_run_s:
            return None
        return explore

    def _plain_share(self, best: int) -> float:
        """plain_explore_share where the best shape writes at NEAR_PLAIN of plain steps' speed or more, down to a
        sixth of it at FAR_FROM_PLAIN and below. An exploration is a bet that the shape has caught up: on this
        project's AVX2 CPU at 7K the best one wrote at ~0.6-0.8 of plain decoding's speed, and exploring at the full
        3% of the time (its switch included) lost up to ~3% to plain decoding, where TokenSwift should be level.
        The speeds move with the context and the text, slowly: a shape near plain steps is still re-timed often,
        one far behind at least once plain steps took 200 times its cost."""
        if not (self.tokens[best] and self.seconds[best] and self.plain_seconds):
            return self.plain_explore_share
        ratio = self.tokens[best] / self.seconds[best] * self.plain_seconds
        closeness = (ratio - FAR_FROM_PLAIN) / (NEAR_PLAIN - FAR_FROM_PLAIN)
        return self.plain_explore_share * min(1.0, max(FAR_SHARE, closeness))

    def _plain_is_faster(self, best: int) -> bool:
        if self.plain_explore_share is None or not self.plain_seconds or not self.seconds[best]:
            return False
        return 1.0 / self.plain_seconds > self.tokens[best] / self.seconds[best]

    def _plain_is_stale(self, best: int) -> bool:
        """Whether drafting since the last plain timing took its 1 / plain_explore_share plain steps, while the best
        shape is within PLAIN_CHECK_MARGIN of plain steps: further ahead (a GPU, 2-3× plain decoding) no stale time
        could reverse the choice, and a plain step every 33 would only cost 1-2%."""
        if self.plain_explore_share is None or not self.plain_seconds or not self.seconds[best]:
            return False
        if self.tokens[best] / self.seconds[best] >= PLAIN_CHECK_MARGIN / self.plain_seconds:
            return False
        return self.clock - self.plain_clock >= self.plain_seconds / self.plain_explore_share

    def _least_recent(self) -> int:
        return min((i for i in range(len(self.shapes)) if i not in self.ruled_out), key=lambda i: self.clock_used[i])

    def _hopeless(self, i: int) -> bool:
        """Whether shape i, at the time extrapolated from the shapes timed so far (linear in its rows), could not
        beat plain steps even if every candidate of its deepest path were accepted. On a CPU a verify row costs
        compute: the 84-row shape took 14 plain steps a pass at 2K, and timing it twice cost 5% of a 512-token
        run. On a GPU rows are nearly free, and nothing is ruled out."""
        timed = [(self.shapes[j].slots, s) for j, s in enumerate(self.seconds) if s is not None]
        if not self.plain_seconds or len({rows for rows, _ in timed}) < 2:
            return False
        mean_rows = sum(r for r, _ in timed) / len(timed)
        mean_s = sum(s for _, s in timed) / len(timed)
        slope = (sum((r - mean_rows) * (s - mean_s) for r, s in timed)
                 / sum((r - mean_rows) ** 2 for r, _ in timed))
        predicted = mean_s + max(0.0, slope) * (self.shapes[i].slots - mean_rows)
        shape = self.shapes[i]
        most = 1 + max(len(shape.widths), NGRAM_LEN if shape.k else 0)
        return most / predicted < 1.0 / self.plain_seconds

    def observe_plain(self, seconds: float) -> None:
        """The time of one plain step at the current context: one taken, or the engine's periodic probe."""
        self.plain_times.append(seconds)
        self.plain_seconds = statistics.median(self.plain_times)
        self.plain_run_s += seconds
        self.plain_clock = self.clock

    def observe(self, levels: Sequence[Sequence[int]], paths: Sequence[Sequence[int]], accepted: Sequence[int],
                seconds: float | None, switch_s: float = 0.0) -> None:
        """One iteration of the current shape: its candidates, the accepted draft tokens, its duration (None: it
        ran cold, after a pause: its tokens count, its time does not), less switch_s, what it spent catching up
        on plain steps' rows before drafting (the drafter's switch_s; counted against exploring, not the shape)."""
        if switch_s > 0:
            self.switch_s = switch_s
        i = self.current
        for j in self.contained[i]:
            tokens = 1 + accepted_under(self.shapes[j], levels, paths, accepted)
            self.token_counts[j] += 1
            self.tokens[j] = _average(self.tokens[j], tokens, max(self.token_decay, 1 / self.token_counts[j]))
        self.iteration += 1
        if seconds is None:
            return
        if self.timed[i] > 0:
            self.times[i].append(seconds)
            self.seconds[i] = statistics.median(self.times[i])
        self.clock += seconds
        self.clock_used[i] = self.clock
        self.timed[i] += 1


def _average(old: float | None, new: float, decay: float) -> float:
    return new if old is None else old + decay * (new - old)
