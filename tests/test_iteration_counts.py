"""Issue 48 on a CPU: the host syncs and pass calls (graph replays on CUDA) of one plain step and one TokenSwift
iteration on the fast path, the code a GPU runs (bench/counting.py), counted exactly so that one more fails here.

On CUDA (drafting.ONE_READ_DEVICES) the drafts are ranked with one host read for every depth, and the fused
drafter's are made inside the pass that samples the root (device_drafts.py); the tests add the CPU to that set to
run the CUDA branch, and check both propose the very tokens of the host's ranking.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tokenswift.bench.counting import counting, per_step
from tokenswift.bench.shapes import preset, random_heads, random_model
from tokenswift.decode import clock
from tokenswift.decode.engine import Engine
from tokenswift.decode.options import EngineOptions
from tokenswift.draft import build, drafting
from tokenswift.model import fastpath
from tokenswift.model.fastpath import FastOptions
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Settings, Speculation

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
SAMPLING = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)
# Per plain step: the token's read, one replay, the host's torch calls around it (the pass's three input writes and
# the token's pinned upload; views included), and the torch calls inside the pass (this 2-layer model; views and
# attribute reads included): an upper bound on the kernels its CUDA graph replays, so a launch added fails here.
AR = {"syncs": 1, "replays": 1, "outside": 11, "inside": 281}
# Per TokenSwift iteration on CUDA's branch. Fused: one read, of the targets and every row's next drafts together,
# one replay (the verify graph drafts too). Paper: its draft pass runs over the partial cache from the root, which
# the host learns from the verify pass's read, and the trie is built on the host from its drafts: two reads, two
# replays.
TS = {"fused": {"syncs": {"fastpath.py": 1.0}, "replays": 1},
      "paper": {"syncs": {"drafting.py": 1.0, "fastpath.py": 1.0}, "replays": 2}}


@pytest.fixture(scope="module")
def lm():
    model = random_model("llama3.1-8b", *preset("llama3.1-8b", tiny=True), "cpu", torch.float64)
    return dataclasses.replace(model, heads=random_heads(model.config, "cpu", torch.float64, seed=2))


@pytest.fixture(autouse=True)
def gpu_sampler(monkeypatch):
    """No C rows for the sampler, as on a GPU: a CPU's ranks the noise of a few tokens on the host."""
    monkeypatch.setattr("tokenswift.decode.engine.sampler_rows", lambda *args: None)


@pytest.fixture(autouse=True)
def probes_apart(monkeypatch):
    """The counted iterations meet no AR probe: the first comes in the warm-up (engine()) and the next 8 s later,
    where the early probes that settle time saved (clock.EARLY_PROBE_S) would come every quarter of a second."""
    monkeypatch.setattr(clock, "EARLY_PROBE_S", clock.PROBE_INTERVAL_S)


@pytest.fixture
def cuda_branch(monkeypatch):
    monkeypatch.setattr(drafting, "ONE_READ_DEVICES", frozenset({"cuda", "cpu"}))


def engine(lm, mode: str, drafter: str = "paper", adaptive: bool = False, **sampling) -> Engine:
    s = Settings(max_new_tokens=200, seed=2, ignore_eos=True, **(sampling or SAMPLING))
    prompt = list(range(5, 60))
    spec = Speculation(ngram_topk=5, tree=(1, 2, 2), budget=48, drafter=drafter, mode=mode)
    options = EngineOptions(fast=FastOptions(attention="sdpa", bucket=4096), adaptive=adaptive, speculation=spec)
    e = Engine(lm, s, prompt, len(prompt), options)
    e.start()
    step = e.ts_step if mode == "tokenswift" else e.ar_step
    for _ in range(5):  # past the first AR probe and the captures
        step()
    return e


def test_a_plain_step_is_one_replay_and_one_sync(lm):
    e = engine(lm, "ar")
    with counting() as counts:
        for _ in range(10):
            e.ar_step()
    assert counts.syncs == {"fastpath.py": 10 * AR["syncs"]}
    assert counts.replays == 10 * AR["replays"]
    assert sum(counts.outside.values()) == 10 * AR["outside"]
    assert sum(counts.inside.values()) == 10 * AR["inside"], counts.inside


def test_every_layer_of_a_plain_step_runs_inside_its_pass(lm, monkeypatch):
    """No Python between layers: each layer's forward happens inside the pass call (a CUDA graph's replay)."""
    e = engine(lm, "ar")
    outside = []
    layer_type = type(lm.model.model.layers[0])
    forward = layer_type.forward
    with counting() as counts:
        monkeypatch.setattr(layer_type, "forward",
                            lambda self, *a, **k: outside.append(not counts.in_pass) or forward(self, *a, **k))
        e.ar_step()
    assert len(outside) == lm.config.n_layers and not any(outside)


@pytest.mark.parametrize("drafter", ["fused", "paper"])
def test_a_fused_tokenswift_iteration_reads_the_host_once(lm, cuda_branch, drafter):
    counts = per_step(engine(lm, "tokenswift", drafter).ts_step, 10)
    assert counts["syncs_by_file"] == TS[drafter]["syncs"]
    assert counts["replays_per_iteration"] == TS[drafter]["replays"]


@pytest.mark.parametrize("sampling", [SAMPLING, dict(temperature=0.0, penalty=1.3, penalty_window=64)])
def test_the_drafts_made_in_the_passes_are_the_host_drafts_and_the_text_is_plain_decodings(lm, cuda_branch,
                                                                                          sampling):
    """After every verify pass and every plain step of the adaptive policy, the fused drafter holds the drafts the
    pass made below the accepted node; they are the ones it would rank on the host from the state it observed, and
    the run writes plain decoding's tokens."""
    e = engine(lm, "tokenswift", "fused", adaptive=True, **sampling)
    e.policy.plain_next = lambda: False  # every plain step makes the next drafts (a plain stretch skips them)
    for n in range(12):
        with torch.inference_mode():  # as ts_step runs it
            e._plain_step(warm=True) if n % 3 == 2 else e.ts_step()
        made, d = e.drafter.ready, e.drafter
        assert made is not None and len(made) == len(d.widths)
        d.ready = None
        host = d.propose(e.root, e.length, e._history(e.length + 1, []), len(d.widths), e.length + 1 + e.window.offset)
        assert made == host
    ar = engine(lm, "ar", **sampling)
    while len(ar.ids) < len(e.ids):
        ar.ar_step()
    assert ar.ids[:len(e.ids)] == e.ids


@pytest.mark.parametrize("extra", ["sync", "replay"])
def test_one_more_sync_or_replay_fails_the_count(lm, cuda_branch, monkeypatch, extra):
    """The counts see an `.item()` or a pass call added to the verify step."""
    verify = fastpath.FastPasses.verify

    def more(self, trie, start, t):
        out = verify(self, trie, start, t)
        if extra == "sync":
            out[0][0, 0].item()
        else:
            self.sampled_last()
        return out

    monkeypatch.setattr(fastpath.FastPasses, "verify", more)
    counts = per_step(engine(lm, "tokenswift").ts_step, 4)
    assert counts["syncs_per_iteration"] + counts["replays_per_iteration"] == 2 + TS["paper"]["replays"] + 1


def test_a_fused_iteration_that_drafts_on_the_host_again_fails_the_count(lm, cuda_branch, monkeypatch):
    """Without the pass's drafts the fused drafter ranks on the host: one read more per iteration, which the count
    sees."""
    monkeypatch.setattr(build, "DeviceDrafts", lambda drafter, draw: None)
    counts = per_step(engine(lm, "tokenswift", "fused").ts_step, 6)
    assert counts["syncs_per_iteration"] == 2


def test_the_one_read_ranking_proposes_the_per_depth_ranking_tokens(monkeypatch):
    """The CUDA branch changes the host reads, not the proposals: the same tokens, with a draft vocabulary or
    without, with filters that leave a depth fewer tokens than its width."""
    vocab_size, g = 300, torch.Generator().manual_seed(4)
    logits = torch.randn(3, vocab_size, generator=g, dtype=torch.float64) * 4
    window = torch.randint(vocab_size, (1, 40), generator=g)
    widths = [1, 3, 40]
    for settings in (Settings(seed=9, **SAMPLING), Settings(seed=9, temperature=1.0, top_p=0.9)):
        sampler = Sampler(settings, vocab_size, "cpu")
        for vocab in (None, torch.randperm(vocab_size, generator=g)[:120].sort().values):
            columns = logits if vocab is None else logits[:, vocab]
            per_depth = drafting.best_per_depth(columns, sampler, window, widths, 77, vocab)
            monkeypatch.setattr(drafting, "ONE_READ_DEVICES", frozenset({"cpu"}))
            one_read = drafting.best_per_depth(columns, sampler, window, widths, 77, vocab)
            monkeypatch.setattr(drafting, "ONE_READ_DEVICES", frozenset({"cuda"}))
            assert one_read == per_depth and len(per_depth[2]) < 40
