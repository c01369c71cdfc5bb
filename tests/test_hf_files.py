"""Our reading of config.json and tokenizer.json against transformers' classes, and what loading imports."""

from __future__ import annotations

import json
import lzma
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import BOOKS, REPO
from tiny_models import BASE, CASES

from tokenswift.model.config import ModelConfig
from tokenswift.model.hf_files import CheckpointConfig, context_limit, load_tokenizer, read_config
from tokenswift.model.rope import rope_table

# config.json as older checkpoints and hand-written ones have it: legacy rope_scaling keys, fields left out.
WRITTEN = {
    "llama-bare": {"model_type": "llama"},
    "mistral-bare": {"model_type": "mistral"},
    "qwen2-bare": {"model_type": "qwen2"},
    "qwen2-window": {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 0},
    "llama-legacy-linear": {"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0},
                            "rope_theta": 500000.0, "max_position_embeddings": 4096},
    "llama-legacy-dynamic": {"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 4.0}},
    "llama3-outer-original": {"model_type": "llama", "original_max_position_embeddings": 1024,
                              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0}},
    "llama-head-dim": BASE | {"model_type": "llama", "head_dim": 32, "eos_token_id": [2, 5]},
}


def saved_config(name: str) -> dict:
    """config.json of a tiny reference model as save_pretrained writes it (only what differs from the class's
    defaults), or a hand-written one. Made in the test, not at collection: transformers' config classes pull in
    torch.distributed and sympy, 2 s in every process that collects this file."""
    from transformers import AutoConfig

    if name in WRITTEN:
        return WRITTEN[name]
    family, extra = CASES[name]
    return json.loads(AutoConfig.for_model(family, **(BASE | extra)).to_json_string())


@pytest.mark.parametrize("name", sorted([*CASES, *WRITTEN]))
def test_config_reads_as_transformers_does(name):
    from transformers import AutoConfig

    raw = saved_config(name)
    ours, reference = CheckpointConfig(raw), AutoConfig.for_model(**raw)
    assert ModelConfig.from_hf(ours) == ModelConfig.from_hf(reference)
    assert context_limit(ours) == context_limit(reference)
    small = dict(raw, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    for mine, theirs in zip(rope_table(CheckpointConfig(small), 300, "cpu", torch.float64),
                            rope_table(AutoConfig.for_model(**small), 300, "cpu", torch.float64), strict=True):
        assert torch.equal(mine, theirs)


def test_unsupported_and_broken_configs_say_so(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="unsupported model type 'gpt2'; supported: llama"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": ')
    with pytest.raises(ValueError):
        read_config(tmp_path)


def eval_texts() -> list[str]:
    with lzma.open(BOOKS / "eval.jsonl.xz", "rt") as lines:
        books = [json.loads(line)["text"][:12000] for line, _ in zip(lines, range(2), strict=False)]
    return books + ["  two  spaces\n\n\ttab", "naïve café — “quoted” ✓", "<s> inside </s> text", ""]


def test_tokenizer_encodes_and_decodes_as_auto_tokenizer(stories_path, tmp_path):
    from transformers import AutoTokenizer

    with_template = shutil.copytree(stories_path, tmp_path / "chat")
    config = json.loads((with_template / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    (with_template / "tokenizer_config.json").write_text(json.dumps(config))
    for path in (stories_path, with_template):
        ours, reference = load_tokenizer(path), AutoTokenizer.from_pretrained(path, local_files_only=True)
        for text in eval_texts():
            ids = reference(text).input_ids
            assert ours(text).input_ids == ids and ours.encode(text) == reference.encode(text)
            assert ours.decode(ids) == reference.decode(ids)
            assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
        assert (ours.bos_token_id, ours.eos_token_id, ours.all_special_ids) == (
            reference.bos_token_id, reference.eos_token_id, reference.all_special_ids)
    chat = [{"role": "user", "content": "Write."}, {"role": "assistant", "content": "Once"}]
    assert load_tokenizer(with_template).apply_chat_template(chat, tokenize=False) == "<user>Write.\n<assistant>Once\n"


def test_loading_a_model_imports_no_model_registry_and_no_compiler(stories_path):
    """transformers' model packages and torch._dynamo cost seconds in every process that loads a model (a worker,
    the CLI): loading and decoding need neither."""
    script = (f"import sys; from tokenswift.model.loading import load_model; from tokenswift.decode.generate "
              f"import Generator; from tokenswift.settings import Settings; "
              f"lm = load_model({str(stories_path)!r}, dtype='float64', threads=1); "
              f"Generator(lm, Settings(max_new_tokens=20), lm.encode('Once')).run(); "
              f"print(sorted(m for m in sys.modules if m.startswith(('transformers.models', 'torch._dynamo'))))")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"
