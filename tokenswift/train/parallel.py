"""Data parallelism for head training: accelerate only when launched by it."""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from tokenswift.model.heads import DraftHeads


class Parallel:
    """Data parallelism under `accelerate launch` (WORLD_SIZE > 1): heads wrapped in DDP, each process
    reads its own stride of the data stream. On one device it does nothing, and accelerate is not imported."""

    def __init__(self, device: str):
        self.acc = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.acc = Accelerator(cpu=device == "cpu")
        self.rank = self.acc.process_index if self.acc else 0
        self.world = self.acc.num_processes if self.acc else 1
        self.device = str(self.acc.device) if self.acc else device

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wrap(self, heads: DraftHeads) -> torch.nn.Module:
        return self.acc.prepare_model(heads) if self.acc else heads

    def no_sync(self, model: torch.nn.Module, skip: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        return model.no_sync() if self.acc and skip else nullcontext()

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.acc.reduce(t, "mean") if self.acc else t

    def barrier(self) -> None:
        if self.acc:
            self.acc.wait_for_everyone()
