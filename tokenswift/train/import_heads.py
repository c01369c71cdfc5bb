"""Import the draft heads of an official TokenSwift checkpoint: `import-heads --from CHECKPOINT_DIR --out DIR`."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenswift.model.config import ModelConfig
from tokenswift.model.heads import OFFICIAL_PREFIX, DraftHeads, HeadsError, heads_from_state_dict, save_heads
from tokenswift.model.hf_files import read_config
from tokenswift.model.loading import read_state_dict


@dataclass
class ImportConfig:
    source: str  # an official TokenSwift checkpoint directory (model.medusa_layers.{j}.* tensors)
    out: str  # our heads directory


def official_head_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Only the `model.medusa_layers.*` tensors. From safetensors files we read just those keys (a 32B
    checkpoint's other 60 GB stay on disk); .bin checkpoints go through read_state_dict."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted({f for k, f in json.loads(index.read_text())["weight_map"].items()
                        if k.startswith(OFFICIAL_PREFIX)})
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        return {k: v for k, v in read_state_dict(path).items() if k.startswith(OFFICIAL_PREFIX)}
    found = {}
    for name in files:
        with safe_open(str(path / name), "pt") as f:
            found |= {k: f.get_tensor(k) for k in f.keys() if k.startswith(OFFICIAL_PREFIX)}  # noqa: SIM118
    return found


def import_heads(cfg: ImportConfig) -> DraftHeads:
    path = Path(cfg.source)
    if not (path / "config.json").is_file():
        raise HeadsError(f"{path} has no config.json: not a checkpoint directory")
    try:  # the heads' width and norm epsilon are the model's
        model_cfg = ModelConfig.from_hf(read_config(path))
    except Exception as error:  # noqa: BLE001 - name the file that failed
        raise HeadsError(f"cannot read {path / 'config.json'}: {error}") from error
    heads = heads_from_state_dict(official_head_tensors(path), model_cfg)
    if heads is None:
        raise HeadsError(f"{path} holds no draft heads: no {OFFICIAL_PREFIX}* tensors")
    record = {"imported_from": str(path), "format": "TokenSwift model.medusa_layers"}
    save_heads(heads, Path(cfg.out), record=record)
    return heads


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """import-heads"""
    parser.add_argument("--from", dest="source", required=True, metavar="CHECKPOINT_DIR",
                        help="an official TokenSwift checkpoint (model.medusa_layers.* tensors)")
    parser.add_argument("--out", required=True, help="heads directory to write")


def run_import(args: argparse.Namespace) -> int:
    heads = import_heads(ImportConfig(args.source, args.out))
    print(f"imported {heads.gamma} heads (dim {heads.dim}) from {args.source} to {args.out}")
    return 0
