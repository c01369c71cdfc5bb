"""From a book's plan (storage/plans.py) to what the model sees when it writes a chapter, and to the book it exports.

A chapter is its own draft in the book. On a chat model (the default, SmolLM2-Instruct) it is an instruction draft:

* the **premise** and the **previous chapter's closing words** are the draft's Memory, which an instruction draft
  keeps in the system turn at the top of every window (tokenswift/text/context_window.pinned_ids): context that
  frames the whole chapter, however long, and that the writer can read and change in the Write tab;
* the **beats** are in the instruction, the user's turn, which also stays in every window: the task, in one short
  paragraph of prose (as a list, or after the previous chapter's text, the 135M default model copied the list's
  form or wrote chat). The chapter's text (the assistant's answer) starts clean, so neither the beats nor the
  previous chapter's words are exported as this chapter's text;
* the **characters** are the draft's World Info, one entry each (keys: its name and key words): an entry enters the
  window when the story names the character; one named in the chapter's title or beats is in view from the first
  word (constant for this chapter), since the beats are not story text that World Info searches.

A model without a chat template (the tests' stories260k) cannot take an instruction, so its chapter is an opening to
continue: the chapter's heading; the premise and the previous chapter's closing words are the Memory (pinned above
the story), and the beats the Author's Note (near the newest text, where a base model heeds them most).

The Author's Note of an instruction draft stays the writer's, and a chapter's draft is edited, continued and
exported like any other; a leading heading line in its text (the opening's, or one the model wrote) is not exported
twice: the chapter's title heads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bookexport import Book
from bookexport.chapters import heading_of
from storage.plans import Chapter, Character, Plan
from storage.records import GenerationRecord
from tokenswift.settings import DraftSettings
from tokenswift.text.world_info import Entry, WorldInfo
from ui.drafts.drafts import Context, DraftService
from ui.drafts.exports import book_identifier
from ui.drafts.tokens import PromptTokens

CLOSING_WORDS = 300  # of the previous chapter, given as context: about a page, a few hundred tokens


@dataclass(frozen=True)
class ChapterDraft:
    """A chapter's draft as the drafts service (ui/drafts/drafts.py) takes it."""

    prompt: str  # the instruction, or the opening (the chapter's heading)
    prompt_format: str  # "instruction" or "continue"
    memory: str
    authors_note: str
    world_info: str  # JSON ("" for none)


def heading(chapter: Chapter) -> str:
    return f"Chapter {chapter.position}: {chapter.title}"


def body(chapter: Chapter) -> str:
    """The chapter's text as exported: its draft's story without a leading heading line (the title heads it)."""
    text = chapter.story.lstrip()
    first, _, rest = text.partition("\n")
    return rest.lstrip() if heading_of(first) else text


def words(chapter: Chapter) -> int:
    return len(body(chapter).split())


def state(chapter: Chapter) -> str:
    """What the Plan tab and the API say of a chapter."""
    if chapter.status is None:
        return "not written"
    return {"queued": "writing", "running": "writing", "paused": "paused"}.get(chapter.status, "written")


def closing(text: str, count: int = CLOSING_WORDS) -> str:
    """The last `count` words of `text`, its line breaks kept, after "…" when it has more."""
    starts = [m.start() for m in re.finditer(r"\S+", text)]
    if len(starts) <= count:
        return text.strip()
    return "…" + text[starts[-count]:].strip()


def chapter_draft(plan: Plan, chapter: Chapter, chat: bool) -> ChapterDraft:
    """The draft that writes `chapter` of `plan`. chat: the model has a chat template (an instruction draft)."""
    previous = next((c for c in plan.chapters if c.position == chapter.position - 1), None)
    before = closing(body(previous)) if previous is not None and body(previous) else ""
    world = world_info(plan.characters, " ".join((chapter.title, *chapter.beats)))
    if not chat:
        memory = "\n\n".join(part for part in (plan.premise.strip(), before) if part)
        return ChapterDraft(f"{heading(chapter)}\n\n", "continue", memory,
                            f"This chapter: {'; '.join(chapter.beats)}" if chapter.beats else "", world)
    title = plan.book.title.strip()
    memory = "\n\n".join(part for part in (
        f"You are writing a novel, “{title}”." if title else "",
        f"Premise: {plan.premise.strip()}" if plan.premise.strip() else "",
        f"Chapter {previous.position}, “{previous.title}”, ends:\n\n{before}" if before else "") if part)
    what = f" What happens in it: {'; '.join(chapter.beats)}." if chapter.beats else ""
    follow = f", going on from where chapter {previous.position} ends" if before else ""
    ask = f"Write chapter {chapter.position} of the novel, “{chapter.title}”.{what}"
    return ChapterDraft(f"{ask} Write it as the novel's prose{follow}.", "instruction", memory, "", world)


def world_info(characters: tuple[Character, ...], named_in: str) -> str:
    """The characters as World Info entries (JSON); one named in `named_in` (the chapter's title and beats) is in
    view from the start."""
    entries = []
    for c in characters:
        keys = tuple(dict.fromkeys(k for k in (c.name, *c.keys) if k.strip()))
        content = f"{c.name}: {c.description}".strip() if c.description.strip() else c.name
        entry = Entry(keys, content)
        entries.append(Entry(keys, content, constant=entry.triggered(named_in)))
    return WorldInfo(tuple(entries)).to_json()


def plan_book(plan: Plan, title: str, author: str) -> Book:
    """The book as its chapters, in the plan's order, each under its heading; a chapter not written is left out."""
    chapters = tuple((heading(c), body(c)) for c in plan.chapters if c.draft_id is not None and body(c))
    return Book(title, author, "", identifier=book_identifier(plan.book.id), wrapped=False, chapters=chapters)


def can_follow_instructions(tokens: PromptTokens) -> bool:
    """Whether the model a new draft runs on has a chat template. Where its tokenizer cannot be read here, True:
    the default model has one, and a worker whose model has none fails the draft saying so."""
    target = tokens.target()
    has = None if target is None else tokens.use(target[0], lambda tokenizer, _: bool(
        getattr(tokenizer, "chat_template", None)))
    return True if has is None else has


def write_chapter(drafts: DraftService, chapter_id: int, settings: DraftSettings) -> GenerationRecord:
    """Queue the draft that writes the chapter (its prompt format is the chapter's: settings' is replaced); from
    now on it is the chapter's text. NotFound, Conflict (the chapter is being written), SettingsError or StoreError."""
    book_id, _ = drafts.store.chapter(chapter_id)
    plan = drafts.store.plan(book_id)
    chapter = next(c for c in plan.chapters if c.id == chapter_id)
    draft = chapter_draft(plan, chapter, can_follow_instructions(drafts.tokens))
    context = Context(draft.memory, draft.authors_note, draft.world_info)
    return drafts.start(draft.prompt, settings.replace(prompt_format=draft.prompt_format), book=book_id,
                        context=context, chapter_id=chapter_id)
