"""The project's reference quantizer (tokenswift/model/kquant_ref.py), read back by the gguf package's dequantize: its
blocks hold the weights to within what their bits allow, every layout bit in its place."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tokenswift.model.kquant_ref import quantize
from tokenswift.model.quant import BLOCKS

ERROR = {"Q4_K": 0.09, "Q5_K": 0.045, "Q6_K": 0.025, "Q5_0": 0.05, "Q5_1": 0.045}  # relative, on Gaussian weights


@pytest.mark.parametrize("kind", list(ERROR))
def test_blocks_read_back_as_the_weights(kind):
    weight = np.random.default_rng(0).standard_normal((6, 512)).astype(np.float32)
    weight[0], weight[1], weight[2] = np.abs(weight[0]), -np.abs(weight[1]), 0  # one-signed rows, and zeros
    blocks = quantize(weight, kind)
    assert blocks.dtype == np.uint8 and blocks.shape == (6, 512 // BLOCKS[kind][0] * BLOCKS[kind][1])
    back = quants.dequantize(blocks, GGMLQuantizationType[kind]).reshape(weight.shape)
    assert np.linalg.norm(back - weight) / np.linalg.norm(weight) < ERROR[kind]
    assert not back[2].any()
    for row in (0, 1):  # each row alone: the error is the row's, not hidden in the others'
        assert np.linalg.norm(back[row] - weight[row]) / np.linalg.norm(weight[row]) < ERROR[kind]


def test_k_kinds_need_whole_super_blocks():
    with pytest.raises(ValueError, match="whole super-blocks of 256"):
        quantize(np.zeros((2, 288), np.float32), "Q4_K")
