"""Which drafter a run drafts with: the one place where the writer's choice meets the model, shared by the checks
before a run (decode/generate.validate), the worker, the engine and the bench.

The choices (Speculation.drafter, one of settings.DRAFTERS): the one-pass drafter (fused_drafter.py), the paper's two
passes (drafting.py), the draft layer (layer_drafter.py), a draft model (model_drafter.py), or auto. Which one drafts
changes speed only, never the text, so a missing one is refused by name rather than replaced in silence, but where
the worker's job was queued for a draft layer that no longer loads (fallback). Which of them a loaded model has, and
where a draft layer trained for it would be found: drafters(). Whether a draft model's tokens are the model's:
vocabulary_problem().
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenswift.model.default_model import DRAFT_SUBDIR, SHIPPED, shipped_draft
from tokenswift.model.gguf_checkpoint import source_record
from tokenswift.settings import SettingsError, Speculation

if TYPE_CHECKING:
    from tokenswift.model.loading import LoadedModel

# Texts whose ids both tokenizers must agree on: words, spaces, digits, punctuation, accents, a newline run.
PROBES = ("The old lighthouse keeper said: \"Well, 42 boats!\"\n\n  café — naïve", "<|im_start|>user\nHi")


def drafter_for(lm: LoadedModel, spec: Speculation, *, fallback: bool = False) -> str:
    """The drafter a run of `spec` drafts with on `lm`. auto: the draft model where one was given (the writer
    chose it for this model); the draft layer on a CPU where the model has one (there, a verify pass costs nearly
    its rows in compute, so only drafts the model agrees with pay: the layer's are right about three times as often
    as the heads'); else the fused drafter (on a GPU a wide tree verifies nearly free).
    SettingsError naming `drafter` where TokenSwift is asked for a drafter the model lacks; fallback: the fused
    drafter instead of a missing draft layer. Plain decoding drafts nothing: its choice is only resolved."""
    drafter = spec.drafter
    if drafter == "auto":
        on_cpu_layer = lm.draft_layer is not None and lm.device.type == "cpu"
        drafter = "model" if lm.draft_model is not None else "layer" if on_cpu_layer else "fused"
    if spec.mode != "tokenswift":
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


@dataclass(frozen=True)
class Drafters:
    """The drafters a loaded model has, as facts for the notices that name them (the worker's line, the Model tab)."""

    heads: int  # the draft heads' depth (gamma); 0: no heads
    layer_vocab: int | None  # the draft layer's draft vocabulary; None: no draft layer
    layer_problem: str | None  # why a draft layer found for the model could not be used
    draft_model: str | None  # the draft model's file or folder name; None: none chosen
    auto: str  # what the drafter "auto" drafts with here: layer, model, or fused (the heads, else n-grams alone)
    layer_home: str  # where a draft layer trained for this model is found when it loads (train-draft's --out)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Drafters:
        return cls(**json.loads(text))


def drafters(lm: LoadedModel) -> Drafters:
    """What `lm` drafts with. A draft layer is found beside a checkpoint folder (`<folder>/draft`); for a GGUF file,
    in the repository's models/ by the file's content hash wherever the file lies: the one shipped for it, else a new
    folder named for the file."""
    source = source_record(lm.path)
    if source is None:
        home = lm.path / DRAFT_SUBDIR
    else:
        home = shipped_draft(source["sha256"]) or SHIPPED / Path(source["file"]).stem.lower() / DRAFT_SUBDIR
    return Drafters(lm.heads.gamma if lm.heads is not None else 0,
                    len(lm.draft_layer.vocab) if lm.draft_layer is not None else None, lm.draft_error,
                    lm.draft_model.path.name if lm.draft_model is not None else None,
                    drafter_for(lm, Speculation()), str(home))


def vocabulary_problem(target_size: int, target_tokenizer, draft_size: int, draft_tokenizer) -> str | None:
    """Why the draft model's token ids (its config's vocabulary size, its tokenizer) do not mean the target's, or
    None: the same size, the same token for every id, and the same ids for the probe texts (the tokenizers split
    text alike). Tokenizers only: the Model tab checks a choice with them before any weights load."""
    if draft_size != target_size:
        return f"its vocabulary has {draft_size} tokens, the target's {target_size}"
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        return "its tokenizer's tokens differ from the target's"
    if any(draft_tokenizer(text).input_ids != target_tokenizer(text).input_ids for text in PROBES):
        return "its tokenizer splits text otherwise than the target's"
    return None
