"""The drafts service: what every front door does to a draft, done once. The Write, Library, Plan and Compare tabs,
the REST API (ui/api/api.py, ui/api/branch_api.py, ui/api/plan_api.py) and the OpenAI-compatible endpoint
(ui/api/openai_api.py) each parse their own input into DraftSettings (the text's Settings and the speed options) and
text, then start, continue, edit, branch or set the context of a draft here, where it is checked and queued.

One module, one class: the verbs share the store, the tokenizer cache and the check that the draft fits the model's
context, and nothing else. A refusal is a SettingsError naming the field by the API's name ("max_new_tokens",
"memory", "context_window"), whose `reason` is the same words for every front door: the API puts the field before it
(ui/api/api_input.settings_invalid), the UI the field's label (ui/forms/forms.labelled). DraftProblem marks the fields
that are the draft's own, not its settings. The store's own errors (NotFound, Conflict, StoreError) pass through: what
they mean depends on the door (a 404, a 409, a line in the status bar).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from storage import Conflict
from storage.records import GenerationRecord
from tokenswift.settings import DraftSettings, SettingsError
from ui.drafts.branches import decoded, text_after
from ui.drafts.limits import context_text_problem, target_problem, unicode_problem
from ui.drafts.store_ops import DraftsStore
from ui.drafts.tokens import PromptTokens


class DraftProblem(SettingsError):
    """A field of the draft itself (its prompt, Memory, Author's Note, edited text) is refused."""


@dataclass(frozen=True)
class Budget:
    """What a draft's length is checked against: the model's context and the tokens of the text it builds on (each
    None when this process cannot know it; the worker's own check is then the last word)."""

    context: int | None
    used: int | None


@dataclass(frozen=True)
class Context:
    """A draft's Memory, Author's Note and World Info (JSON, '' for none; None: leave it as it is)."""

    memory: str = ""
    authors_note: str = ""
    world_info: str | None = ""


class DraftService:
    def __init__(self, store: DraftsStore, tokens: PromptTokens):
        self.store, self.tokens = store, tokens

    # --- the checks -------------------------------------------------------------------------------------

    def budget(self, prompt: str | None = None, parent: int | None = None) -> Budget:
        """The budget of a new draft on `prompt`, counted with the model's tokenizer when this process can load it,
        or of a continuation of `parent`: its stored ids, or for a writer's edit that never ran, its text counted."""
        reported = next((w.max_context for w in self.store.list_workers() if w.max_context), None)
        if parent is not None:
            record = self.store.get_generation(parent, with_text=False)
            ids = self.store.get_tokens(parent).prompt_ids
            if ids or record.origin != "edit":
                return Budget(reported, len(ids) + record.produced_tokens)
            prompt = record.prompt_text
        measured = self.tokens.measure(prompt) if prompt is not None else None
        if measured is None:
            return Budget(reported, None)
        return Budget(measured.context or reported, measured.tokens)

    def check(self, asked: DraftSettings, *, prompt: str | None = None, parent: int | None = None,
              budget: Budget | None = None) -> None:
        """The target's size, the context window the settings ask for, and, with context shifting off, the text the
        draft builds on (`prompt`, `parent`'s, or `budget` counted already) + its target within the model's context
        (Settings.check_fits, the engine's rule). Nothing is counted while shifting is on: any length fits. (The
        speed options were checked when `asked` was made; the worker resolves the drafter.)"""
        settings = asked.settings
        if problem := target_problem(settings.max_new_tokens):
            raise DraftProblem("max_new_tokens", problem)
        windowed = settings.context_window is not None or settings.shift_step is not None
        if windowed and (context := self._model_context()):  # else the model's own window: fits any model
            settings.window(context)
        if settings.context_shift is False:
            budget = budget or self.budget(prompt, parent)
            settings.check_fits(budget.used, budget.context)

    def _model_context(self) -> int | None:
        """The context of the model a new draft runs on: as a worker reported it, else from its config here."""
        target = self.tokens.target()
        return target and (target[1] or self.tokens.use(target[0], lambda _tokenizer, context: context))

    @staticmethod
    def check_context(context: Context) -> None:
        """Memory and Author's Note the store can keep and that leave room for the story."""
        for field, text in (("memory", context.memory), ("authors_note", context.authors_note)):
            if problem := context_text_problem(text):
                raise DraftProblem(field, problem)

    # --- the verbs --------------------------------------------------------------------------------------

    def start(self, prompt: str, settings: DraftSettings, *, book: int | Callable[[], int] | None = None,
              context: Context = Context(), prompt_ids: list[int] | None = None, chapter_id: int | None = None,
              budget: Budget | None = None) -> GenerationRecord:
        """A new draft on `prompt` in `book`: its id, or a function that gives it once the draft passed its checks
        (the Write tab makes or renames its book only then); None: a book of its own. budget: the prompt's, when
        the caller has it (Compare queues several drafts on one prompt)."""
        if problem := unicode_problem(prompt):
            raise DraftProblem("prompt", problem)
        if not prompt.strip():
            raise DraftProblem("prompt", "must not be empty")
        self.check_context(context)
        self.check(settings, prompt=prompt, budget=budget)
        return self.store.enqueue_generation(
            prompt, settings, session_id=book() if callable(book) else book, memory=context.memory,
            authors_note=context.authors_note, world_info=context.world_info or "", prompt_ids=prompt_ids,
            chapter_id=chapter_id)

    def continue_from(self, gen_id: int, settings: DraftSettings, *, book: int | None = None,
                      context: Context | None = None) -> GenerationRecord:
        """A draft that writes on from `gen_id`'s text, in its book (or `book`), with its Memory, Author's Note and
        World Info, or `context` given."""
        if context is not None:
            self.check_context(context)
        self.check(settings, parent=gen_id)
        child = self.store.continue_generation(gen_id, settings, session_id=book)
        return child if context is None else self.set_context(child.id, context)

    def edit(self, gen_id: int, text: str) -> GenerationRecord:
        """The writer's version of a stopped draft, a new draft (Store.save_edit): for an instruction draft, its
        story alone."""
        if problem := unicode_problem(text):
            raise DraftProblem("text", problem)
        if (instruction := self.store.instruction(gen_id)) and text.startswith(instruction):
            raise DraftProblem("text", "starts with the draft's instruction: send its story alone (the instruction "
                                       "stays as it was)")
        try:
            return self.store.save_edit(gen_id, text)
        except Conflict:
            raise
        except ValueError as error:  # empty or unchanged
            raise DraftProblem("text", str(error)) from None

    def branch(self, gen_id: int, position: int, token: int, max_new_tokens: int | None = None) -> GenerationRecord:
        """A branch of `gen_id` taking `token` (one of the alternatives recorded there) at `position`
        (storage.branches.BranchVerbs.branch), its texts decoded with the draft's model's tokenizer: NoTokenizer
        where it cannot be loaded here."""
        if max_new_tokens is not None and (problem := target_problem(max_new_tokens)):
            raise DraftProblem("max_new_tokens", problem)
        at = self.store.token_at(gen_id, position)

        def texts(tokenizer) -> tuple[str, str]:
            prefix = at.text_before + text_after(tokenizer, at.context, at.lead)
            return prefix, text_after(tokenizer, at.context + at.lead, [token])

        prefix, token_text = decoded(self.tokens, at.model, texts)
        return self.store.branch(gen_id, position, token, prefix, token_text, max_new_tokens)

    def set_context(self, gen_id: int, context: Context) -> GenerationRecord:
        """The draft's Memory, Author's Note and World Info; a running draft takes them at its next shift or
        resume."""
        self.check_context(context)
        return self.store.set_context_text(gen_id, context.memory, context.authors_note, context.world_info)
