"""The sampler's float32 rows on a CPU in C (sample_rows.c): the same scores and tokens as sampler.py's torch
operators, for about a third of their time (a row drawn with the writing defaults: 0.9 ms -> 0.3 ms).

The engine's C kernels are built by tokenswift.model.native, which lists this file's source with its own; the
Sampler is handed the library (RowKernel) by whoever builds it with a model (decode/engine.py), so this package does
not import the model's. Without a compiler, and for any row or rule the kernel does not cover (a float64 row, a GPU,
top-k/top-p/η/top-nσ/XTC, min-p keeping more than one token, a temperature or penalty that is 0 in float32, an
answer's end-of-text break, a NaN), the torch path runs.
"""

from __future__ import annotations

import ctypes
import math

import torch

from tokenswift.settings import Settings


class RowRules(ctypes.Structure):
    """sample_rows.c's struct row_rules, field for field."""

    _fields_ = [("eos", ctypes.c_void_p), ("n_eos", ctypes.c_int64),
                ("window", ctypes.c_void_p), ("n_window", ctypes.c_int64), ("theta", ctypes.c_float),
                ("refused", ctypes.c_void_p), ("n_refused", ctypes.c_int64),
                ("dry", ctypes.c_void_p), ("amounts", ctypes.c_void_p), ("n_dry", ctypes.c_int64),
                ("temperature", ctypes.c_float), ("log_min_p", ctypes.c_float)]


def covers(s: Settings) -> bool:
    """Whether the kernel runs every rule of `s` (else the torch path runs them all). A temperature that rounds to
    0 in float32 is greedy to the kernel but a division by zero to torch: torch's."""
    tiny = ctypes.c_float(s.temperature).value == 0 < s.temperature or ctypes.c_float(s.penalty).value == 0
    return (s.top_k == 0 and s.top_p >= 1.0 and s.eta == 0 and not s.top_n_sigma and s.xtc_probability == 0
            and (s.min_p == 0 or s.min_keep == 1) and not tiny)


def _ids(t: torch.Tensor | None) -> tuple[int, int]:
    """(address, length) of a contiguous int64 CPU tensor, (0, 0) for None."""
    if t is None or t.numel() == 0:
        return 0, 0
    return t.data_ptr(), t.numel()


class RowKernel:
    """sample_rows.c's functions on torch tensors (float32 and int64 on the CPU, contiguous)."""

    def __init__(self, lib: ctypes.CDLL, vocab_size: int):
        self.lib = lib
        self.seen = torch.zeros(vocab_size, dtype=torch.uint8)  # sample_row's scratch, left zero by it
        self.columns = torch.empty(vocab_size, dtype=torch.int64)

    @staticmethod
    def runs(logits: torch.Tensor) -> bool:
        return logits.dtype == torch.float32 and logits.device.type == "cpu"

    def row(self, logits: torch.Tensor, s: Settings, eos: torch.Tensor | None, window: torch.Tensor | None,
            refused: torch.Tensor | None, dry: tuple[torch.Tensor, torch.Tensor] | None,
            out: torch.Tensor, penalized: bool = False) -> bool:
        """out [V] = Sampler.process of one row [V] (penalized: Sampler.penalize's, the rules without temperature and
        filters); False (out undefined) where the row holds a NaN."""
        self._fits(logits, out)
        logits = logits.contiguous()
        followers, amounts = (dry[0].contiguous(), dry[1].contiguous()) if dry is not None else (None, None)
        if amounts is not None and amounts.dtype != torch.float64:
            raise ValueError("row kernel: DRY's amounts are float64 (dry_xtc.dry_amounts)")
        window = window.contiguous() if window is not None else None
        refused = refused.contiguous() if refused is not None else None
        rules = RowRules(*_ids(eos), *_ids(window), s.penalty if window is not None else 1.0, *_ids(refused),
                         followers.data_ptr() if followers is not None else 0,
                         amounts.data_ptr() if amounts is not None else 0,
                         followers.numel() if followers is not None else 0, 0.0 if penalized else s.temperature,
                         math.log(s.min_p) if s.min_p > 0 and s.temperature > 0 and not penalized else -math.inf)
        before = torch.empty(max(1, rules.n_dry), dtype=torch.float32)
        return self.lib.sample_row(logits.data_ptr(), logits.shape[-1], ctypes.addressof(rules),
                                   self.seen.data_ptr(), before.data_ptr(), out.data_ptr()) == 0

    def finite(self, row: torch.Tensor) -> torch.Tensor:
        """The columns of a processed row [V] whose scores are finite, in order."""
        self._fits(row)
        row = row.contiguous()
        n = self.lib.finite_columns(row.data_ptr(), row.shape[0], self.columns.data_ptr())
        return self.columns[:n].clone()

    def _fits(self, *rows: torch.Tensor) -> None:
        """The scratch rows are the vocabulary's width; a wider row or another dtype would be read out of bounds."""
        for row in rows:
            if row.dtype != torch.float32 or row.dim() != 1 or row.shape[0] > self.seen.shape[0]:
                raise ValueError(f"row kernel: a float32 row of at most {self.seen.shape[0]} scores, not {row.shape}")
        if len(rows) == 2 and not rows[1].is_contiguous():
            raise ValueError("row kernel: the output row must be contiguous")

    def uniforms(self, token_mix: torch.Tensor, ids: torch.Tensor, key: int) -> torch.Tensor:
        """sampler.Noise's uniform draws [len(ids)] (float64) of the token ids `ids` at the position keyed `key`."""
        ids = ids.contiguous()
        u = torch.empty(ids.shape[0], dtype=torch.float64)
        self.lib.noise_uniforms(token_mix.data_ptr(), ids.data_ptr(), ids.shape[0], key, u.data_ptr())
        return u

    def dry_lengths(self, window: torch.Tensor, breakers: torch.Tensor, limit: int) -> torch.Tensor:
        """dry_xtc.match_lengths of one window [1, n]: [1, n - 1]."""
        window = window.contiguous()
        n = window.shape[1]
        length = torch.empty(1, n - 1, dtype=torch.int64)
        self.lib.dry_lengths(window.data_ptr(), n, breakers.data_ptr(), breakers.shape[0], limit, length.data_ptr())
        return length

    def repeat_followers(self, window: torch.Tensor, n: int) -> torch.Tensor:
        """no_repeat.repeat_followers of one window [1, W] with W >= n."""
        window = window.contiguous()
        out = torch.empty(1, window.shape[1] - n + 1, dtype=torch.int64)
        self.lib.repeat_followers_row(window.data_ptr(), window.shape[1], n, out.data_ptr())
        return out
