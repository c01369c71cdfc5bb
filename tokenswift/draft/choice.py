"""Which drafter a run drafts with: the one place where the writer's choice meets the model, shared by the checks
before a run (decode/generate.validate), the worker, the engine and the bench.

The choices (settings.DRAFTERS): the one-pass drafter (fused_drafter.py), the paper's two passes (drafting.py), the
draft layer (layer_drafter.py), a draft model (model_drafter.py), or auto. Which one drafts changes speed only,
never the text, so a missing one is refused by name rather than replaced in silence, but where the worker's job
was queued for a draft layer that no longer loads (fallback).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenswift.settings import Settings, SettingsError

if TYPE_CHECKING:
    from tokenswift.model.loading import LoadedModel


def drafter_for(lm: LoadedModel, settings: Settings, *, fallback: bool = False) -> str:
    """The drafter a run of `settings` drafts with on `lm`. auto: the draft model where one was given (the writer
    chose it for this model); the draft layer on a CPU where the model has one (there, a verify pass costs nearly
    its rows in compute, so only drafts the model agrees with pay: the layer's are right about three times as often
    as the heads'); else the fused drafter (on a GPU a wide tree verifies nearly free).
    SettingsError naming `drafter` where TokenSwift is asked for a drafter the model lacks; fallback: the fused
    drafter instead of a missing draft layer. Plain decoding drafts nothing: its choice is only resolved."""
    drafter = settings.drafter
    if drafter == "auto":
        on_cpu_layer = lm.draft_layer is not None and lm.device.type == "cpu"
        drafter = "model" if lm.draft_model is not None else "layer" if on_cpu_layer else "fused"
    if settings.mode != "tokenswift":
        return drafter
    if drafter == "layer" and lm.draft_layer is None:
        if fallback:
            return "fused"
        raise SettingsError("drafter", "this model has no draft layer (train one with `tokenswift train-draft`, "
                                       "or choose the fused or paper drafter)")
    if drafter == "model" and lm.draft_model is None:
        raise SettingsError("drafter", "no draft model is loaded (give one with --draft-model, or choose another "
                                       "drafter)")
    return drafter
