"""K-quant GGUF files made here (issue 47), with the project's reference quantizer (tokenswift/model/kquant_ref.py):

    .venv/bin/python scripts/make_kquant_files.py --out runs/kquant
        the default model re-quantized: SmolLM2-135M-Instruct.Q4_K_M.gguf, .Q5_K_M.gguf, .Q6_K.gguf
    .venv/bin/python scripts/make_kquant_files.py --out runs/kquant --shapes llama3.2-1b,llama3.1-8b
        random weights in Q4_K_M at those models' shapes, for speed and memory (no text: their tokens are the
        default model's, padded with reserved ones to the shape's vocabulary)

The mixes are llama.cpp's: Q4_K_M is Q4_K with Q6_K for the head and for attn_v and ffn_down in the layers that
get more bits (the first and last eighth, and every third between); Q5_K_M the same over Q5_K; Q6_K all Q6_K.
A tensor whose rows are not a multiple of 256 falls back as llama.cpp's does: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to
Q8_0 (the default model's 576-wide rows: its attention and gate/up become Q5_0 in Q4_K_M).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as the other scripts are
from tokenswift.model import kquant_ref  # noqa: E402
from tokenswift.model.default_model import default_model_path  # noqa: E402

MIXES = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K"}  # mix -> its base kind
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
SHAPES = {  # name -> (vocab, dim, layers, heads, kv heads, intermediate, tied, rope theta)
    "llama3.2-1b": (128256, 2048, 16, 32, 8, 8192, True, 500000.0),
    "llama3.1-8b": (128256, 4096, 32, 32, 8, 14336, False, 500000.0),
}


def more_bits(layer: int, layers: int) -> bool:
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def mix_kind(name: str, cols: int, layers: int, mix: str, has_output: bool) -> str:
    """The block kind `mix` gives tensor `name` (a matrix of rows `cols` wide)."""
    kind = MIXES[mix]
    head = name == "output.weight" or (name == "token_embd.weight" and not has_output)
    if head:
        kind = "Q6_K"
    elif mix != "Q6_K" and name.startswith("blk.") and name.split(".")[2] in ("attn_v", "ffn_down"):
        kind = "Q6_K" if more_bits(int(name.split(".")[1]), layers) else kind
    return FALLBACK[kind] if cols % kquant_ref.QK_K else kind


def requantize(source: Path, out: Path, mix: str) -> None:
    """The GGUF file `source` with every matrix re-quantized to `mix`, its metadata copied."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name in ("general.architecture", "general.file_type") or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{mix}"])
    layers = reader.fields[f"{arch}.block_count"].contents()
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    for tensor in reader.tensors:
        cols, *rest = (int(n) for n in tensor.shape)
        weight = dequantize(tensor.data, tensor.tensor_type).reshape(int(np.prod(rest or [1])), cols)
        if not rest:  # norms stay float32
            writer.add_tensor(tensor.name, weight.reshape(-1).astype(np.float32))
            continue
        kind = mix_kind(tensor.name, cols, layers, mix, has_output)
        writer.add_tensor(tensor.name, kquant_ref.quantize(weight, kind), raw_dtype=Q[kind])
    _finish(writer)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """rows x cols weights of `kind` as random bits with float16 scales of a trained model's size (weights of
    about 0.02): what decoding costs depends on the shapes and kinds, not on the values."""
    per, size = gguf.GGML_QUANT_SIZES[Q[kind]]
    blocks = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    scales = {"Q4_K": ((0, 2e-4), (2, 2e-4)), "Q6_K": ((208, 2e-5),), "Q5_0": ((0, 2e-3),),
              "Q5_1": ((0, 2e-3), (2, -0.03)), "Q8_0": ((0, 2e-4),)}[kind]
    for at, value in scales:
        blocks[:, :, at:at + 2] = np.array([value], dtype=np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def random_shape(out: Path, shape: str, seed: int = 0) -> None:
    """A Q4_K_M file of random weights at `shape`, written a tensor at a time (an 8B one never whole in memory)."""
    vocab, dim, layers, heads, kv_heads, inner, tied, theta = SHAPES[shape]
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(f"random {shape}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for add, value in ((writer.add_context_length, 131072), (writer.add_embedding_length, dim),
                       (writer.add_block_count, layers), (writer.add_feed_forward_length, inner),
                       (writer.add_head_count, heads), (writer.add_head_count_kv, kv_heads),
                       (writer.add_rope_freq_base, theta), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_rope_dimension_count, dim // heads), (writer.add_vocab_size, vocab)):
        add(value)
    _tokenizer(writer, vocab)
    head_dim = dim // heads
    matrices = {"token_embd.weight": (vocab, dim)} | ({} if tied else {"output.weight": (vocab, dim)})
    for i in range(layers):
        matrices |= {f"blk.{i}.attn_q.weight": (dim, dim), f"blk.{i}.attn_k.weight": (kv_heads * head_dim, dim),
                     f"blk.{i}.attn_v.weight": (kv_heads * head_dim, dim), f"blk.{i}.attn_output.weight": (dim, dim),
                     f"blk.{i}.ffn_gate.weight": (inner, dim), f"blk.{i}.ffn_up.weight": (inner, dim),
                     f"blk.{i}.ffn_down.weight": (dim, inner)}
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(layers) for n in ("attn_norm", "ffn_norm")]
    kinds = {name: mix_kind(name, cols, layers, "Q4_K_M", not tied) for name, (_, cols) in matrices.items()}
    for name, (rows, cols) in matrices.items():
        per, size = gguf.GGML_QUANT_SIZES[Q[kinds[name]]]
        writer.add_tensor_info(name, (rows, cols // per * size), np.dtype(np.uint8), rows * cols // per * size,
                               raw_dtype=Q[kinds[name]])
    for name in norms:
        writer.add_tensor_info(name, (dim,), np.dtype(np.float32), dim * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, (rows, cols) in matrices.items():
        writer.write_tensor_data(random_blocks(kinds[name], rows, cols, rng))
    for _ in norms:
        writer.write_tensor_data(np.ones(dim, dtype=np.float32))
    writer.close()


def _tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    """The default model's tokenizer, its list padded with reserved control tokens to `vocab` (as Llama 3 pads)."""
    reader = gguf.GGUFReader(default_model_path())
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer.") or field.name == "tokenizer.chat_template":
            continue
        value, kind = field.contents(), field.types[0]
        if field.name == "tokenizer.ggml.tokens":
            value = value + [f"<|reserved_{i}|>" for i in range(vocab - len(value))]
        elif field.name == "tokenizer.ggml.token_type":
            value = value + [3] * (vocab - len(value))
        writer.add_key_value(field.name, value, kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the files into")
    parser.add_argument("--mixes", default=",".join(MIXES), help=f"default model mixes (default: all of {list(MIXES)})")
    parser.add_argument("--shapes", default="", help=f"random-weight Q4_K_M files, of {', '.join(SHAPES)}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    source = default_model_path()
    for mix in filter(None, args.mixes.split(",")):
        out = args.out / source.name.replace(".Q4_1.", f".{mix}.")
        requantize(source, out, mix)
        print(f"{out}  {out.stat().st_size / 1e6:.1f} MB")
    for shape in filter(None, args.shapes.split(",")):
        out = args.out / f"random-{shape}.Q4_K_M.gguf"
        random_shape(out, shape)
        print(f"{out}  {out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
