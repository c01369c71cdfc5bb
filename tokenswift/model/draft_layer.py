"""The draft layer: one decoder layer over the model's own features that drafts token by token (EAGLE-style).

The heads (heads.py) guess tokens two and more places ahead from one state without knowing the tokens in
between; in fiction those guesses are mostly wrong. The draft layer runs autoregressively instead. At a
position p it reads the model's last-layer state h_p and the embedding of the token at p+1, and predicts the
model's state at p+1; the model's own (frozen) final norm and LM head turn that into the distribution of the
token at p+2. Drafting a chain feeds its own predicted state and the token it just chose back in:

    z_p     = fc([h_p ; RMSNorm(embed(x_{p+1}))])          (2·dim -> dim)
    s_{p+1} = Block(z_p)                                    (attention over earlier z within `window` tokens)
    logits  = LMHead_vocab(RMSNorm(s_{p+1}))                (the model's LM-head rows of the draft vocabulary)

With `feature_layers` (EAGLE-3's fused features) h_p is instead feature_proj([the outputs of those layers at p ;
h_p]) ((k+1)·dim -> dim): a low and a middle layer still hold what the last one has already turned into its own
next token. Deeper chain steps feed the predicted state where h_p was, as before.

The block has the model's own layer shape and starts as a copy of its last layer. Its keys live in a small
cache of its own that follows the model's: rows are added for every committed token (its true state), the
chain's rows are temporary, and the cache is rebuilt from the window's states at every prefill or context
shift. Attention reaches back `window` tokens (the length it was trained on), so a draft costs the same at
100K tokens as at 1K. The LM head is applied to the draft vocabulary only (the most frequent token ids):
its product is most of a draft step's cost.

Files: `draft.safetensors` + `draft_config.json` beside a model (`<model>/draft`) or shipped in this repository
for a GGUF file (`models/<name>/draft`, found by the file's sha256), matrices stored as int8 rows. A file is
checked against the model it is loaded for: shapes, vocabulary, and a signature of the model's LM head, so a
draft layer trained for another model is refused with the file and the mismatch named.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from tokenswift.model.config import ModelConfig
from tokenswift.model.errors import ModelLoadError, read_config_and_weights
from tokenswift.model.forward import Block, Linear, RMSNorm, fused_state, project
from tokenswift.model.native_rows import NativeBlock, NativeRows

CONFIG_NAME = "draft_config.json"
WEIGHTS_NAME = "draft.safetensors"
FORMAT = "tokenswift-draft-layer"
SIGNATURE_ROWS = 256  # LM-head rows averaged into the model signature
SCALE = ".scale"  # a stored int8 matrix's per-row scales (save_layer)
SIGNATURE_MIN_COSINE = 0.99  # the same model in another precision (q4, bf16) stays far above this


class DraftLayerError(ModelLoadError):
    """An unusable draft layer file; the message names the file and what is wrong."""


class DraftLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, draft_vocab: int, window: int, feature_layers: tuple[int, ...] = ()):
        super().__init__()
        self.cfg, self.window, self.feature_layers = cfg, window, tuple(feature_layers)
        self.feature_proj = Linear((len(feature_layers) + 1) * cfg.dim, cfg.dim, bias=False) if feature_layers else None
        self.token_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.fc = Linear(2 * cfg.dim, cfg.dim, bias=False)
        self.layer = Block(cfg)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.register_buffer("vocab", torch.zeros(draft_vocab, dtype=torch.int64))
        self.register_buffer("signature", torch.zeros(cfg.dim))

    def first_feature(self, states: torch.Tensor, native: NativeRows | None = None) -> torch.Tensor:
        """The first chain step's input feature from the model's states [..., T, (k+1)·dim]: the outputs of the k
        feature_layers and then the last layer's, side by side (k = 0: the last layer's states, as they are)."""
        proj = self.feature_proj
        return states if proj is None else project(states, proj.weight, None, native)

    def step(self, feature: torch.Tensor, token_embedding: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             attend, cache: tuple | None = None, native: NativeBlock | None = None) -> torch.Tensor:
        """The one forward, for drafting and training alike. feature, token_embedding: [..., T, dim] (the state
        at p and the embedding of the token at p+1); cos/sin: [T, head_dim] for positions p. The block is the
        model's (forward.Block): attend(q, k, v) returns [..., T, heads * hd] for q [..., T, heads, hd]; it decides
        which keys each row sees. Training: cache None, k/v are the rows' own [..., T, kv_heads, hd]. Drafting:
        cache = (keys, values, slots), the drafter's cache [kv_heads, capacity, hd], which the new rows' K/V are
        written to before attend reads it; native: the block in C (its T <= native_rows.MAX_ROWS). Returns the
        predicted states [..., T, dim]."""
        x = torch.cat((feature, self.token_norm(token_embedding)), dim=-1)
        # self.fc's product, by project() itself so that drafting can hand it the model's C kernels
        x = project(x, self.fc.weight, self.fc.bias, native.rows if native is not None else None)
        keys, values, slots = cache if cache is not None else (None, None, None)
        return self.layer(x, cos, sin, keys, values, slots, attend, native)[0]

    def logits(self, states: torch.Tensor, head_rows: torch.Tensor, native: NativeRows | None = None) -> torch.Tensor:
        """Scores over the draft vocabulary: head_rows = the model's LM-head rows for `vocab`; native: the model's
        C kernels, for the product."""
        return project(self.norm(states), head_rows, None, native)

    def config_dict(self) -> dict:
        cfg = self.cfg
        return {"format": FORMAT, "version": 1, "dim": cfg.dim, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
                "draft_vocab": len(self.vocab), "window": self.window} | (
                    {"feature_layers": list(self.feature_layers)} if self.feature_layers else {})


def model_signature(head_weight: torch.Tensor) -> torch.Tensor:
    """A fingerprint of a model: the mean of its first LM-head rows (cheap, and stable across precisions)."""
    return head_weight[:SIGNATURE_ROWS].float().mean(0).cpu()


def initial_layer(model, draft_vocab: torch.Tensor, window: int, seed: int = 0,
                  feature_layers: tuple[int, ...] = ()) -> DraftLayer:
    """A fresh draft layer: the block is a copy of the model's last layer, fc passes the feature through
    (the token half starts near zero), the output norm is the model's final norm; feature_proj passes the last
    layer's states through."""
    cfg = model.cfg
    layer = DraftLayer(cfg, len(draft_vocab), window, feature_layers)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if layer.feature_proj is not None:
            _pass_through(layer.feature_proj, cfg.dim)
        layer.layer.load_state_dict({k: v.float() for k, v in model.model.layers[-1].state_dict().items()})
        layer.norm.weight.copy_(model.model.norm.weight.float())
        layer.fc.weight.zero_()
        layer.fc.weight[:, :cfg.dim].copy_(torch.eye(cfg.dim))
        layer.fc.weight[:, cfg.dim:].normal_(0.0, 0.02, generator=generator)
        layer.vocab.copy_(draft_vocab)
        layer.signature.copy_(model_signature(model.head_weight))
    return layer


def with_features(layer: DraftLayer, feature_layers: tuple[int, ...]) -> DraftLayer:
    """A trained layer that reads the last layer's states, given a feature_proj over feature_layers that starts by
    passing those states through: it drafts as before, and further training learns what the other layers add."""
    weight = layer.norm.weight
    wide = DraftLayer(layer.cfg, len(layer.vocab), layer.window, feature_layers).to(weight.device, weight.dtype)
    missing = wide.load_state_dict(layer.state_dict(), strict=False).missing_keys
    if missing != ["feature_proj.weight"]:
        raise ValueError(f"with_features: expected a layer without feature layers (missing {missing})")
    with torch.no_grad():
        _pass_through(wide.feature_proj, layer.cfg.dim)
    return wide


def _pass_through(proj: Linear, dim: int) -> None:
    """proj's weight: the identity on the last layer's part, zero on the others (their gradients are not)."""
    proj.weight.zero_()
    proj.weight[:, -dim:].copy_(torch.eye(dim))


def save_layer(layer: DraftLayer, directory: Path, record: dict | None = None) -> None:
    """Matrices as int8 rows with a float16 scale each (`<name>` + `<name>.scale`), the rest in float16: the
    shipped file stays a few MB, and drafts only propose, so the rounding (under 0.4% of a row's largest weight)
    costs acceptance at most, never text. Loading restores float32 (dequantize)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in layer.state_dict().items():
        value = value.detach().to("cpu")
        if value.is_floating_point() and value.dim() == 2:
            scale = (value.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
            tensors[name] = torch.round(value / scale).to(torch.int8).contiguous()
            tensors[name + SCALE] = scale.to(torch.float16)
        elif value.is_floating_point() and name != "signature":
            tensors[name] = value.to(torch.float16).contiguous()
        else:
            tensors[name] = value.contiguous()
    tmp = directory / (WEIGHTS_NAME + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(directory / WEIGHTS_NAME)
    config = layer.config_dict() | ({"record": record} if record else {})
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2))


def dequantize(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """save_layer's tensors back as float32 weights (int8 rows times their scales)."""
    state = {}
    for name, value in stored.items():
        if name.endswith(SCALE):
            continue
        scale = stored.get(name + SCALE)
        if scale is not None:
            value = value.float() * scale.float()
        state[name] = value.float() if value.is_floating_point() else value
    return state


def load_layer(directory: Path, cfg: ModelConfig, head_weight: torch.Tensor, device, dtype) -> DraftLayer:
    """The draft layer in `directory`, checked against the model it will draft for."""
    config_file, weights_file = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    meta, stored = read_config_and_weights(directory, CONFIG_NAME, WEIGHTS_NAME, DraftLayerError, "draft layer")
    state = fused_state(dequantize(stored))
    if meta.get("format") != FORMAT:
        raise DraftLayerError(f"{config_file} is not a draft layer config (format {meta.get('format')!r})")
    for key, want in (("dim", cfg.dim), ("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads),
                      ("head_dim", cfg.head_dim), ("intermediate_size", cfg.intermediate_size),
                      ("vocab_size", cfg.vocab_size)):
        if meta.get(key) != want:
            raise DraftLayerError(f"{config_file}: draft layer for another model ({key} {meta.get(key)}, "
                                  f"this model has {want})")
    features = meta.get("feature_layers", [])
    if not (isinstance(features, list) and all(isinstance(n, int) and 1 <= n < cfg.n_layers for n in features)
            and features == sorted(set(features))):
        raise DraftLayerError(f"{config_file}: feature_layers must be distinct ascending layer numbers in "
                              f"1..{cfg.n_layers - 1} (got {features!r})")
    with torch.device("meta"):
        layer = DraftLayer(cfg, int(meta.get("draft_vocab", 0)), int(meta.get("window", 0)), tuple(features))
    expected = layer.state_dict()
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise DraftLayerError(f"{weights_file}: tensors do not match (missing {missing[:3]}, unexpected {extra[:3]})")
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise DraftLayerError(f"{weights_file}: {name} has shape {tuple(state[name].shape)}, "
                                  f"expected {tuple(ref.shape)}")
    vocab = state["vocab"]
    if len(vocab) == 0 or vocab.is_floating_point() or int(vocab.min()) < 0 or int(vocab.max()) >= cfg.vocab_size:
        raise DraftLayerError(f"{weights_file}: the draft vocabulary must be token ids below {cfg.vocab_size}")
    if layer.window < 1:
        raise DraftLayerError(f"{config_file}: window must be >= 1")
    cosine = torch.nn.functional.cosine_similarity(state["signature"].float(), model_signature(head_weight), dim=0)
    if not cosine >= SIGNATURE_MIN_COSINE:
        raise DraftLayerError(f"{weights_file}: trained for another model (its LM-head signature does not match "
                              f"this model's: cosine {float(cosine):.3f})")
    layer.load_state_dict(state | {"vocab": vocab.long()}, assign=True)  # ids as the buffer holds them (int64)
    return layer.to(device=device, dtype=dtype).eval().requires_grad_(False)
