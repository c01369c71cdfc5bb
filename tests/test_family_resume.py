"""A continuation, a branch and an edit that keeps the start of a draft go on with the run that wrote that start, in the
app's own configuration (the default model in q4, the writing defaults, adaptive, one thread; the worker's code in this
process): Continue writes what a longer draft would have written, a branch what the draft would have written had it
taken the other token, and an edit that only cut the end off what the draft itself wrote after the cut.

Before, each of them was prefilled as a new prompt: other windows, and in q4 a prefill's rounding in place of the
steps', so the text parted from the draft's within a few dozen tokens (float64 rarely shows it: test_drafts.py and
test_branches.py keep their proofs there)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from test_worker import one_torch_thread

from storage import open_store
from storage.records import ModelSpec, Owner
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.settings import DraftSettings, writing_settings
from tokenswift.text.detok import IncrementalDetokenizer
from tokenswift.text.prompting import prompt_ids
from ui.api.api import create_app
from worker.job import FlushPolicy, JobRun

OPENING = "The lighthouse keeper's daughter had never seen the mainland. That winter, the supply boat"
SETTINGS = writing_settings(seed=21, max_new_tokens=60)
APP = EngineOptions(adaptive=True)  # the worker's; JobRun adds the alternatives


@pytest.fixture
def family(tmp_path, smollm2_q4, gguf_path):
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")

    def run_next() -> int:
        owner = Owner.here("test-worker")
        job = store.claim_next(owner)
        with one_torch_thread():
            outcome = JobRun(store, owner, job, smollm2_q4, ModelSpec(str(gguf_path), None, "cpu", "q4"),
                             FlushPolicy(0.0, 16), lambda: False, options=APP).run()
        assert outcome == "done", store.get_generation(job.id).error
        return job.id

    yield store, run_next, TestClient(create_app(store))
    store.close()


def text_of(lm, prompt: list[int], ids: list[int]) -> str:
    detok = IncrementalDetokenizer(lm.tokenizer, prompt)
    return detok.push(ids) + detok.flush()


def test_continue_branch_and_a_cut_go_on_as_the_draft_would(family, smollm2_q4):
    store, run_next, client = family
    lm, prompt = smollm2_q4, prompt_ids(smollm2_q4, OPENING)
    with one_torch_thread():
        straight = Generator(lm, SETTINGS.replace(max_new_tokens=100), prompt, options=APP).run()
    draft = store.enqueue_generation(OPENING, DraftSettings(SETTINGS)).id
    run_next()
    assert store.get_tokens(draft).generated_ids == straight[:60]

    # Continue: 40 more tokens are the longer draft's.
    more = store.continue_generation(draft, DraftSettings(SETTINGS.replace(max_new_tokens=40))).id
    run_next()
    assert store.get_tokens(more).generated_ids == straight[60:100]

    # An edit that cuts the draft back to its first 35 tokens, then Continue: the draft's own tokens from there.
    cut = store.save_edit(draft, OPENING + text_of(lm, prompt, straight[:35])).id
    after_cut = store.continue_generation(cut, DraftSettings(SETTINGS.replace(max_new_tokens=25))).id
    run_next()
    assert store.get_tokens(after_cut).prompt_ids == prompt + straight[:35]  # the draft's ids, not re-tokenized
    assert store.get_tokens(after_cut).generated_ids == straight[35:60]

    # A branch at a word with another likely token: what the draft's run writes on with that token.
    position = next(p for p in range(10, 60) if any(
        a["token"] != straight[p] for a in client.get(f"/api/generations/{draft}/alternatives",
                                                      params={"position": p}).json()["alternatives"]))
    view = client.get(f"/api/generations/{draft}/alternatives", params={"position": position}).json()
    other = next(a["token"] for a in view["alternatives"] if a["token"] != straight[position])
    made = client.post(f"/api/generations/{draft}/branch", json={"position": position, "token": other})
    assert made.status_code == 201, made.text
    run_next()
    with one_torch_thread():
        expected = Generator(lm, SETTINGS, prompt, generated_ids=straight[:position] + [other], options=APP).run()
    assert store.get_tokens(made.json()["id"]).generated_ids == expected[position:]


def test_a_draft_keeps_the_kv_cache_its_first_run_had(tmp_path, smollm2_q4, gguf_path):
    """A draft begun where the default cache was another (bf16 before the q8 kernels, or on another worker: q8
    where the CPU has the q8 vector loops, bf16 elsewhere) resumes after a pause, and is continued, over that cache on
    a worker whose default differs: the text is what one uninterrupted run over the first cache writes."""
    from tokenswift.model.loading import compact_cache

    settings = writing_settings(seed=4, max_new_tokens=150)
    here = smollm2_q4.kv_cache  # this worker's default: q8 with the vector loops (attention_q8_fast), else bf16
    first = compact_cache(smollm2_q4, "bf16" if here == "q8" else "q8")
    prompt = prompt_ids(smollm2_q4, OPENING)
    with one_torch_thread():
        straight = Generator(first, settings, prompt, options=APP).run()
        assert Generator(smollm2_q4, settings, prompt, options=APP).run() != straight  # the cache shows in the text
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")

    def run_next(lm, stop_after: int | None = None) -> tuple[int, str]:
        owner, events = Owner.here("test-worker"), iter(range(10**6))
        job = store.claim_next(owner)
        with one_torch_thread():
            outcome = JobRun(store, owner, job, lm, ModelSpec(str(gguf_path), None, "cpu", "q4"), FlushPolicy(0.0, 8),
                             lambda: stop_after is not None and next(events) >= stop_after, options=APP).run()
        return job.id, outcome

    draft = store.enqueue_generation(OPENING, DraftSettings(settings.replace(max_new_tokens=100))).id
    assert run_next(first, stop_after=20) == (draft, "released")  # the first run, then handed back mid-draft
    assert 0 < len(store.get_tokens(draft).generated_ids) < 100
    assert run_next(smollm2_q4) == (draft, "done")  # resumed by a worker whose default is the other cache
    assert store.get_tokens(draft).generated_ids == straight[:100]
    more = store.continue_generation(draft, DraftSettings(settings.replace(max_new_tokens=50))).id
    assert run_next(smollm2_q4) == (more, "done")  # its continuation too
    assert store.get_tokens(more).generated_ids == straight[100:150]
    store.close()


def test_a_draft_keeps_the_precision_its_first_run_had(tmp_path, smollm2_q4, gguf_path):
    """A draft begun in q4 (the app's CPU default), handed back midway, is resumed and then continued by a worker
    started with --dtype float32: both go on in q4 (a job keeps its precision as it keeps its model), so the text is
    what one uninterrupted q4 run writes. Before, the worker's own dtype ran them, and the default model's float32
    text parts from its q4 text at token 10 here."""
    from storage.records import Job
    from worker.config import WorkerConfig
    from worker.job import kept_dtype
    from worker.loop import Worker

    settings = writing_settings(seed=4, max_new_tokens=90)
    with one_torch_thread():
        straight = Generator(smollm2_q4, settings, prompt_ids(smollm2_q4, OPENING), options=APP).run()
    url = f"sqlite:///{tmp_path / 'studio.db'}"
    store = open_store(url)
    try:
        draft = store.enqueue_generation(OPENING, DraftSettings(settings.replace(max_new_tokens=60))).id
        owner, events = Owner.here("first"), iter(range(10**6))
        with one_torch_thread():  # the first run, in q4, handed back after a few flushes
            assert JobRun(store, owner, store.claim_next(owner), smollm2_q4, ModelSpec(str(gguf_path), None, "cpu",
                          "q4"), FlushPolicy(0.0, 8), lambda: next(events) >= 12, options=APP).run() == "released"
        assert 0 < len(store.get_tokens(draft).generated_ids) < 60
        later = Worker(store, WorkerConfig(db=url, device="cpu", dtype="float32", threads=1, flush_s=0.0,
                                           flush_tokens=8))
        store.register_worker(later.owner)
        with one_torch_thread():
            later._run(store.claim_next(later.owner))  # resumes the draft
            assert store.get_tokens(draft).generated_ids == straight[:60]
            more = store.continue_generation(draft, DraftSettings(settings.replace(max_new_tokens=30))).id
            later._run(store.claim_next(later.owner))  # and its continuation: the family's precision too
        assert store.get_tokens(more).generated_ids == straight[60:90]
    finally:
        store.close()
    # On another kind of device the text differs whatever the precision: there the worker's own runs it.
    ran = Job(1, OPENING, None, str(gguf_path), None, "{}", 0, 0.0, dtype="q4", device="cpu")
    assert (kept_dtype(ran, "cpu", "float32"), kept_dtype(ran, "cuda:0", "bfloat16")) == ("q4", "bfloat16")
