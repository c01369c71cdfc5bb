"""The products of K-quant files' blocks (kquant_kernels.c through quant.QuantLinear): Q4_K, Q5_K, Q6_K and the
legacy Q5_0/Q5_1, read as the gguf package reads them, multiplied against 8-bit activations on the AVX-512 VNNI
path and the portable one, each activation row the same alone as in a batch; stacked products of mixed kinds and
an embedding read from blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from tokenswift.model import native
from tokenswift.model.quant import BLOCKS, KINDS, QuantEmbedding, QuantLinear, StackedQuant

NEW = ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
IN = 512  # two super-blocks of 256
SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # where each block's float16 scales lie


def random_blocks(kind: str, rows: int, seed: int) -> np.ndarray:
    """Valid blocks of `kind` for a rows x IN weight: random bits (every bit pattern is a valid K block) with scales
    of a trained model's size; Q5_0/Q5_1 from the gguf package's quantizer."""
    rng = np.random.default_rng(seed)
    if kind in ("Q5_0", "Q5_1"):
        weight = rng.standard_normal((rows, IN)).astype(np.float32)
        return quants.quantize(weight, GGMLQuantizationType[kind]).reshape(rows, -1)
    per, size = BLOCKS[kind]
    blocks = rng.integers(0, 256, (rows, IN // per, size), dtype=np.uint8)
    for at in SCALES[kind]:
        scale = rng.uniform(0.001, 0.01, (rows, IN // per)).astype(np.float16)
        blocks[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, IN // per, 2)
    return blocks.reshape(rows, -1)


def linear_of(kind: str, rows: int = 40, seed: int = 0) -> tuple[QuantLinear, torch.Tensor]:
    """The product and the gguf package's dequantized weight."""
    blocks = random_blocks(kind, rows, seed)
    dense = quants.dequantize(blocks, GGMLQuantizationType[kind]).reshape(rows, IN)
    return QuantLinear(kind, torch.from_numpy(blocks.copy()), rows, IN), torch.from_numpy(dense.astype(np.float32))


@pytest.mark.parametrize("kind", NEW)
def test_products_are_the_blocks_times_activations_rounded_to_8_bits(kind):
    linear, dense = linear_of(kind)
    assert torch.allclose(linear.dequantized(), dense, rtol=1e-6, atol=1e-7)  # the gguf package's reading
    x = torch.randn(7, IN, generator=torch.Generator().manual_seed(1))
    ours, exact = linear(x), x @ dense.t()
    assert 0 < (ours - exact).norm() / exact.norm() < 0.02  # 8-bit activations: close, not equal
    for rows in (slice(0, 1), slice(2, 3), slice(4, 7), slice(6, 7)):  # alone, as in tiles of 4 and their tails
        assert torch.equal(linear(x[rows]), ours[rows])


@pytest.mark.parametrize("kind", NEW)
def test_the_portable_path_computes_what_the_vnni_path_does(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path))
    portable = native.kernels(("-mno-avx2",))
    linear, dense = linear_of(kind, rows=24, seed=2)
    x = torch.randn(5, IN, generator=torch.Generator().manual_seed(3))
    y = torch.empty(5, 24)
    assert portable.qk_matmul(KINDS[kind], linear.blocks.data_ptr(), 24, IN, x.data_ptr(), 5, y.data_ptr(), 1) == 0
    assert torch.allclose(y, linear(x), rtol=1e-4, atol=1e-4)
    one, row = torch.empty(1, 24), x[3:4].contiguous()
    assert portable.qk_matmul(KINDS[kind], linear.blocks.data_ptr(), 24, IN, row.data_ptr(), 1, one.data_ptr(), 1) == 0
    assert torch.equal(one, y[3:4])
    out = torch.empty(24, IN)
    portable.qk_rows(KINDS[kind], linear.blocks.data_ptr(), IN, 24, out.data_ptr())
    assert torch.allclose(out, dense, rtol=1e-6, atol=1e-7)


def test_a_stacked_product_of_mixed_kinds_is_its_parts_side_by_side():
    parts = [linear_of("Q4_K", 32, 4)[0], linear_of("Q6_K", 16, 5)[0], linear_of("Q5_0", 8, 6)[0]]
    stacked = StackedQuant(parts)
    assert stacked.kind == "Q4_K+Q6_K+Q5_0" and stacked.out_features == 56
    x = torch.randn(6, IN, generator=torch.Generator().manual_seed(7))
    assert torch.equal(stacked(x), torch.cat([p(x) for p in parts], dim=1))
    assert torch.equal(stacked.dequantized(), torch.cat([p.dequantized() for p in parts]))


def test_an_embedding_in_blocks_dequantizes_the_rows_looked_up():
    table, dense = linear_of("Q6_K", 50, 8)
    embedding = QuantEmbedding(table)
    ids = torch.tensor([[3, 49, 0, 3]])
    assert torch.equal(embedding(ids), table.dequantized()[ids])
    assert torch.allclose(embedding.weight, dense, rtol=1e-6, atol=1e-7)
    with pytest.raises(IndexError, match="out of range"):
        embedding(torch.tensor([50]))
