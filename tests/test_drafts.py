"""Editing a draft and finding it again: the store's verbs, and a real worker (stories260k, float64) going
on from the writer's text exactly as plain decoding from that text would."""

from __future__ import annotations

import pytest

from storage import Conflict, open_store
from storage.records import ModelSpec, Owner, Progress
from tokenswift.settings import DraftSettings, Settings

OPENING = "Once upon a time, there was a little dog named Max."


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'studio.db'}")
    yield s
    s.close()


def stopped(store, text: str, finish: str, settings: DraftSettings | None = None, book=None,
            ids: tuple[list[int], list[int]] = ([1, 2, 3], [4, 5, 6])) -> int:
    """A draft the (fake) worker wrote `text` for, as (prompt, generated) ids, then paused or finished."""
    gen = store.enqueue_generation(OPENING, settings or DraftSettings(Settings(max_new_tokens=50)), session_id=book)
    owner = Owner.here("w")
    store.claim_next(owner)
    store.record_start(gen.id, owner, ids[0], "m", None)
    store.append_progress(gen.id, owner, Progress(ids[1], text, 0.1), finish=finish)
    return gen.id


def test_an_edit_is_a_new_revision_and_the_original_stays(store):
    parent = stopped(store, " He ran to the sea. The sun was hot.", "paused")
    edited = OPENING + " He ran to the old harbour. The sun was hot.\nThen it rained."
    revision = store.save_edit(parent, edited)
    assert (revision.parent_id, revision.origin, revision.status) == (parent, "edit", "paused")
    assert revision.target_tokens == 47 and revision.prompt_text == edited  # the 3 tokens written are spent
    assert store.get_generation(parent).text == " He ran to the sea. The sun was hot."  # nothing overwritten
    assert store.get_tokens(revision.id).prompt_ids == []  # the worker tokenizes the edited text afresh
    pieces = store.text_sources(revision.id)
    assert "".join(text for _, text in pieces) == edited
    assert pieces[0] == ("opening", OPENING)
    assert ("edit", "old harbour") in pieces and ("edit", "\nThen it rained.") in pieces
    assert ("ai", " He ran to the ") in pieces and ("ai", ". The sun was hot.") in pieces


def test_only_the_changed_words_of_a_paragraph_are_marked():
    """One word changed in a long paragraph marks that word: not the paragraph, nor the punctuation or the
    unchanged word that a changed word ran into."""
    from storage import provenance

    paragraph = " ".join(f"The boat number {i} came home, late, to the quiet harbour." for i in range(60))
    old = f"{OPENING}\n{paragraph}\nThe end."
    spans = [(provenance.OPENING, len(OPENING)), (provenance.MODEL, len(old) - len(OPENING))]

    def marked(new: str) -> list[str]:
        return [t for s, t in provenance.pieces(new, provenance.after_edit(old, spans, new)) if s == provenance.EDIT]

    assert marked(old.replace("number 30 came home,", "number 30 sailed home,")) == ["sailed"]
    assert marked(old.replace("number 7 came home, late,", "number 7 came home, very late,")) == [" very"]
    assert marked(old.replace("The end.", "The end and the rain.")) == [" and the rain"]


def test_edits_are_refused_while_writing_and_when_empty_or_unchanged(store):
    running = store.enqueue_generation(OPENING, DraftSettings(Settings(max_new_tokens=5)))
    store.claim_next(Owner.here("w"))
    with pytest.raises(Conflict, match="pause it before editing"):
        store.save_edit(running.id, "new text")
    done = stopped(store, " The end.", "done")
    with pytest.raises(ValueError, match="empty"):
        store.save_edit(done, "  \n")
    with pytest.raises(ValueError, match="nothing was changed"):
        store.save_edit(done, OPENING + " The end.")


def test_continue_after_an_edit_goes_on_from_the_writers_text(store):
    done = stopped(store, " The end.", "done")
    revision = store.save_edit(done, OPENING + " It was not the end.")
    assert (revision.status, revision.finish_reason) == ("done", "edit")
    child = store.continue_generation(revision.id, DraftSettings(Settings(max_new_tokens=20)))
    assert (child.origin, child.prompt_text, child.status) == ("continue", OPENING + " It was not the end.", "queued")
    assert [s for s, _ in store.text_sources(child.id)] == ["opening", "ai", "edit", "ai"]


def test_the_draft_to_offer_and_the_book_last_worked_on(store):
    assert store.resumable() is None and store.last_worked_book() is None
    harbour = store.create_session("The Harbour")
    paused = stopped(store, " text", "paused", book=harbour.id)
    store.create_session("Untitled")  # a newer, empty book (left behind by a deleted draft)
    assert store.resumable().id == paused
    assert store.last_worked_book() == harbour.id
    queued = store.enqueue_generation(OPENING, DraftSettings(Settings(max_new_tokens=5)), session_id=harbour.id)
    assert store.resumable().id == queued.id  # one being written (or next in line) comes first


def test_comparison_runs_stay_out_of_the_writers_books(store):
    """After a comparison the Library opened on its session and a Title/Author edit landed on it; a page load
    offered its running run to the Write tab."""
    from storage.models import COMPARISON

    harbour = store.create_session("The Harbour")
    stopped(store, " text", "done", book=harbour.id)
    compare = store.create_session("Compare: The storm…", kind=COMPARISON)
    stopped(store, " run", "done", book=compare.id)
    running = store.enqueue_generation(OPENING, DraftSettings(Settings(max_new_tokens=5)), session_id=compare.id)
    assert [b.id for b in store.list_sessions()] == [harbour.id]
    assert [b.id for b in store.list_sessions(COMPARISON)] == [compare.id]
    assert store.last_worked_book() == harbour.id
    assert store.resumable() is None  # a comparison's queued run is not the writer's draft
    assert store.get_generation(running.id, with_text=False).session_id == compare.id


@pytest.mark.slow
def test_tokenswift_after_an_edit_equals_plain_decoding_from_the_edited_text(store, stories64):
    """Resume of a paused draft and Continue of a finished one, both after an edit, through a real worker: the draft's
    own ids for the text the edit kept, the edited rest tokenized after them, and from there what plain decoding
    writes (resumed after the draft's ids, as the run that wrote them would go on)."""
    from speed import AR, speed

    from tokenswift.decode.generate import Generator
    from tokenswift.text.detok import IncrementalDetokenizer
    from worker import WorkerConfig
    from worker.loop import Worker

    text_settings, ts = Settings(seed=5, max_new_tokens=48, penalty=1.2, penalty_window=64), speed(ngram_topk=8)
    settings = DraftSettings(text_settings, ts.speculation)
    prompt = stories64.encode(OPENING)
    written = Generator(stories64, text_settings.replace(max_new_tokens=12), prompt, options=ts).run()
    detok = IncrementalDetokenizer(stories64.tokenizer, prompt)
    text = detok.push(written) + detok.flush()
    paused = stopped(store, text, "paused", settings, ids=(prompt, written))
    done = stopped(store, text, "done", settings, ids=(prompt, written))
    resumed = store.save_edit(paused, OPENING + text + " Max ran to the big red barn and")
    store.request_resume(resumed.id)
    edit = store.save_edit(done, OPENING + text[:-3])
    continued = store.continue_generation(edit.id, settings.replace(max_new_tokens=40))
    store.set_desired_model(ModelSpec(str(stories64.path), None, "cpu", "float64"))
    worker = Worker(store, WorkerConfig(worker_id="w", once=True, threads=1, poll_s=0.01))
    worker.holder._load = _reuse(worker.holder, stories64)
    worker.serve()
    for gen_id, new_tokens in ((resumed.id, 36), (continued.id, 40)):
        record, tokens = store.get_generation(gen_id), store.get_tokens(gen_id)
        assert record.status == "done", record.error
        kept = tokens.prompt_ids[len(prompt):]
        assert tokens.prompt_ids[:len(prompt)] == prompt and kept[:10] == written[:10]  # the draft's own ids
        assert stories64.tokenizer.decode(tokens.prompt_ids, skip_special_tokens=True) == record.prompt_text
        plain = Generator(stories64, text_settings.replace(max_new_tokens=len(kept) + new_tokens), prompt,
                          generated_ids=kept, options=AR)
        assert tokens.generated_ids == plain.run()[len(kept):]
        points = store.progress_since(gen_id).points  # the charts' n-gram line counts the tokens β counts
        assert points and all(p.plain_share is not None and ((p.beta or 0) == 0) == (p.ngram_hits == 0)
                              for p in points)
        assert points[-1].tokens == new_tokens  # the draft's own tokens, not the kept ones


def _reuse(holder, lm):
    """The session's float64 model instead of a second load (the holder still reports it as loaded)."""
    def load(spec):
        holder.model, holder.spec = lm, spec
        return lm
    return load
