"""The products of K-quant files' blocks (kquant_kernels.c through quant.QuantLinear): Q4_K, Q5_K, Q6_K and the
legacy Q5_0/Q5_1, read as the gguf package reads them, multiplied against 8-bit activations by the portable loops,
the AVX2 kernels and the AVX-512 VNNI ones (packed sixteen rows a group), the same floats in every build and each
activation row the same alone as in a batch; stacked products of mixed kinds and an embedding read from blocks."""

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


# Builds of the kernels that each path runs in: plain loops, AVX2 (the K kinds a weight row at a time), and this
# CPU's own (with AVX-512 VNNI: Q4_K, Q6_K and Q5_x repacked sixteen rows a group).
BUILDS = {"portable": ("-mno-avx2",), "avx2": ("-mno-avx512f",), "native": ()}


def random_blocks(kind: str, rows: int, seed: int, cols: int = IN) -> np.ndarray:
    """Valid blocks of `kind` for a rows x cols weight: random bits (every bit pattern is a valid K block) with
    scales of a trained model's size; Q5_0/Q5_1 from the gguf package's quantizer."""
    rng = np.random.default_rng(seed)
    if kind in ("Q5_0", "Q5_1"):
        weight = rng.standard_normal((rows, cols)).astype(np.float32)
        return quants.quantize(weight, GGMLQuantizationType[kind]).reshape(rows, -1)
    per, size = BLOCKS[kind]
    blocks = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    for at in SCALES[kind]:
        scale = rng.uniform(0.001, 0.01, (rows, cols // per)).astype(np.float16)
        blocks[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, cols // per, 2)
    return blocks.reshape(rows, -1)


def linear_of(kind: str, rows: int = 40, seed: int = 0, cols: int = IN) -> tuple[QuantLinear, torch.Tensor]:
    """The product and the gguf package's dequantized weight."""
    blocks = random_blocks(kind, rows, seed, cols)
    dense = quants.dequantize(blocks, GGMLQuantizationType[kind]).reshape(rows, cols)
    return QuantLinear(kind, torch.from_numpy(blocks.copy()), rows, cols), torch.from_numpy(dense.astype(np.float32))


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
def test_every_build_computes_the_same_floats(kind, kernel_builds):
    """The portable loops, the AVX2 kernels and this CPU's (packed where it packs) give the same floats, bit for bit:
    a block's integer sums are exact, and each is scaled in one order (kquant.h). 37 weight rows: two groups of 16
    and a part one; Q5_x rows of nine blocks (the AVX2 kernel takes them two at a time)."""
    cols = 288 if kind in ("Q5_0", "Q5_1") else IN
    linear, dense = linear_of(kind, rows=37, seed=2, cols=cols)
    x = torch.randn(7, cols, generator=torch.Generator().manual_seed(3))
    expected = linear(x)
    assert 0 < (expected - x @ dense.t()).norm() / (x @ dense.t()).norm() < 0.02
    for flags in BUILDS.values():
        lib = native.kernels(flags)
        for m, threads in ((7, 1), (1, 1), (5, 2)):
            y = torch.empty(m, 37)
            assert lib.qk_matmul(KINDS[kind], linear.blocks.data_ptr(), 37, cols, x.data_ptr(), m, y.data_ptr(),
                                 threads) == 0
            assert torch.equal(y, expected[:m]), (flags, m)
    out = torch.empty(37, cols)
    native.kernels(BUILDS["portable"]).qk_rows(KINDS[kind], linear.blocks.data_ptr(), cols, 37, out.data_ptr())
    assert torch.allclose(out, dense, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ("Q4_K", "Q5_K", "Q6_K"))
def test_packed_k_weights_are_the_same_products(kind):
    """On AVX-512 VNNI, the K kinds' weights are repacked sixteen rows a group (kquant_packed.c, q6k_packed.c; Q6_K
    in as many bytes as the file's): each row of a batch is the same alone and the same as the file's blocks give."""
    linear, dense = linear_of(kind, rows=37, seed=9)
    flat = QuantLinear(kind, linear.blocks, 37, IN, pack=False)
    size = native.kernels().qk_packed_bytes(KINDS[kind], 37, IN)
    if size == 0:
        pytest.skip("this CPU's kernels multiply the file's blocks (no AVX-512 VNNI)")
    assert linear.product_weight is not linear.blocks and flat.product_weight is flat.blocks
    if kind == "Q6_K":  # three groups of sixteen rows, each as many bytes as in the file
        assert size == 48 * linear.blocks.shape[1]
    x = torch.randn(9, IN, generator=torch.Generator().manual_seed(10))
    ours = linear(x)
    assert torch.equal(ours, flat(x))
    assert 0 < (ours - x @ dense.t()).norm() / (x @ dense.t()).norm() < 0.02
    for rows in (slice(0, 1), slice(3, 4), slice(4, 8), slice(8, 9), slice(1, 7)):  # alone, tiles of 4 and tails
        assert torch.equal(linear(x[rows]), ours[rows])


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
