"""The drafter object a TokenSwift run drafts with, made from the name draft/choice.py resolved: each drafter's
construction in one place, with what it needs from the engine (its sampler, the token buffer a draft model reads,
the fast path's passes the paper drafter drafts in and the fused drafter's proposals come from)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenswift.draft import drafting
from tokenswift.draft.device_drafts import DeviceDrafts
from tokenswift.draft.drafting import Drafter, HeadsDrafter
from tokenswift.draft.fused_drafter import FusedDrafter
from tokenswift.draft.layer_drafter import LayerDrafter, draft_window
from tokenswift.draft.model_drafter import ModelDrafter
from tokenswift.model.fastpath import FastPasses
from tokenswift.model.forward import ForwardOut
from tokenswift.model.loading import LoadedModel
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Speculation


@dataclass(frozen=True)
class DraftNeeds:
    """What a drafter needs from the engine's passes, known before it is built (the engine sizes its passes and its
    prefill by it): the outputs of these layers beside the last one's, the states of the last `states` rows of every
    prefill, the queries of each layer (the paper drafter's partial cache selects by them)."""
    feature_layers: tuple[int, ...] = ()
    states: int = 1
    queries: bool = False

    def rows(self, out: ForwardOut) -> torch.Tensor:
        """A pass's rows for the drafter: the last layer's states [T, dim], or with a fused-feature draft layer the
        outputs of its layers and the last one's side by side [T, (k+1)·dim]."""
        return torch.cat([*out.layers, out.hidden], dim=-1) if self.feature_layers else out.hidden


def draft_needs(lm: LoadedModel, mode: str, drafter: str) -> DraftNeeds:
    """The needs of `drafter` (resolved: drafter_for); plain decoding (mode "ar") needs nothing."""
    if mode != "tokenswift":
        return DraftNeeds()
    if drafter == "layer":  # the layer drafter starts from its window of states
        return DraftNeeds(lm.draft_layer.feature_layers, draft_window(lm.draft_layer))
    return DraftNeeds(queries=drafter == "paper")


def build_drafter(lm: LoadedModel, spec: Speculation, drafter: str, sampler: Sampler, buf: torch.Tensor,
                  prompt_len: int, fast: FastPasses | None) -> Drafter:
    """The `drafter` (resolved from spec.drafter: drafter_for) of a run of `spec`. buf: the engine's token buffer
    (slot = position), whose length is the cache's capacity."""
    capacity = buf.shape[0]
    if drafter == "fused":  # reads the states the passes already computed: no pass of its own
        fused = FusedDrafter(lm, spec, sampler)
        # Where one host read per iteration beats drafting on the host (drafting.ONE_READ_DEVICES), the fast path's
        # sampling passes make its next proposals too (device_drafts.py).
        if fast is not None and fused.widths and lm.device.type in drafting.ONE_READ_DEVICES:
            fast.drafts = DeviceDrafts(fused, fast.draw)
        return fused
    if drafter == "layer":
        return LayerDrafter(lm, spec, sampler, capacity)
    if drafter == "model":  # reads the committed tokens from the buffer, slot by slot
        return ModelDrafter(lm, spec, sampler, buf, capacity)
    return HeadsDrafter(lm, spec, sampler, default_budget(spec, prompt_len), fast)


def default_budget(spec: Speculation, prompt_len: int) -> int:
    """The paper drafter's partial cache: the writer's budget, else the prompt's length within 256..4096."""
    if spec.budget is not None:
        return spec.budget
    return max(256, min(prompt_len, 4096), spec.sinks + 8)
