"""A Hugging Face checkpoint's config.json and tokenizer, read without transformers' model registry.

Importing any of transformers' model packages (AutoConfig, LlamaConfig, AutoTokenizer) first indexes the
source of every architecture it ships: 3-4 s of CPU in each process that loads a model, more than loading
the weights of a small one. Our three families need a dozen numbers from config.json, read here over
the defaults of transformers' config classes (tests/test_hf_files.py checks every field we read against
those classes), and a tokenizer.json, which the tokenizers-backed class reads as AutoTokenizer would.
RoPE types other than the default and dynamic NTK still take transformers' own functions (rope.py), which
import its configs on demand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenswift.model.config import check_family

# transformers' defaults (LlamaConfig, MistralConfig, Qwen2Config) for the fields a config.json may omit.
_COMMON = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, head_dim=None,
               num_key_value_heads=None, rope_theta=10000.0)
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _COMMON | dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                            num_attention_heads=32, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "mistral": _COMMON | dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                              bos_token_id=1, eos_token_id=2, sliding_window=4096),
    "qwen2": _COMMON | dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                            num_attention_heads=32, max_position_embeddings=32768, bos_token_id=None,
                            eos_token_id=None, use_sliding_window=False, sliding_window=4096),
}
# RoPE types whose pretraining length transformers keeps among the rope parameters.
_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")


def is_hub_id(model: str) -> bool:
    """Whether a model name that is no local path reads as a hub id (org/name), as loading resolves one."""
    return model.count("/") == 1 and not model.startswith((".", "/", "~"))


class CheckpointConfig:
    """config.json over its family's defaults, with transformers' attribute names (hidden_size, rope_parameters,
    ...): what ModelConfig.from_hf, the RoPE table and the context limit read."""

    def __init__(self, raw: dict[str, Any]):
        family = check_family(raw.get("model_type"))
        self._raw = dict(raw)
        fields = FAMILY_DEFAULTS[family] | raw
        fields["head_dim"] = fields["head_dim"] or fields["hidden_size"] // fields["num_attention_heads"]
        fields["num_key_value_heads"] = fields["num_key_value_heads"] or fields["num_attention_heads"]
        fields["rope_parameters"] = _rope_parameters(fields)
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_fields"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, Any]:
        """config.json as read (what transformers' config class is built from, as its to_dict() gives)."""
        return dict(self._raw)


def _rope_parameters(fields: dict[str, Any]) -> dict[str, Any]:
    """transformers' standardize_rope_params: the legacy rope_scaling / rope_theta merged into one dict."""
    params = dict(fields.get("rope_parameters") or fields.get("rope_scaling") or {})
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", fields["rope_theta"])
    if params["rope_type"] in _ORIGINAL_LENGTH_TYPES:
        if "original_max_position_embeddings" in fields:
            params["original_max_position_embeddings"] = fields["original_max_position_embeddings"]
        else:
            params.setdefault("original_max_position_embeddings", fields["max_position_embeddings"])
    return params


def read_config(path: Path) -> CheckpointConfig:
    """The checkpoint directory's config.json; OSError or ValueError (json, unsupported model) name the file."""
    return CheckpointConfig(json.loads((path / "config.json").read_text()))


def context_limit(hf) -> int:
    """Positions the model was trained or scaled for: rope scaling factors extend the original window."""
    params = getattr(hf, "rope_parameters", None) or {}
    limit = hf.max_position_embeddings
    if params.get("rope_type") in ("linear", "dynamic", "yarn") and "factor" in params:
        original = params.get("original_max_position_embeddings") or hf.max_position_embeddings
        limit = max(limit, int(original * params["factor"]))
    return limit


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer: tokenizer.json (and tokenizer_config.json's special tokens and chat template)
    through transformers' tokenizers-backed class, as AutoTokenizer reads it; a checkpoint with only a
    SentencePiece model goes through AutoTokenizer, which converts it."""
    if (path / "tokenizer.json").is_file():
        from transformers.tokenization_utils_tokenizers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
