"""DRY and XTC, the repetition and cliché controls writers set in KoboldCpp and llama.cpp, as row-wise functions.

DRY ("don't repeat yourself"): when the token about to be written would extend a sequence that already occurred
in the last `range` tokens by a match of length L >= allowed_length, that token's logit is lowered by
multiplier · base^(L − allowed_length). A match never runs across a sequence breaker (a token whose text
contains one of the breaker strings: a newline, a colon, a quote, an asterisk by default).

XTC ("exclude top choices"): with probability p, when two or more tokens have probability >= threshold, every
one of them but the least likely is removed. Its draw is keyed by (seed, absolute position), like the sampling
noise (sampler.py): plain decoding and every trie node at that position draw the same, so TokenSwift stays
exactly lossless with it on.

Both read only a row's own history (the window the engine builds for each trie node) and its position, so a
node of the verification trie is processed exactly as plain decoding processes that position.
"""

from __future__ import annotations

import math

import torch

from tokenswift.sampling.keys import M32, mix32, position_keys, uniform

MAX_EXPONENT = 40  # base^(L - allowed) beyond this is a ban anyway; capped so the penalty stays finite
XTC_SALT = 0x3C6EF372


def breaker_ids(token_texts: tuple[str, ...], breakers: tuple[str, ...]) -> torch.Tensor:
    """[vocab] bool: tokens whose text contains a sequence breaker (token_texts: LoadedModel.token_texts)."""
    return torch.tensor([any(b in text for b in breakers) for text in token_texts], dtype=torch.bool)


def match_limit(n: int, allowed: int) -> int:
    """How many tokens of a window's end a match compares: one longer than allowed + MAX_EXPONENT gets the same
    (capped) penalty, so the cost grows with the range, not with its square."""
    return min(n, allowed + MAX_EXPONENT + 1)


def match_lengths(rev: torch.Tensor, breakers: torch.Tensor, allowed: int) -> torch.Tensor:
    """[R, n-1]: for each shift s = 1..n-1 of the reversed windows rev [R, n], the number of leading k with
    rev[k] == rev[k + s] (no breaker, no padding). row_kernel.py's dry_lengths is this for one row on a CPU."""
    n = rev.shape[1]
    ok = (rev >= 0) & ~breakers[rev.clamp_min(0)]
    k = torch.arange(match_limit(n, allowed), device=rev.device)
    s = torch.arange(1, n, device=rev.device)
    idx = k[None, :] + s[:, None]  # [n-1, K]
    inside = idx < n
    shifted = rev[:, idx.clamp(max=n - 1)]  # [R, n-1, K]
    match = (rev[:, None, :len(k)] == shifted) & inside[None] & ok[:, None, :len(k)]
    return match.to(torch.int64).cumprod(-1).sum(-1)


def dry_amounts(windows: torch.Tensor, breakers: torch.Tensor, multiplier: float, base: float,
                allowed: int, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(followers [R, n-1] token ids, -1 = none; amounts [R, n-1] float64): each follower's logit is lowered by the
    largest amount it has (the sampler subtracts it). windows: [R, n] token ids, oldest first, -1 = no token;
    lengths: their match_lengths where already known.

    Reversed, row r reads rev[0] = the last token. For each shift s, the match length is the number of leading
    k with rev[k] == rev[k + s] (no breaker, no padding): the tokens before position n-s repeat the text's
    end that far, so rev[s - 1], the token that followed them, would extend the repeat to L + 1."""
    rows, n = windows.shape
    if n < 2:
        return windows[:, :0], torch.zeros(rows, 0, dtype=torch.float64, device=windows.device)
    rev = windows.flip(1)
    length = match_lengths(rev, breakers, allowed) if lengths is None else lengths  # [R, n-1]
    follower = rev[:, :n - 1]  # rev[s - 1], s = 1..n-1
    exponent = (length - allowed).clamp(max=MAX_EXPONENT).to(torch.float64)
    amount = torch.where((length >= allowed) & (follower >= 0), multiplier * base ** exponent, 0.0)
    return torch.where(amount > 0, follower, -1), amount


def xtc_draws(seed: int, positions: list[int] | torch.Tensor, device) -> torch.Tensor:
    """[R] uniform draws in (0, 1), one per absolute position: XTC acts at a position when its draw < p."""
    keys = position_keys(seed, positions, device)
    return uniform(mix32((mix32(keys ^ XTC_SALT) + XTC_SALT) & M32))


def xtc_filter(scores: torch.Tensor, threshold: float, act: torch.Tensor) -> torch.Tensor:
    """Rows where `act`: with two or more tokens at probability >= threshold, keep only the least likely of them."""
    probs = scores.softmax(dim=-1)
    top = probs >= threshold
    enough = top.sum(-1, keepdim=True) >= 2
    least = torch.where(top, probs, math.inf).argmin(-1, keepdim=True)
    remove = top.scatter(-1, least, False) & enough & act[:, None]
    return scores.masked_fill(remove, -math.inf)
