"""A chapter's draft: the one written for it (Store.enqueue_generation(chapter_id=)), and the one it follows to:
when the writer edits or continues the draft that is a chapter's text, the new draft becomes the chapter's text (the
old one stays in the Library). Apart from storage/plans.py so that the verbs that make those drafts
(storage/drafts.py, storage/repo.py) can call it without importing the plan's verbs."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from storage.errors import Conflict, NotFound
from storage.models import ChapterRow, GenerationRow


def follow_chapter(s: Session, parent_id: int, child_id: int) -> None:
    s.execute(update(ChapterRow).where(ChapterRow.draft_id == parent_id).values(draft_id=child_id))


def chapter_to_write(s: Session, chapter_id: int, session_id: int) -> ChapterRow:
    """The chapter a new draft is written for (locked): it must be the book's, and not being written already."""
    chapter = s.get(ChapterRow, chapter_id, with_for_update=True)
    if chapter is None or chapter.session_id != session_id:
        raise NotFound("chapter", chapter_id)
    draft = s.get(GenerationRow, chapter.draft_id) if chapter.draft_id is not None else None
    if draft is not None and draft.status in ("queued", "running"):
        raise Conflict(f"chapter {chapter.position} (“{chapter.title}”) is being written (draft {draft.id} is "
                       f"{draft.status}); pause or cancel it before writing the chapter again")
    return chapter
