"""The draft layer on a q4 model drafts from Q8_0 copies of its products and head rows (layer_drafter.q8_block,
QuantLinear.q8): each copy is the gguf quantizer's blocks of the float weight, the layer itself is left as it is
(its float products still serve long catch-up runs and training), and TokenSwift still writes plain decoding's text."""

from __future__ import annotations

import torch
from speed import AR
from torch import nn

from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.model.quant import QuantLinear
from tokenswift.settings import writing_settings


def test_q8_copies_hold_the_weights_to_within_a_block_step():
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    q = QuantLinear.q8(weight)
    step = weight.abs().reshape(64, 3, 32).amax(-1).repeat_interleave(32, dim=1) / 127  # one int8 step a block
    assert q.kind == "Q8_0" and ((q.dequantized() - weight).abs() <= step * 0.51 + 1e-3).all()
    x = torch.randn(2, 96, generator=torch.Generator().manual_seed(1))
    ref = x @ weight.T  # the kernel takes int8 activations too (as for every GGUF block): within a percent or two
    assert (q(x) - ref).abs().max() < 0.02 * ref.abs().max()


def test_a_q4_models_draft_layer_drafts_from_q8_copies(smollm2_q4):
    lm = smollm2_q4
    prompt = lm.encode("The lighthouse keeper climbed the stairs as the storm came in from the sea, and")
    s = writing_settings(max_new_tokens=80, seed=4)
    engine = Engine(lm, s, prompt, len(prompt))
    engine.start()
    drafter = engine.drafter
    assert isinstance(drafter.head, QuantLinear) and drafter.head.kind == "Q8_0"
    products = [p for p in drafter.block.tensors if p.dtype == torch.uint8]
    assert len(products) == 4  # qkv, o, gate_up and down as Q8_0 blocks
    layer = lm.draft_layer.layer
    assert all(type(m) is not QuantLinear and isinstance(m, nn.Linear)
               for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj))
    assert Generator(lm, s, prompt).run() == Generator(lm, s, prompt, options=AR).run()
