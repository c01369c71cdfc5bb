"""The Write tab's alternatives and branches, wired: a click on a word shows the model's other likely tokens there,
picking one starts a branch and the tab follows it; the draft's family is listed to switch between (the parts and
the token view: ui/write/write_branches.py)."""

from __future__ import annotations

import gradio as gr

from storage import Conflict, NotFound, StoreError
from storage.errors import Invalid
from ui.display import views
from ui.display.live import Watch
from ui.drafts.branches import NoTokenizer, alternatives
from ui.drafts.drafts import DraftService
from ui.drafts.tokens import PromptTokens
from ui.write.store_ops import WriteStore
from ui.write.write_branches import BranchParts, family_choices, words_html
from ui.write.write_view import problem, show_generation

NOT_RECORDED = "No alternatives recorded for this part (it was written before they were recorded)."


def wire(p, store: WriteStore, tokens: PromptTokens, drafts: DraftService) -> None:
    """p: the tab's WriteParts (p.branching is write_branches.BranchParts); a branch starts through `drafts`."""
    b: BranchParts = p.branching
    fast = {"concurrency_limit": None}

    def refresh(gen_id: int | None):
        if gen_id is None:
            return {b.branches: gr.Dropdown(choices=[], value=None), b.words: "", **_cleared(b)}
        try:
            return {b.branches: gr.Dropdown(choices=family_choices(store, gen_id), value=gen_id),
                    b.words: words_html(store, tokens, gen_id), **_cleared(b)}
        except (NotFound, StoreError) as error:
            return {b.branches: gr.Dropdown(choices=[], value=None), b.words: "", **_cleared(b),
                    b.info: f"{views.dot('bad')} {error}"}

    def relist(watch: Watch | None):
        """A draft of the family ended: its line (status, length) in the list of branches changes."""
        try:
            return gr.Dropdown(choices=family_choices(store, watch.gen_id)) if watch is not None else gr.skip()
        except (NotFound, StoreError):
            return gr.skip()

    def look(watch: Watch | None, position):
        if watch is None or position is None:
            return _cleared(b)
        try:
            view = alternatives(store, tokens, watch.gen_id, int(position))
        except (Invalid, NotFound, NoTokenizer, StoreError) as error:
            return {**_cleared(b), b.info: f"{views.dot('bad')} {error}"}
        if not view["recorded"]:
            return {**_cleared(b), b.info: NOT_RECORDED}
        own = view["token"]
        options = [(f"{_shown(a['text'])} · {a['probability']:.1%}", a["token"]) for a in view["alternatives"]
                   if a["token"] != own]
        info = (f"At token {view['position']:,} the model wrote **{_shown(view['text'])}** "
                f"({view['probability']:.1%}). " + ("Its other likely words:" if options else
                                                     "It had no other likely word there (the sampler's filters "
                                                     "left only this one)."))
        return {b.info: info, b.choice: gr.Radio(choices=options, value=None), b.branch: gr.Button(interactive=False),
                b.at: view["position"]}

    def make_branch(watch: Watch | None, at, token):
        if watch is None or at is None or token is None:
            return problem(p, "Branch: click a word, then pick one of its alternatives.")
        try:
            gen = drafts.branch(watch.gen_id, at, int(token))
        except (Invalid, Conflict, NotFound, NoTokenizer, StoreError) as error:
            return problem(p, f"Branch: {error}")
        return {**show_generation(p, store, gen.id, fill_form=False),
                p.status: f"{views.dot('run')} Branched: Draft #{gen.id} takes the other word at token {at:,} of "
                          f"#{watch.gen_id} and writes on from it; the original is kept (see *Branches*)."}

    def switch(gen_id):
        if gen_id is None:
            return gr.skip()
        try:
            return show_generation(p, store, int(gen_id))
        except (NotFound, StoreError) as error:
            return problem(p, f"Branches: {error}")

    # A draft opened anywhere (Start, Library, a branch, page load) changes the remembered id: list its family.
    p.remembered.change(refresh, p.remembered, b.reset, api_name="write_branches_refresh", **fast)
    p.ended.change(relist, p.watch, b.branches, api_name="write_branches_relist", **fast)
    shown = lambda watch: refresh(watch.gen_id if watch else None)  # noqa: E731
    b.show.click(shown, p.watch, b.reset, api_name="write_words", **fast)
    b.box.expand(shown, p.watch, b.reset, **fast)  # opened: the draft as it is now
    b.look.click(look, [p.watch, b.position], b.reset[2:], api_name="write_alternatives", **fast)
    b.choice.input(lambda choice: gr.Button(interactive=choice is not None), b.choice, b.branch, **fast)
    b.branch.click(make_branch, [p.watch, b.at, b.choice], p.opened, api_name="write_branch", **fast)
    b.branches.input(switch, b.branches, p.opened, api_name="write_branch_switch", **fast)


def _cleared(b: BranchParts) -> dict:
    return {b.info: "", b.choice: gr.Radio(choices=[], value=None), b.branch: gr.Button(interactive=False), b.at: None}


def _shown(text: str) -> str:
    """A token's text, quoted so that its spaces show ("␣and")."""
    return "“" + text.replace(" ", "␣").replace("\n", "↵") + "”"
