"""The quantized products of `--dtype q4` (tokenswift/model/quant.py, quant_kernels.c, built by native.py): a GGUF
file's own Q4_0, Q4_1 and Q8_0 blocks times float32 activations, as llama.cpp multiplies them, repacked for AVX2 or
AVX-512 VNNI and by the portable loops, and a clear error where no C compiler runs."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from tokenswift.model import native
from tokenswift.model.errors import ModelLoadError
from tokenswift.model.quant import DENSE_ROWS, KINDS, LEGACY, PACKED, QuantLinear

OUT, IN = 96, 320  # ten blocks of 32 per row
# What -march=native -mno-avx512f keeps for quant_packed.c's AVX2 loops (the CPUs this project runs on have them).
AVX2 = {"avx2", "fma", "f16c"} <= set(native.cpu_flags().split())


def quantized(kind: str, seed: int = 0) -> tuple[QuantLinear, np.ndarray]:
    weight = np.random.default_rng(seed).standard_normal((OUT, IN)).astype(np.float32)
    data = quants.quantize(weight, GGMLQuantizationType[kind])
    blocks = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).reshape(OUT, -1).copy())
    return QuantLinear(kind, blocks, OUT, IN), data


@pytest.mark.parametrize("kind", LEGACY)
def test_products_are_the_files_weights_times_activations_rounded_per_block(kind):
    linear, data = quantized(kind)
    dense = torch.from_numpy(quants.dequantize(data, GGMLQuantizationType[kind]).reshape(OUT, IN).astype(np.float32))
    assert torch.allclose(linear.dequantized(), dense, rtol=1e-6, atol=1e-7)  # the gguf package's reading
    x = torch.randn(5, IN, generator=torch.Generator().manual_seed(1))
    ours, exact = linear(x), x @ dense.t()
    assert 0 < (ours - exact).norm() / exact.norm() < 0.02  # 8-bit activations: close, not equal
    for row in range(5):  # a row's product is the same whatever rows share the call (AR step vs verify batch)
        assert torch.equal(linear(x[row:row + 1]), ours[row:row + 1])
    many = torch.randn(DENSE_ROWS, IN)  # prefill chunks take the dequantized weight and a float32 GEMM
    assert torch.allclose(linear(many), F.linear(many, dense), rtol=1e-5, atol=1e-5)
    assert linear(x[None]).shape == (1, 5, OUT)


@pytest.mark.parametrize(("kind", "out"), [("Q4_0", 44), ("Q4_1", 37), ("Q8_0", 37), ("Q5_0", 40), ("Q5_1", 37)])
def test_packed_products_are_the_portable_loops_bit_for_bit(kind, out, kernel_builds):
    """Where the CPU has AVX2 (eight rows a group) or AVX-512 VNNI (sixteen) the products read weights repacked for
    it, the last group part empty here; a build without either multiplies the file's blocks. For the kinds of the
    default model's file every build computes the same floats bit for bit (a draft goes on alike on any machine):
    this machine's, its AVX2 loops (run on a VNNI machine too) and the portable ones; and a row's product is the same
    alone as in a batch (tiles of 4 + 3 rows, 3, 1)."""
    weight = np.random.default_rng(5).standard_normal((out, IN)).astype(np.float32)
    data = quants.quantize(weight, GGMLQuantizationType[kind])
    linear = QuantLinear(kind, torch.from_numpy(data.view(np.uint8).reshape(out, -1).copy()), out, IN)
    portable, avx2 = native.kernels(("-mno-avx2",)), native.kernels(("-mno-avx512f",))
    assert portable.qk_packed_bytes(KINDS[kind], out, IN) == 0  # this build packs nothing
    packed = torch.empty(avx2.qk_packed_bytes(KINDS[kind], out, IN), dtype=torch.uint8)
    assert (len(packed) > 0) == (kind in LEGACY and AVX2)  # not Q5: AVX2 has no masked byte add for its fifth bits
    if len(packed):
        avx2.qk_pack(KINDS[kind], linear.blocks.data_ptr(), out, IN, packed.data_ptr())
    x = torch.randn(7, IN, generator=torch.Generator().manual_seed(6))
    y, y2 = torch.empty(7, out), torch.empty(7, out)
    for m in (7, 3, 1):
        assert portable.qk_matmul(KINDS[kind], linear.blocks.data_ptr(), out, IN, x.data_ptr(), m, y.data_ptr(),
                                  1) == 0
        assert torch.equal(linear(x[:m]), linear(x)[:m])
        if kind not in LEGACY:
            assert torch.allclose(y[:m], linear(x[:m]), rtol=1e-5, atol=1e-5)
            continue
        assert torch.equal(y[:m], linear(x[:m]))
        if len(packed):
            assert avx2.qk_matmul(PACKED + KINDS[kind], packed.data_ptr(), out, IN, x.data_ptr(), m, y2.data_ptr(),
                                  1) == 0
            assert torch.equal(y2[:m], y[:m])
    assert not torch.equal(y, torch.zeros_like(y))


def test_without_a_compiler_q4_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ModelLoadError, match="could not run the C compiler .*no-such-cc"):
        native._compile(tmp_path / "kernels.so", native.SOURCES)
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    with pytest.raises(ModelLoadError, match=r"compiling the C kernels \(quant_kernels.c, .*\) with false failed"):
        native._compile(tmp_path / "kernels.so", native.SOURCES)
    assert not (tmp_path / "kernels.so").exists()


def test_blocks_of_the_wrong_size_are_refused():
    with pytest.raises(ModelLoadError, match="Q4_1 blocks of shape"):
        QuantLinear("Q4_1", torch.zeros(OUT, 7, dtype=torch.uint8), OUT, IN)
    with pytest.raises(ModelLoadError, match="whole blocks of 32"):
        QuantLinear("Q4_1", torch.zeros(OUT, 10, dtype=torch.uint8), OUT, 33)
    assert isinstance(native.kernels(), ctypes.CDLL)
