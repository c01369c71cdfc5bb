"""Which drafters a loaded model has (tokenswift/draft/choice.drafters), reported by the worker and worded in the
Model tab (ui/model/drafters.py): stories260k has none but n-grams, and the tab says how to train it a draft layer,
where the worker will find it, and how long that takes; the default model has its shipped draft layer, which auto
drafts with on a CPU."""

from __future__ import annotations

from conftest import REPO

from storage import open_store
from storage.records import ModelSpec, Owner
from tokenswift.draft.choice import Drafters, drafters
from ui.model.model import status
from worker.holder import ModelHolder


def test_stories260k_drafts_with_ngrams_alone_and_the_model_tab_says_how_to_train_a_layer(stories_path, tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    store.register_worker(Owner.here("w"))
    lm = ModelHolder(store, "w", threads=1).ensure(ModelSpec(str(stories_path), None, "cpu", "float64"))
    found = drafters(lm)
    assert found == Drafters(heads=0, layer_vocab=None, layer_problem=None, draft_model=None, auto="fused",
                             layer_home=str(stories_path / "draft"))
    assert Drafters.from_json(store.get_worker("w").drafters) == found  # as the worker reported it
    shown = status(store)
    assert "Auto drafts with n-grams of the text so far alone here" in shown
    assert f"train-draft --model {stories_path} --teacher" in shown and f"--out {stories_path / 'draft'}" in shown
    assert "--tokens 10000000 --threads 1" in shown and "draft-data --model" in shown
    assert "about 6 h 10 min (10,000,000 tokens at ~450 tokens/s on one)" in shown


def test_the_default_model_has_its_shipped_draft_layer(smollm2_q4, tmp_path):
    found = drafters(smollm2_q4)
    assert (found.heads, found.layer_vocab, found.layer_problem, found.auto) == (3, 8192, None, "layer")
    assert found.layer_home == str(REPO / "models" / "smollm2-135m-instruct" / "draft")
    store = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    store.register_worker(Owner.here("w"))
    store.report_model("w", ModelSpec(str(smollm2_q4.name), None, "cpu", "q4"), "ready", drafters=found.to_json())
    shown = status(store)
    assert "Auto drafts with the draft layer here" in shown and "train-draft" not in shown
