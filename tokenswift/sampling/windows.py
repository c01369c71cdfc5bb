"""Sampling windows: the tokens before a row's position that the penalty, DRY and the no-repeat rule read (the
last `history_length` of the text, and a trie node's own path), -1 where the text is shorter. The engine's host walk,
the drafters and the captured passes all window their rows here, so each row is processed as plain decoding would."""

from __future__ import annotations

import torch


def last_ids(ids: torch.Tensor, end: int | torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The sampling history before slot `end` (a host int, or a device scalar in a captured graph): the last W ids,
    -1 where the text is shorter. offsets: arange(W) on the ids' device."""
    idx = end - offsets.shape[0] + offsets
    return torch.where(idx >= 0, ids[idx.clamp(min=0)], -1)


def node_windows(history: torch.Tensor, paths: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """[rows, W] sampling windows (the penalty's, DRY's) of trie nodes: row i is the last W tokens of history + path_i,
    i.e. cat(history, path_i)[d_i : d_i + W] with d_i its depth; paths [rows, >= d_i] left-aligned, -1 = no token.
    The engine's host walk and the captured verify pass both window their nodes here."""
    rows, w = paths.shape[0], history.shape[0]
    both = torch.cat((history.expand(rows, w), paths), dim=1)
    return both.gather(1, depths[:, None] + torch.arange(w, device=history.device)[None, :])


def history_row(ids: torch.Tensor, end: int, length: int, path: list[int]) -> torch.Tensor | None:
    """The sampling history (the penalty's last W = `length` tokens, DRY's range) of ids[:end] + path, as a [1, W]
    row; None where no sampler reads one (length 0)."""
    if length == 0:
        return None
    dev = ids.device
    if end > ids.shape[0]:
        raise IndexError(f"history_row: the text ends at {end}, past its {ids.shape[0]} slots")
    start = end + len(path) - length  # the window's first token, as an index into ids[:end] + path
    if start <= end:  # a slice of the text, padded and followed by the path (last_ids and node_windows: ~0.1 ms)
        parts = [ids[max(start, 0):end]]
        if start < 0:
            parts.insert(0, torch.full((-start,), -1, dtype=ids.dtype, device=dev))
        if path:
            parts.append(torch.tensor(path, dtype=ids.dtype, device=dev))
        return torch.cat(parts)[None]
    history = last_ids(ids, end, torch.arange(length, device=dev))
    if not path:
        return history[None]
    return node_windows(history, torch.tensor([path], device=dev), torch.tensor([len(path)], device=dev))
