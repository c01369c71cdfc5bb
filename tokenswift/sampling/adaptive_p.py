"""Adaptive-P: steer each chosen token's probability toward a target, with a decaying history of what was chosen.

Definition (llama.cpp PR 17927, as its author documents the reference implementation; the same in KoboldCpp and
SillyTavern). For the row at one position:

1. p = softmax(z), z the row's processed scores (Sampler.process: the whole chain, so tokens another rule removed
   have p = 0 and stay removed): the *original* probabilities.
2. The history is an exponentially decayed average of the original probabilities of the tokens chosen before:
   S ← p_chosen + decay·S and W ← 1 + decay·W after each choice, primed at S = target/(1 − decay),
   W = 1/(1 − decay) (as if the target had always been met, so the first tokens are steered like the rest).
3. The adjusted target is a = clamp(2·target − S/W, 0, 1): a run of likelier tokens than the target aims lower.
4. Each remaining token's score becomes PEAK − SHARPNESS·d²/(1 + d) with d = |p_i − a| / WIDTH (quadratic near
   the target, linear far from it, so a crowd of unlikely tokens never gathers weight), and the token is drawn from
   those scores with the position's noise (sampler.py: Gumbel-max, i.e. from their softmax).

The history is the one state in the sampler, and it is a function of the text: it starts afresh where the window
that predicts the position was built (the run's start, a context shift, a World Info rebuild: decode/window's
`at`), and holds the probabilities of the tokens chosen at the positions since, keyed by position. Plain steps
append theirs; a verify walk samples its nodes root first down the one path it takes, so each node's history is
the committed one plus its ancestors' choices, exactly what plain decoding has there; a resume recomputes the
probabilities at the replayed positions from rows that equal the steps' bit for bit (prefill.py). Arithmetic on
host float64 in one order everywhere, so every route computes the same numbers.
"""

from __future__ import annotations

import math

import torch

PEAK, SHARPNESS, WIDTH = 5.0, 10.0, 0.3  # the reference implementation's constants (not user settings there)


def steered(scores: torch.Tensor, adjusted: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(new scores, original probabilities) for rows of processed scores and the adjusted target a."""
    probs = scores.double().softmax(dim=-1)
    d = (probs - adjusted).abs() / WIDTH
    return torch.where(torch.isfinite(scores), PEAK - SHARPNESS * d * d / (1 + d), -math.inf), probs


class AdaptiveP:
    """The history of one run's current window: (S, W) after each chosen token, from position `start` on."""

    def __init__(self, target: float, decay: float):
        self.target, self.decay = target, decay
        self.restart(0)

    def restart(self, start: int) -> None:
        """A window was built to predict story position `start`: the history starts again, primed."""
        self.start = start
        self.sums = [(self.target / (1 - self.decay), 1 / (1 - self.decay))]

    def adjusted(self, position: int) -> float:
        """a at `position`: from the choices at positions start .. position − 1."""
        i = position - self.start
        if not 0 <= i < len(self.sums):
            raise RuntimeError(f"Adaptive-P: no history for position {position} (window from {self.start}, "
                               f"{len(self.sums) - 1} choices)")
        weighted, weight = self.sums[i]
        return min(max(2 * self.target - weighted / weight, 0.0), 1.0)

    def chose(self, position: int, prob: float) -> None:
        """The token chosen at `position` had original probability `prob`. A position chosen again (a walk that
        resumes below a cut, a rewind) replaces what followed it."""
        del self.sums[position - self.start + 1:]
        weighted, weight = self.sums[-1]
        self.sums.append((prob + self.decay * weighted, 1 + self.decay * weight))

    def average(self) -> float:
        """The decayed average of the chosen tokens' probabilities so far (what the steering pulls to the target)."""
        weighted, weight = self.sums[-1]
        return weighted / weight
