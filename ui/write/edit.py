"""Edit and continue: the writer fixes the draft, and the model goes on from their version.

The editor opens on the whole text of a stopped draft (never while the worker writes; an instruction draft's
story, without its instruction). Saving stores the
edit as a new draft (Store.save_edit): the model's version stays as it was, and "Restore the model's
version" opens it again. Continue or Resume then re-prefills from the edited text.
"""

from __future__ import annotations

from storage import Conflict, NotFound, StoreError
from tokenswift.settings import SettingsError
from ui.display.live import ACTIVE, Watch, whole_text
from ui.drafts.drafts import DraftService
from ui.write.store_ops import WriteStore
from ui.write.write_parts import WriteParts
from ui.write.write_view import editing, problem, show_generation

# Saving swaps the (up to 40-line) editor for the shorter live view: a writer who scrolled down to Save was left
# looking at the charts below. The saved draft is brought back into view once the page has redrawn.
BACK_IN_VIEW = """() => setTimeout(() => {
  document.querySelector('#write-text')?.scrollIntoView({block: 'nearest'});
}, 100)"""


def wire(p: WriteParts, store: WriteStore, drafts: DraftService) -> None:
    """An edit is saved through `drafts` (ui/drafts/drafts.py), as the API's are."""
    fast = {"concurrency_limit": None}

    def open_editor(watch: Watch | None):
        if watch is None:
            return problem(p, "Edit: open a draft first (Library tab, or Start one).")
        watch.refresh(store)
        if watch.record.status in ACTIVE:
            return problem(p, "Edit: the model is still writing this draft; pause it first.")
        # An instruction draft's editor holds its story (whole_text): the instruction stays with the draft.
        story = " The instruction stays as it was: this is the story." if store.instruction(watch.gen_id) else ""
        return {**editing(p, whole_text(store, watch.gen_id)),
                p.status: "Editing: change anything, then **Save as a new revision**. The model's version is kept."
                          + story}

    def save(watch: Watch | None, text: str):
        if watch is None:
            return problem(p, "Edit: no draft is open.")
        try:
            revision = drafts.edit(watch.gen_id, text or "")
        except SettingsError as error:  # empty, unchanged, not Unicode, or starting with the instruction
            return problem(p, f"Edit: {error.reason}")
        except (ValueError, NotFound, StoreError) as error:  # Conflict is a ValueError
            return problem(p, f"Edit: {error}")
        then = "Resume" if revision.status == "paused" else "Continue"
        return {**show_generation(p, store, revision.id, fill_form=False),
                p.status: f"Saved your edit as Draft #{revision.id}; the model's version (#{watch.gen_id}) is kept. "
                          f"*{then}* writes on from your text."}

    def cancel(watch: Watch | None):
        return editing(p, None, watch.tail if watch else "")

    def restore(watch: Watch | None):
        if watch is None or watch.record.origin != "edit" or watch.record.parent_id is None:
            return problem(p, "Restore: this draft is not an edit of another one.")
        try:
            return show_generation(p, store, watch.record.parent_id, fill_form=False)
        except (Conflict, NotFound, StoreError) as error:
            return problem(p, f"Restore: {error}; the model's version was deleted in the Library.")

    p.edit.click(open_editor, p.watch, [p.editor, p.edit_row, p.text, p.status], api_name="write_edit", **fast)
    p.save_edit.click(save, [p.watch, p.editor], p.opened, api_name="write_save_edit",
                      **fast).then(None, js=BACK_IN_VIEW)
    p.cancel_edit.click(cancel, p.watch, [p.editor, p.edit_row, p.text], api_name="write_cancel_edit", **fast)
    p.restore.click(restore, p.watch, p.opened, api_name="write_restore", **fast)
