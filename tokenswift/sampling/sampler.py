"""Samplers: the contextual penalty, temperature, top-nσ/top-k/top-p/min-p/η filters, and position-keyed noise.

Every function here is row-wise: row r of a batch is processed exactly as it would be alone, so a node of
the verification trie gets the same token as plain decoding would at that position.

Position-keyed common random numbers (design §3)
-------------------------------------------------
The token chosen at absolute position t is argmax_i (z_i / T + g_i(seed, t)), the Gumbel-max trick, where
z are the processed logits and g_i = -log(-log(u_i)) with u_i built from a counter-based integer hash of
(seed, t, i). There is no RNG state: the noise for position t is the same whether it is drawn by plain
decoding, by any node at depth d with L + d = t, on CPU or CUDA (integer arithmetic is exact on both; only
the final float64 log may differ in the last ulp), and whatever other rows share the batch. Because every
candidate at a position sees the same noise, at most one child of a trie node can be the target's token:
that is what makes tree verification exactly lossless. Greedy decoding (T = 0) is the same rule without
noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from tokenswift.sampling.adaptive_p import AdaptiveP, steered
from tokenswift.sampling.alternatives import top_row_of, top_rows
from tokenswift.sampling.dry_xtc import dry_amounts, match_limit, xtc_draws, xtc_filter
from tokenswift.sampling.keys import M32, mix32, position_key, position_keys, uniform
from tokenswift.sampling.no_repeat import repeat_followers
from tokenswift.sampling.row_kernel import RowKernel, covers
from tokenswift.settings import REPEAT_RANGE, Settings

REMEMBERED = 8  # windows whose DRY repeats and no-repeat followers a sampler keeps (_remembered)


class Noise:
    """Gumbel noise g[r, i] for rows at given absolute positions."""

    def __init__(self, seed: int, vocab_size: int, device, kernel: RowKernel | None = None):
        """kernel: the C rows of a CPU, which draw one position's uniforms for a few tokens (~17 torch operators)."""
        self.seed, self.kernel = seed, kernel
        ids = torch.arange(vocab_size, dtype=torch.int64, device=device)
        self.token_mix = mix32((ids * 0x9E3779B1 + 0x7F4A7C15) & M32)

    def gumbel(self, positions: list[int] | torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """[R, V] noise, or [R, len(ids)] for the token ids `ids` only (each value as in the full row).

        positions: host ints, or an int64 device tensor (inside a captured graph): position_key and mix32 give
        the same integers for both."""
        if self.kernel is not None and ids is not None and isinstance(positions, list) and len(positions) == 1 \
                and ids.device.type == "cpu":
            return self.of(self.kernel.uniforms(self.token_mix, ids, position_key(self.seed, positions[0])))[None]
        keys = position_keys(self.seed, positions, self.token_mix.device)[:, None]
        mix = self.token_mix if ids is None else self.token_mix[ids]
        h = mix32(mix[None, :] ^ keys)
        return self.of(uniform(mix32((h + keys) & M32)))

    @staticmethod
    def of(u: torch.Tensor) -> torch.Tensor:
        """Gumbel noise of uniform draws: the one place its logs are taken (their rounding is the text's)."""
        return -torch.log(-torch.log(u))


def penalty_mask(windows: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """windows: [R, W] token ids padded with -1 -> [R, vocab] bool: token occurs in the row's window."""
    idx = torch.where(windows < 0, vocab_size, windows)
    mask = torch.zeros(windows.shape[0], vocab_size + 1, dtype=torch.bool, device=windows.device)
    mask.scatter_(1, idx, True)
    return mask[:, :vocab_size]


def penalised(logits: torch.Tensor, theta: float) -> torch.Tensor:
    """Sign-aware contextual penalty (design §6): positive logits are divided by θ, negative ones multiplied, so
    both become less likely (the paper's Eq. 3 read literally would raise negative logits)."""
    return torch.where(logits > 0, logits / theta, logits * theta)


def apply_penalty(logits: torch.Tensor, mask: torch.Tensor, theta: float) -> torch.Tensor:
    """The penalty on the tokens of a [R, vocab] mask (a whole distribution: draft-layer training)."""
    return torch.where(mask, penalised(logits, theta), logits)


def top_k_filter(scores: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, -math.inf)


def top_p_filter(scores: torch.Tensor, top_p: float, min_keep: int) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=False, stable=True)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -min_keep:] = False
    return scores.masked_fill(remove.scatter(-1, order, remove), -math.inf)


def top_n_sigma_filter(scores: torch.Tensor, n: float) -> torch.Tensor:
    """Top-nσ (Tang et al., "Top-nσ: Not All Logits Are You Need"; llama.cpp PR 11223): keep the tokens whose score
    is at least max − n·σ, σ the population standard deviation of the row's finite scores (tokens an earlier rule set
    to −inf are not counted, as llama.cpp). Max and σ both scale by 1/T, so the kept set does not depend on the
    temperature: the model's own confidence picks how many tokens stay."""
    finite = torch.isfinite(scores)
    count = finite.sum(dim=-1, keepdim=True)
    mean = torch.where(finite, scores, 0.0).sum(dim=-1, keepdim=True) / count
    sigma = (torch.where(finite, scores - mean, 0.0) ** 2).sum(dim=-1, keepdim=True).div(count).sqrt()
    return scores.masked_fill(scores < scores.amax(dim=-1, keepdim=True) - n * sigma, -math.inf)


def min_p_filter(scores: torch.Tensor, min_p: float, min_keep: int) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's: p_i < min_p · p_max is
    z_i - z_max < log(min_p), read off the scores without a softmax."""
    remove = scores - scores.amax(dim=-1, keepdim=True) < math.log(min_p)
    if min_keep == 1:  # the best token is never removed (0 < log(min_p) is false): no argmax (133 -> 84-107 µs)
        return scores.masked_fill(remove, -math.inf)
    return _keep_best(scores, remove, min_keep)


def eta_filter(scores: torch.Tensor, epsilon: float, min_keep: int) -> torch.Tensor:
    """η-sampling: drop tokens below η = min(ε, √ε · exp(−H)), H the entropy of the distribution."""
    log_probs = scores.log_softmax(dim=-1)
    probs = log_probs.exp()
    entropy = -(probs * log_probs.nan_to_num(neginf=0.0)).sum(dim=-1, keepdim=True)
    eta = torch.clamp(math.sqrt(epsilon) * torch.exp(-entropy), max=epsilon)
    return _keep_best(scores, probs < eta, min_keep)


def _keep_best(scores: torch.Tensor, remove: torch.Tensor, min_keep: int) -> torch.Tensor:
    if min_keep == 1:  # the one best token (the first of equals, as the stable sort below): no full sort
        remove = remove.scatter(-1, scores.argmax(dim=-1, keepdim=True), False)
        return scores.masked_fill(remove, -math.inf)
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    ranked = remove.gather(-1, order)
    ranked[..., :min_keep] = False
    return scores.masked_fill(ranked.scatter(-1, order, ranked), -math.inf)


class Sampler:
    """Turns raw logits into tokens under one Settings, with the noise of each row's position."""

    def __init__(self, settings: Settings, vocab_size: int, device, eos_ids: tuple[int, ...] = (),
                 breakers: torch.Tensor | None = None, bans: Mapping[int, Collection[int]] | None = None,
                 kernel: RowKernel | None = None):
        """breakers: [vocab] bool, DRY's sequence breakers (dry_xtc.breaker_ids); needed when DRY is on.
        bans: {story index: token ids} forbidden at that position only (banned.py's rewinds).
        kernel: the C rows of a CPU (row_kernel.py), used wherever they cover the settings and the row."""
        self.s = settings
        self.kernel = kernel if kernel is not None and covers(settings) else None
        self.breakers = breakers.to(device) if breakers is not None else None
        if settings.dry_multiplier > 0 and self.breakers is None:
            raise ValueError("DRY is on: the sampler needs the sequence breakers' token ids")
        self.vocab_size = vocab_size
        self.noise = Noise(settings.seed, vocab_size, device, self.kernel) if settings.temperature > 0 else None
        # Adaptive-P's history (adaptive_p.py): only the target's own draws (draw, recall) read and move it.
        self.adaptive = AdaptiveP(settings.adaptive_target, settings.adaptive_decay) \
            if settings.adaptive_target >= 0 else None
        # Banning end-of-text is part of the sampling rule, so plain decoding and every trie node obey it alike.
        self.eos = torch.tensor(eos_ids, dtype=torch.int64, device=device)[None] if settings.ban_eos and eos_ids \
            else None
        self._columns: dict[int, torch.Tensor] = {}  # a drafter's vocabulary -> each token's column (_cols)
        self._memo: dict[tuple[str, bytes], Any] = {}  # a window's DRY repeats or no-repeat followers (_remembered)
        # In an instruction draft's answer (context_window.AfterAnswer): the token that takes the end of text's place.
        self.answer_end: int | None = None
        # A banned phrase's bans are part of the rule too, keyed by position like the noise: every row sampled at
        # that position, plain or a trie node, eager or captured (a device comparison, no host sync), obeys them.
        self.bans, self.ban_ids = {}, {}
        for position, tokens in (bans or {}).items():
            self.bans[position] = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.bans[position][list(tokens)] = True
            self.ban_ids[position] = self.bans[position].nonzero().squeeze(1)

    def penalize(self, logits: torch.Tensor, windows: torch.Tensor | None,
                 vocab: torch.Tensor | None = None) -> torch.Tensor:
        """The end-of-text ban, the penalty, the no-repeat rule and DRY: the scores every later filter starts from.

        Each of them changes a few columns (the ends of text, the window's tokens, the tokens a repeat would go on
        with), read and written with gather/scatter on one copy of the rows, whose extra last column takes the
        writes of padding: a pass over the whole vocabulary per rule was most of the cost of sampling a row on a CPU
        (3.9 of 4.7 ms with the writing defaults). Static shapes, so a captured graph runs it too.
        vocab: the token ids of the columns when `logits` covers part of the vocabulary (a drafter's draft
        vocabulary: proposals only, where filtering within it is close enough and much cheaper)."""
        if self.kernel is not None and RowKernel.runs(logits):
            scores = self._kernel_rows(logits, windows, None, vocab, penalized=True)
            if scores is not None:
                return scores
        s = self.s
        z = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        width = z.shape[1]
        out = torch.cat((z, z.new_zeros(z.shape[0], 1)), dim=1)
        if self.eos is not None:
            if self.answer_end is not None and vocab is None:  # the end of text's probability goes to the break
                end = out[:, self.answer_end:self.answer_end + 1]
                out[:, self.answer_end] = torch.cat((end, out[:, self.eos[0]]), dim=1).logsumexp(dim=1)
            out.scatter_(1, self._cols(self.eos.expand(z.shape[0], -1), vocab, width), -math.inf)
        if windows is not None and s.penalty != 1.0 and s.penalty_window > 0:
            cols = self._cols(windows[:, -s.penalty_window:], vocab, width)
            out.scatter_(1, cols, penalised(out.gather(1, cols), s.penalty))
        if windows is not None and s.no_repeat_ngram:
            out.scatter_(1, self._cols(self._refused(windows), vocab, width), -math.inf)
        if windows is not None and s.dry_multiplier > 0:
            followers, amounts = self._dry(windows)
            cols = self._cols(followers, vocab, width)
            # A token that extends several repeats loses its largest amount: z - a falls as a grows.
            out.scatter_reduce_(1, cols, out.gather(1, cols) - amounts.to(out.dtype), "amin")
        return out[:, :width]

    def _refused(self, windows: torch.Tensor) -> torch.Tensor:
        """The no-repeat rule's followers of the rows' windows (no_repeat.py)."""
        n = self.s.no_repeat_ngram

        def followers(w: torch.Tensor) -> torch.Tensor:
            if self._one_row(w) and w.shape[1] >= n:
                return self.kernel.repeat_followers(w, n)
            return repeat_followers(w, n)
        return self._remembered("no-repeat", windows[:, -REPEAT_RANGE:], followers)

    def _dry(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DRY's followers and amounts of the rows' windows (dry_xtc.py)."""
        s = self.s

        def amounts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            lengths = None
            if self._one_row(w) and w.shape[1] >= 2:
                lengths = self.kernel.dry_lengths(w, self.breakers, match_limit(w.shape[1], s.dry_allowed_length))
            return dry_amounts(w, self.breakers, s.dry_multiplier, s.dry_base, s.dry_allowed_length, lengths)
        return self._remembered("dry", windows[:, -s.dry_range:], amounts)

    def _one_row(self, window: torch.Tensor) -> bool:
        return self.kernel is not None and window.shape[0] == 1 and window.device.type == "cpu"

    def _remembered(self, kind: str, window: torch.Tensor, compute: Callable[[torch.Tensor], Any]) -> Any:
        """compute(window), kept for the last few one-row windows seen on a CPU. A drafter ranks each guess with the
        very history the target's row for it then samples with: the same DRY repeats and no-repeat followers, which
        took 0.5-1 ms of torch operators a row, worked out once instead of twice (the same function of the same
        ids, so the same values). A GPU's rows run in captured graphs and batches: not there."""
        if window.shape[0] != 1 or window.device.type != "cpu":
            return compute(window)
        key = (kind, window.numpy().tobytes())
        if key not in self._memo:
            if len(self._memo) >= REMEMBERED:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = compute(window)
        return self._memo[key]

    def _cols(self, ids: torch.Tensor, vocab: torch.Tensor | None, width: int) -> torch.Tensor:
        """The columns of token ids (-1: none) in rows of `width` columns over `vocab` (None: the whole vocabulary);
        `width`, the spare column, for padding and for tokens outside vocab."""
        if vocab is None:
            return torch.where(ids >= 0, ids, width)
        columns = self._columns.get(vocab.data_ptr())
        if columns is None:
            columns = torch.full((self.vocab_size + 1,), width, dtype=torch.int64, device=vocab.device)
            columns[vocab] = torch.arange(width, device=vocab.device)
            self._columns[vocab.data_ptr()] = columns
        return columns[torch.where(ids >= 0, ids, self.vocab_size)]

    def process(self, logits: torch.Tensor, windows: torch.Tensor | None, vocab: torch.Tensor | None = None,
                positions: list[int] | torch.Tensor | None = None) -> torch.Tensor:
        """Penalty, DRY, temperature, filters and XTC: [R, V] scores, -inf where a token may not be chosen.
        positions: each row's absolute position (XTC's draw is keyed by it)."""
        s = self.s
        if self.kernel is not None and RowKernel.runs(logits) and not torch.is_tensor(positions):
            scores = self._kernel_rows(logits, windows, positions, vocab)
            if scores is not None:
                return scores
        z = self.penalize(logits, windows, vocab)
        if self.bans and positions is not None:
            z = self.ban(z, positions, vocab)
        if s.temperature == 0:
            return z
        z = z / s.temperature
        if s.top_n_sigma:  # llama.cpp's place: after the penalties and DRY, before the truncations
            z = top_n_sigma_filter(z, s.top_n_sigma)
        if s.top_k:
            z = top_k_filter(z, s.top_k)
        if s.top_p < 1.0:
            z = top_p_filter(z, s.top_p, s.min_keep)
        if s.min_p > 0:
            z = min_p_filter(z, s.min_p, s.min_keep)
        if s.eta > 0:
            z = eta_filter(z, s.eta, s.min_keep)
        if s.xtc_probability > 0 and positions is not None:
            z = xtc_filter(z, s.xtc_threshold, xtc_draws(s.seed, positions, z.device) < s.xtc_probability)
        return z

    def _kernel_rows(self, logits: torch.Tensor, windows: torch.Tensor | None, positions: list[int] | None,
                     vocab: torch.Tensor | None, penalized: bool = False) -> torch.Tensor | None:
        """process() (penalized: penalize()) by the C rows (row_kernel.py), row by row: None where a row holds a NaN
        or the end of text's probability moves to an answer's break (then the torch path runs)."""
        if self.eos is not None and self.answer_end is not None:
            return None
        out = torch.empty(logits.shape, dtype=torch.float32)
        eos = self._columns_of(self.eos[0], vocab, logits.shape[1]) if self.eos is not None else None
        for r in range(logits.shape[0]):
            window = windows[r:r + 1] if windows is not None else None
            rules = self._row_rules(window, positions[r] if positions is not None else None, vocab, logits.shape[1])
            if not self.kernel.row(logits[r], self.s, eos, *rules, out[r], penalized):
                return None
        return out

    def _row_rules(self, window: torch.Tensor | None, position: int | None, vocab: torch.Tensor | None,
                   width: int) -> tuple:
        """(the penalty's columns, the refused ones, DRY's columns and amounts) of one row, as penalize reads them;
        columns of `vocab` (the spare column `width` for tokens outside it), or token ids without one."""
        s, cols = self.s, lambda ids: self._columns_of(ids, vocab, width)
        refused = [self._refused(window)[0]] if window is not None and s.no_repeat_ngram else []
        if position in self.ban_ids:
            refused.append(self.ban_ids[position])
        penalty, dry = None, None
        if window is not None and s.penalty != 1.0 and s.penalty_window > 0:
            penalty = cols(window[0, -s.penalty_window:])
        if window is not None and s.dry_multiplier > 0:
            followers, amounts = self._dry(window)
            dry = cols(followers[0]), amounts[0]
        return penalty, cols(torch.cat(refused)) if refused else None, dry

    def _columns_of(self, ids: torch.Tensor, vocab: torch.Tensor | None, width: int) -> torch.Tensor:
        """_cols for the C rows, which skip -1 and columns past the row themselves: the ids as they are without a
        draft vocabulary."""
        return ids if vocab is None else self._cols(ids, vocab, width)

    def ban(self, z: torch.Tensor, positions: list[int] | torch.Tensor,
            vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Scores with each row's banned tokens at -inf (rows at the positions `positions`)."""
        if not isinstance(positions, torch.Tensor):
            positions = torch.tensor(positions, dtype=torch.int64, device=z.device)
        for position, banned in self.bans.items():
            here = (positions == position)[:, None] & (banned if vocab is None else banned[vocab])[None, :]
            z = z.masked_fill(here, -math.inf)
        return z

    def choose(self, scores: torch.Tensor, positions: list[int] | torch.Tensor) -> torch.Tensor:
        """Tokens for rows of processed scores; positions[r] = absolute position of the token chosen.

        Positions as a device tensor keep every operation on the device with static shapes (no host sync): what
        a captured graph needs. One row with host positions draws noise for its finite scores only."""
        if self.noise is None:
            return scores.argmax(dim=-1)
        if scores.shape[0] != 1 or isinstance(positions, torch.Tensor):
            return (scores.double() + self.noise.gumbel(positions)).argmax(dim=-1)
        ids, noisy = self.noisy(scores[0], positions[0])
        if len(ids) == 0:
            return scores.argmax(dim=-1)
        return ids[noisy.argmax()].view(1)

    def noisy(self, row: torch.Tensor, position: int,
              vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens one processed row leaves finite, and their scores plus the noise of `position` (float64).

        A filtered row leaves a few finite scores: noise is drawn for those tokens only. Candidates keep their
        vocabulary order, so the first of equal maxima wins as in the full row. vocab: the columns' token ids."""
        if self.kernel is not None and RowKernel.runs(row):
            columns = self.kernel.finite(row)
        else:  # two comparisons are isfinite (NaN fails both), cheaper on a CPU: 97-149 against 115-172 µs a 49K row
            columns = ((row > -math.inf) & (row < math.inf)).nonzero().squeeze(1)
        ids = columns if vocab is None else vocab[columns]
        return ids, row[columns].double() + self.noise.gumbel([position], ids)[0]

    def sample(self, logits: torch.Tensor, windows: torch.Tensor | None,
               positions: list[int] | torch.Tensor) -> torch.Tensor:
        return self.choose(self.process(logits, windows, positions=positions), positions)

    def draw(self, logits: torch.Tensor, window: torch.Tensor | None,
             position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's token at story position `position` from one row of logits, and the scores it was drawn from;
        with Adaptive-P on, steered by the history and moving it on (drafters' proposals use sample, not this)."""
        scores = self.process(logits, window, positions=[position])
        if self.adaptive is None:
            return self.choose(scores, [position]), scores
        scores, probs = steered(scores, self.adaptive.adjusted(position))
        token = self.choose(scores, [position])
        self.adaptive.chose(position, float(probs[0, token[0]]))
        return token, scores

    def alternatives(self, scores: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """alternatives.top_rows of a row drawn from `scores` [1, V] (draw's), over its finite scores on a CPU."""
        if self.kernel is not None and RowKernel.runs(scores):
            columns = self.kernel.finite(scores[0])
            if len(columns):
                return top_row_of(scores[0, columns], columns, int(token[0]))
        return top_rows(scores, token)

    def recall(self, logits: torch.Tensor, window: torch.Tensor | None, position: int, token: int) -> None:
        """Adaptive-P's history after `token` was chosen at `position` from these logits (a resume's replayed rows)."""
        _, probs = steered(self.process(logits, window, positions=[position]), self.adaptive.adjusted(position))
        self.adaptive.chose(position, float(probs[0, token]))
