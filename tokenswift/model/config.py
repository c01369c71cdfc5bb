"""Model configuration: the few numbers our decoder needs, read from a checkpoint's config.json.

Nothing is guessed from folder names: `from_hf` reads a transformers config object, and unsupported
architectures are rejected with the list of supported ones.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


class UnsupportedModelError(ValueError):
    pass


def check_family(family: object) -> str:
    """config.json's model_type, if we support it; else UnsupportedModelError listing the ones we do."""
    if family not in SUPPORTED:
        names = ", ".join(f"{k} ({v})" for k, v in SUPPORTED.items())
        raise UnsupportedModelError(f"unsupported model type {family!r}; supported: {names}")
    return family


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llama", "mistral" or "qwen2"
    vocab_size: int
    dim: int  # hidden size
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA when fewer than n_heads)
    head_dim: int
    intermediate_size: int  # SwiGLU hidden size
    norm_eps: float
    qkv_bias: bool  # Qwen2 has biases on q/k/v
    tie_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None  # Mistral-style local attention; None = full attention
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def parameters(self) -> int:
        """The weights' count: embeddings (and an untied LM head), attention, SwiGLU and norms."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.qkv_bias else 0
        layer = self.dim * (2 * q + 2 * kv) + bias + 3 * self.dim * self.intermediate_size + 2 * self.dim
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.vocab_size * self.dim + head + self.n_layers * layer + self.dim

    @classmethod
    def from_hf(cls, hf) -> ModelConfig:
        family = check_family(getattr(hf, "model_type", None))
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        window = getattr(hf, "sliding_window", None)
        if family == "qwen2" and not getattr(hf, "use_sliding_window", False):
            window = None
        eos = hf.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            family=family,
            vocab_size=hf.vocab_size,
            dim=hf.hidden_size,
            n_layers=hf.num_hidden_layers,
            n_heads=hf.num_attention_heads,
            n_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=head_dim,
            intermediate_size=hf.intermediate_size,
            norm_eps=hf.rms_norm_eps,
            qkv_bias=family == "qwen2" or bool(getattr(hf, "attention_bias", False)),
            tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            max_position_embeddings=hf.max_position_embeddings,
            sliding_window=window,
            bos_token_id=hf.bos_token_id,
            eos_token_ids=eos_ids,
        )
