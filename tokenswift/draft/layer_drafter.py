"""The draft layer's drafter: a chain drafted token by token, each guess knowing the one before it.

State: the draft layer's own key/value cache, slot = position as in the model's cache. Every committed token
adds one row from its true last-layer state (the verify pass's, a plain step's, or the prefill's; with feature
layers, theirs beside it, through the layer's feature_proj), and the tokens after those states are known, so a
committed row is exact. The rows are run lazily, all at once, when
the next draft is asked for: a string of plain steps (the adaptive policy's plain gear) costs nothing until
then. The last committed row's output is the predicted state at the root, whose scores give depth 1; each
deeper guess runs one more row, from the state the draft itself predicted and the token it just chose. Those
chain rows sit in slots past the committed ones and are overwritten by the next committed rows, so nothing
needs rolling back. Every prefill (first, resume, context shift) starts the cache afresh from the window's
last `window` states.

Exactness does not depend on any of this: the chain is only a proposal; verification decides the text.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from torch import nn

from tokenswift.draft.drafting import best_per_depth
from tokenswift.model.draft_layer import DraftLayer
from tokenswift.model.forward import attention_bias, sdpa_folded
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.masks import causal_mask
from tokenswift.model.native_rows import MAX_ROWS, NativeBlock
from tokenswift.model.quant import QuantLinear
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.windows import node_windows
from tokenswift.settings import Speculation

# The states a draft attends to, however long the window the layer was trained with: after a string of plain steps
# (the adaptive policy's plain gear) the drafter runs this many of their rows before drafting again. At 512 that
# catch-up (20-40 ms at 2K, q4) cost more than the exploring iteration itself; at 64, 9-12 ms at 7K, half a switching
# iteration's 27-34 ms; at 16, one call of the C block (native_rows.MAX_ROWS rows), 1.9 ms. Tokens per iteration
# hardly depend on it: over five held-out openings (1.5K tokens, 400 drafted, chain of 3) a mean of 1.613 for 64
# states, 1.628 for 32, 1.611 for 16.
DRAFT_WINDOW = 16


def draft_window(layer: DraftLayer) -> int:
    """The states a draft of this draft layer attends to (DRAFT_WINDOW)."""
    return min(layer.window, DRAFT_WINDOW)


class CacheAttention:
    """attend() over the drafter's cache, whose slots first.. the n new rows' K/V were just written to: each row
    sees the slots up to its own within the window; by the C kernel where the drafter has the model's."""

    def __init__(self, drafter: LayerDrafter, first: int, n: int):
        self.d, self.first, self.n = drafter, first, n

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        d, first, n = self.d, self.first, self.n
        lo = max(d.valid_from, first + n - d.window)
        keys, values = keys[:, lo:first + n], values[:, lo:first + n]
        mask = None
        if n > 1:  # causal within the window, counted from lo (slot = position, so lo's offset cancels)
            prefix = first - lo
            positions = torch.arange(prefix, prefix + n, device=q.device)
            mask = causal_mask(prefix, n, positions, d.window, q.device)
        if d.native is not None and n <= MAX_ROWS:
            return d.native.attend(d.cfg, q, keys, values, mask)
        return sdpa_folded(d.cfg, q, keys, values, attention_bias(mask, d.cfg.group, q.dtype) if n > 1 else None)


class LayerDrafter:
    uses_hidden = True
    switch_s = 0.0

    def __init__(self, lm: LoadedModel, spec: Speculation, sampler: Sampler, capacity: int):
        if lm.draft_layer is None:
            raise ValueError("drafter: this model has no draft layer (train one with `tokenswift train-draft`)")
        self.lm, self.layer, self.sampler, self.cfg = lm, lm.draft_layer, sampler, lm.config
        self.window = draft_window(self.layer)
        self.widths = [1] * (len(spec.tree) - 1)  # a chain as deep as the tree
        self.dtype = self.layer.norm.weight.dtype  # may be narrower than the model's (loading._pick_draft)
        self.head_rows = lm.model.head_weight[self.layer.vocab].to(self.dtype)
        # With the model's integer kernels (q4), the layer's products and its head rows run from Q8_0 copies, a
        # quarter of float32's bytes: a 3-deep draft at 2K took 4.2 ms instead of 7.5, and accepted as many tokens
        # (1.72 against 1.73 per iteration over three held-out openings). The text, decided by verification, is the
        # same.
        quantized = lm.precision == "q4" and lm.model.native is not None
        cache = KVCache(1, self.cfg.n_kv_heads, capacity, self.cfg.head_dim, lm.device, self.dtype)
        self.keys, self.values = cache.k[0], cache.v[0]
        # The model's C kernels run the layer too where it has them and the layer shares its float32.
        self.native = lm.model.native if self.dtype == torch.float32 else None
        quantized = quantized and self.native is not None
        block = q8_block(self.layer.layer) if quantized else self.layer.layer
        self.block = NativeBlock(self.native, self.cfg, block) if self.native is not None else None
        self.head = QuantLinear.q8(self.head_rows) if quantized else None
        self.filled = self.valid_from = 0  # rows [valid_from, filled) hold committed states
        self.pending: list[tuple[torch.Tensor, list[int]]] = []  # committed, not yet run: (states, following tokens)
        self.pending_count = 0
        self.state: torch.Tensor | None = None  # [1, dim]: the predicted state at the root's position

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        self.filled = self.valid_from = self.pending_count = 0
        self.pending, self.state = [], None

    def wants_queries(self, count: int) -> bool:
        return False

    def observe(self, hidden: torch.Tensor, following: list[int], first: int) -> None:
        """Committed states hidden [n, dim] at slots first.. (with a fused-feature layer, the rows of its layers
        and the last one's side by side: [n, (k+1)·dim]), and the token after each."""
        if not self.pending and first != self.filled:
            self.filled = self.valid_from = first  # a window's tail: nothing before it is known
        self.pending.append((hidden.reshape(len(following), -1).clone(), list(following)))
        self.pending_count += len(following)
        # Only the last `window` rows matter: a row's keys and values are its own input's, and the state the next
        # draft starts from attends to the window before it. Cut to them, within a block too (a prefill's window
        # of states followed by plain steps outgrew the window, and attention over more rows than it had slots).
        while self.pending_count > self.window:
            states, following = self.pending.pop(0)
            drop = min(self.pending_count - self.window, len(following))
            if drop < len(following):
                self.pending.insert(0, (states[drop:], following[drop:]))
            self.pending_count -= drop
            self.filled = self.valid_from = self.filled + drop

    def ngram_prefix(self, root: int, levels: list[list[int]]) -> list[int]:
        return []  # the root is certain: n-gram continuations hang from it

    def commit(self, full: KVCache, start: int, end: int, queries: list[torch.Tensor] | None) -> None:
        pass  # observe() brings the committed states

    def propose(self, root: int, position: int, window: torch.Tensor | None, depth: int,
                key: int) -> list[list[int]]:
        # More rows pending than a drafting iteration commits: plain steps came before, and running their rows is
        # the cost of switching to drafts (at 2K, 7 ms on a 13 ms iteration), not of this iteration's shape.
        switching, start = self.pending_count > len(self.widths) + 1, time.perf_counter()
        self._run_pending()
        self.switch_s = time.perf_counter() - start if switching else 0.0
        if self.state is None or not self.widths[:depth]:
            return []
        levels, state, rows = [], self.state, window
        for d in range(len(self.widths[:depth])):
            scores = (self.head(self.layer.norm(state)) if self.head is not None  # over the draft vocabulary
                      else self.layer.logits(state, self.head_rows, self.native))
            levels.append(best_per_depth(scores, self.sampler, rows, [1], key + d, self.layer.vocab)[0])
            if d + 1 < len(self.widths[:depth]):
                state = self._run(state, levels[-1], position + d)
                if window is not None:  # the penalty and DRY of the next guess see the chain, as the target's will
                    chain = [level[0] for level in levels]
                    rows = node_windows(window[0], window.new_tensor([chain]), window.new_tensor([len(chain)]))
        return levels

    def _run_pending(self) -> None:
        if not self.pending:
            return
        states = torch.cat([h for h, _ in self.pending]).to(self.dtype)
        tokens = [t for _, following in self.pending for t in following]
        self.state = self._run(self.layer.first_feature(states, self.native), tokens, self.filled)[-1:]
        self.filled += len(tokens)
        self.pending, self.pending_count = [], 0

    @torch.inference_mode()
    def _run(self, states: torch.Tensor, tokens: list[int], first: int) -> torch.Tensor:
        model, dev = self.lm.model, self.lm.device
        if first + len(tokens) > self.keys.shape[1]:  # the C kernels write the slots unchecked
            raise RuntimeError(f"draft cache full: need {first + len(tokens)} slots, have {self.keys.shape[1]}")
        pos = torch.arange(first, first + len(tokens), device=dev)
        embedded = model.model.embed_tokens(torch.tensor(tokens, device=dev)).to(self.dtype)
        cos, sin = model.rope_cos[pos].to(self.dtype), model.rope_sin[pos].to(self.dtype)
        block = self.block if len(tokens) <= MAX_ROWS else None  # slot = position
        return self.layer.step(states.to(self.dtype), embedded, cos, sin, CacheAttention(self, first, len(tokens)),
                               (self.keys, self.values, pos), block)


def q8_block(block: nn.Module) -> SimpleNamespace:
    """A decoder layer (forward.Block) as its NativeBlock reads it, with its four products as Q8_0 copies
    (QuantLinear.q8); a product with a bias stays as it is (QuantLinear has none). The layer itself is left alone."""
    def q8(linear: nn.Module) -> nn.Module:
        return QuantLinear.q8(linear.weight) if getattr(linear, "bias", None) is None else linear

    attn, mlp = block.self_attn, block.mlp
    return SimpleNamespace(self_attn=SimpleNamespace(qkv_proj=q8(attn.qkv_proj), o_proj=q8(attn.o_proj)),
                           mlp=SimpleNamespace(gate_up_proj=q8(mlp.gate_up_proj), down_proj=q8(mlp.down_proj)),
                           input_layernorm=block.input_layernorm,
                           post_attention_layernorm=block.post_attention_layernorm)
