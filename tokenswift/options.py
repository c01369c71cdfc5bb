"""How an engine runs, never what it writes: passed explicitly to Engine and Generator.

Every option here changes speed only; the text is the same with any of them (design §3).
"""

from __future__ import annotations

from dataclasses import dataclass

from .fastpath import FastOptions


@dataclass(frozen=True)
class EngineOptions:
    fast: FastOptions | None = None  # the static-shape passes, captured as CUDA graphs on a GPU (fastpath.py)
    adaptive: bool = False  # pick the candidate batch per iteration from measured costs (adaptive.py)
    pad_verify: bool | None = None  # pad verify batches to a fixed size; None: on CUDA (always on the fast path)


def device_defaults(lm, adaptive: bool = True, fast: bool = True) -> EngineOptions:
    """What the app's worker runs with: the adaptive batch, and on a CUDA device the fast path (graphs), which
    does not implement sliding-window attention (Mistral's window keeps the eager passes)."""
    use_fast = fast and lm.device.type == "cuda" and lm.config.sliding_window is None
    return EngineOptions(fast=FastOptions() if use_fast else None, adaptive=adaptive)
