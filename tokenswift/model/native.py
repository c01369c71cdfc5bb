"""The engine's C kernels for the CPU, built once per machine and loaded with ctypes: the products of GGUF blocks
(quant_kernels.c, `--dtype q4`; quant_packed.c where the CPU has AVX2 or AVX-512 VNNI; kquant_kernels.c, K-quant
files' blocks, with kquant_avx2.c, and kquant_packed.c and q6k_packed.c on VNNI) and a decoder layer's other steps for a
few float32 rows (attention_kernel.c, layer_kernels.c; native_rows.py), the latter two also built for float64
(real.h), the dtype of the exactness proofs, whose steps on a small model were otherwise two thirds operator
dispatch; and the sampler's float32 rows (tokenswift/sampling/sample_rows.c, row_kernel.py).

They are compiled with the system's C compiler (`cc`, or $CC) for the CPU they run on, into the engine's cache
directory (gguf_checkpoint.default_cache_dir()/kernels), and reused from there; threads are OpenMP's, as many as
torch uses. Without a compiler q4 is refused with a message that says so, and float32 models run torch's
operators throughout.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from tokenswift.model.errors import ModelLoadError
from tokenswift.model.gguf_checkpoint import default_cache_dir
from tokenswift.sampling.row_kernel import RowKernel

ROW_SOURCES = tuple(Path(__file__).with_name(name) for name in ("attention_kernel.c", "attention_q8.c",
                                                                  "layer_kernels.c"))
SOURCES = tuple(Path(__file__).with_name(name) for name in (
    "quant_kernels.c", "quant_packed.c", "kquant_kernels.c", "kquant_avx2.c", "kquant_packed.c", "q6k_packed.c",
)) + ROW_SOURCES + (Path(__file__).parent.parent / "sampling" / "sample_rows.c",)  # the sampler's rows (float32)
# Part of what a build depends on:
HEADERS = tuple(Path(__file__).with_name(name) for name in ("simd.h", "real.h", "gguf_blocks.h", "kquant.h",
                                                                "attention_parts.h", "attention_f64.h", "kv_q8.h",
                                                                "attend_rows.h"))
DOUBLE = ("-DTS_DOUBLE",)  # the flag that builds the row kernels for float64 (real.h)
I64, PTR = ctypes.c_int64, ctypes.c_void_p


def signatures(real) -> dict[str, tuple[list, object]]:
    """name -> (argument types, result type) of the kernels whose element type is `real` (ctypes.c_float or
    c_double); the GGUF block products are float32's only."""
    rows = {
        "attend_rows": ([PTR, I64, I64, I64, I64, PTR, PTR, ctypes.c_int, I64, I64, I64, PTR, PTR, I64, real, PTR,
                         ctypes.c_int], ctypes.c_int),
        "block_in": ([PTR, PTR, I64, PTR, PTR, PTR, PTR, PTR, ctypes.c_int, I64, I64, PTR, ctypes.c_int], ctypes.c_int),
        "block_out": ([PTR, PTR, PTR, I64, ctypes.c_int], ctypes.c_int),
        "run_layers": ([PTR, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR, I64, ctypes.c_int, I64, I64, I64, PTR, PTR, I64,
                        real, PTR, PTR, PTR, ctypes.c_int], ctypes.c_int),
        "dense_matmul": ([PTR, I64, I64, PTR, I64, PTR, ctypes.c_int], None),
        "attention_dot_bf16": ([], ctypes.c_int),
        "attention_q8_fast": ([I64], ctypes.c_int),
    }
    if real is ctypes.c_double:
        return rows
    return rows | {"qk_matmul": ([ctypes.c_int, PTR, I64, I64, PTR, I64, PTR, ctypes.c_int], ctypes.c_int),
                   "qk_rows": ([ctypes.c_int, PTR, I64, I64, PTR], None),
                   "qk_take": ([ctypes.c_int, PTR, I64, PTR, I64, PTR], None),
                   "qk_packed_bytes": ([ctypes.c_int, I64, I64], I64),
                   "qk_pack": ([ctypes.c_int, PTR, I64, I64, PTR], None),
                   "sample_row": ([PTR, I64, PTR, PTR, PTR, PTR], ctypes.c_int),
                   "finite_columns": ([PTR, I64, PTR], I64),
                   "dry_lengths": ([PTR, I64, PTR, I64, I64, PTR], None),
                   "repeat_followers_row": ([PTR, I64, I64, PTR], None),
                   "noise_uniforms": ([PTR, PTR, I64, I64, PTR], None)}


def cpu_flags() -> str:
    """The CPU's flags line from /proc/cpuinfo ("" where there is none): what -march=native builds for."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return ""
    return next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")


def _cpu_key() -> str:
    """What the compiled file depends on besides its sources: -march=native builds for this CPU."""
    return f"{platform.machine()} {platform.system()} {cpu_flags()}"


@functools.cache
def kernels(flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The compiled kernels, built on first use (a few seconds) and reused from the cache afterwards. flags:
    extra compiler flags (the tests build the portable paths with -mno-avx2; DOUBLE builds the row kernels alone,
    for float64). Raises ModelLoadError without a working C compiler."""
    double = DOUBLE[0] in flags
    sources = ROW_SOURCES if double else SOURCES
    source = b"".join(path.read_bytes() for path in (*sources, *HEADERS))
    digest = hashlib.sha256(source + _cpu_key().encode() + " ".join(flags).encode()).hexdigest()[:16]
    lib = default_cache_dir() / "kernels" / f"kernels-{digest}.so"
    if not lib.exists():
        _compile(lib, sources, flags)
    return opened(lib, double)


def opened(lib: Path, double: bool = False) -> ctypes.CDLL:
    """A built kernels library, its functions' signatures set (float64's where `double`)."""
    dll = ctypes.CDLL(str(lib))
    for name, (args, result) in signatures(ctypes.c_double if double else ctypes.c_float).items():
        function = getattr(dll, name)
        function.argtypes, function.restype = args, result
    return dll


def available(flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The kernels, or None where they cannot be built (the callers that have a torch path take it)."""
    try:
        return kernels(flags)
    except ModelLoadError:
        return None


def _compile(lib: Path, sources: tuple[Path, ...], flags: tuple[str, ...] = ()) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise ModelLoadError("--dtype q4 builds a small C kernel once and found no C compiler (cc, gcc or clang; "
                             "or set CC): install one, or use --dtype float32")
    lib.parent.mkdir(parents=True, exist_ok=True)
    base = [compiler, "-O3", "-march=native", *flags, "-shared", "-fPIC", *map(str, sources), "-lm"]
    with tempfile.TemporaryDirectory(dir=lib.parent) as scratch:
        built = Path(scratch) / lib.name
        # OpenMP where the compiler has it (gcc; torch's own libgomp is then shared), else one thread.
        for openmp in (["-fopenmp"], []):
            try:
                run = subprocess.run([*base, *openmp, "-o", str(built)], capture_output=True, text=True)
            except OSError as error:
                raise ModelLoadError(f"--dtype q4 could not run the C compiler {compiler}: {error}") from error
            if run.returncode == 0:
                built.replace(lib)  # atomic: a process loading it concurrently sees the whole file or none
                return
    raise ModelLoadError(f"--dtype q4: compiling the C kernels ({', '.join(p.name for p in sources)}) with "
                         f"{compiler} failed: {run.stderr.strip()[:400]}")


def sampler_rows(device: torch.device, vocab_size: int) -> RowKernel | None:
    """The sampler's C rows for a model on a CPU, where the kernels build; else None. Their rows of scores run for
    float32 logits only (RowKernel.runs); a float64 model takes their integer work, whose results do not depend on
    the logits' type: the noise's uniform draws, DRY's match lengths, no-repeat's followers (a fifth of a float64
    exactness test's sampling time went to the noise's torch operators)."""
    if device.type != "cpu":
        return None
    lib = available()
    return RowKernel(lib, vocab_size) if lib is not None else None
