"""What one decoding step costs the host: host synchronisations and fast-path pass calls (graph replays on CUDA),
counted on any device, so a test on a CPU sees a sync or a replay added to the CUDA code path (issue 48).

A host sync is every read of tensor data by the host (`.item()`, `.tolist()`, `int(t)`, `.cpu()`, ...: on CUDA
each waits for the queued work), every tensor made from host data straight on a device (from pageable memory
the copy waits too), and `torch.cuda.synchronize`. A replay is one call of a fastpath.Pass: on CUDA a captured
graph's replay (no Python between its kernels), elsewhere its eager `_compute`, the same code.
"""

from __future__ import annotations

import collections
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from tokenswift.model import fastpath

READS = frozenset({"item", "tolist", "__int__", "__bool__", "__float__", "__index__", "cpu", "numpy", "nonzero"})


@dataclass
class Counts:
    """Syncs by the file that asks (the first frame outside torch and outside `skip`), and pass calls."""

    skip: tuple[str, ...] = ()
    syncs: collections.Counter = field(default_factory=collections.Counter)
    replays: int = 0
    # torch calls made by the host outside passes, by name: each is at most one kernel launch on CUDA (a view none)
    outside: collections.Counter = field(default_factory=collections.Counter)
    # torch calls made inside passes, by name: an upper bound on the kernels a captured graph replays (views and
    # metadata calls launch none, fused kernels count once)
    inside: collections.Counter = field(default_factory=collections.Counter)
    in_pass: bool = False

    def add_sync(self) -> None:
        caller = next(f for f in traceback.extract_stack()[::-1]
                      if "/torch/" not in f.filename and f.filename != __file__
                      and not f.filename.endswith(self.skip))
        self.syncs[Path(caller.filename).name] += 1

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())


class _SyncMode(TorchFunctionMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or (name in ("tensor", "as_tensor") and kwargs.get("device") is not None):
            self.counts.add_sync()
        (self.counts.inside if self.counts.in_pass else self.counts.outside)[name] += 1
        return func(*args, **kwargs)


@contextmanager
def counting(skip: tuple[str, ...] = ()) -> Iterator[Counts]:
    """Count syncs and pass calls made inside the block. skip: file-name endings not to blame (a test's own)."""
    counts = Counts(skip)
    call, synchronize = fastpath.Pass.__call__, torch.cuda.synchronize

    def replay(p: fastpath.Pass) -> None:
        counts.replays += 1
        counts.in_pass = True
        try:
            call(p)  # a sync inside a pass is counted too: on CUDA it would fail the capture
        finally:
            counts.in_pass = False

    def sync(*args, **kwargs) -> None:
        counts.add_sync()
        synchronize(*args, **kwargs)

    mode = _SyncMode(counts)
    fastpath.Pass.__call__, torch.cuda.synchronize = replay, sync
    try:
        with mode:
            yield counts
    finally:
        fastpath.Pass.__call__, torch.cuda.synchronize = call, synchronize


def per_step(step: Callable[[], object], steps: int, skip: tuple[str, ...] = ()) -> dict:
    """Syncs and replays per call of `step` (an engine's ar_step or ts_step), over `steps` calls."""
    with counting(skip) as counts:
        for _ in range(steps):
            step()
    return {"syncs_per_iteration": counts.total_syncs / steps, "replays_per_iteration": counts.replays / steps,
            "syncs_by_file": {name: n / steps for name, n in sorted(counts.syncs.items())},
            "torch_calls_in_passes_per_iteration": sum(counts.inside.values()) / steps}
