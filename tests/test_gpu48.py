"""Issue 48's one-call GPU measurement, rehearsed on a CPU (DRY_RUN_CPU=1): the script runs end to end and writes
the JSON a GPU session reads, with the syncs and replays of every TokenSwift run (CUDA's branch: 1 and 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_rehearsal_writes_every_number_the_gpu_run_reports(tmp_path):
    env = {**os.environ, "DRY_RUN_CPU": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu_issue48.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "issue48.json").read_text())
    assert result["dry_run"] and {"profile", "shape", "minutes_100k", "model_runs", "copy_gb_s"} <= result.keys()
    assert set(result["profile"]) == {"plain", "verify4"} and all(p["top"] for p in result["profile"].values())
    assert [r["context"] for r in result["shape"]] == [64, 256]
    assert all(set(r["verify_over_plain"]) == {"2", "4"} for r in result["shape"])
    # The rehearsal's contexts (64, 256) are extrapolated to the paper's 4K-104K: a noisy slope is clamped at 0 there.
    minutes = result["minutes_100k"]
    assert minutes["paper_tokenswift"] == 90.0 and minutes["tokenswift_paper_tau"] >= 0 and minutes["plain"] >= 0
    runs = result["model_runs"]
    assert [r["prompt_tokens"] for r in runs] == [32, 64]
    for r in runs:
        assert r["syncs_per_iteration"] == 1 and r["replays_per_iteration"] == 1
        assert r["plain_step"]["syncs_per_iteration"] == 1 and r["plain_step"]["replays_per_iteration"] == 1
        assert {"shapes", "plain_step_s"} <= r["pass_costs"].keys() and sum(r["verify_batches"].values()) > 0
    assert "syncs/it" in (tmp_path / "issue48.txt").read_text()


@pytest.mark.slow
def test_a_call_cut_short_keeps_the_parts_it_measured(tmp_path, monkeypatch):
    """The device call has a time limit: what ended before the cut (the profile, the 8B shape) is in the JSON."""
    from tokenswift.bench import gpu48
    from tokenswift.draft import drafting

    def cut(p):
        raise KeyboardInterrupt("the call's time ran out")

    monkeypatch.setattr(gpu48, "default_model", cut)
    devices = drafting.ONE_READ_DEVICES
    with pytest.raises(KeyboardInterrupt):
        gpu48.run(tmp_path, dry=True)
    assert drafting.ONE_READ_DEVICES is devices  # the rehearsal's CUDA branches end with it
    result = json.loads((tmp_path / "issue48.json").read_text())
    assert set(result["profile"]) == {"plain", "verify4"} and [r["context"] for r in result["shape"]] == [64, 256]
    assert "model_runs" not in result and result["seconds"] > 0
