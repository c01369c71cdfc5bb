"""Store verbs for alternatives and branches: the model's other likely tokens at a position of a draft, and a branch
that takes one of them and writes on from there.

A branch is a new draft in the same book (origin "branch", parent = the draft it leaves), so the original stays as
it was. Its prompt is the original's prompt and generated ids up to the chosen position, and the chosen token is
its first generated chunk, with the alternatives it was chosen from (the original's at that position: the same
history). The worker then resumes it from that token with the original's settings, as it resumes any draft from
its stored ids. A branch of a branch belongs to the same family: the original and every branch below it.

Deleting: a branch goes like any draft. An original (or a branch) with branches is refused: its branches hang from
it, and deleting it would leave them apart from their family without the writer having said so; delete the
branches first (each one's text stays whole until then: its prompt holds the text it shares).

Token texts need the model's tokenizer, which the store does not have: the caller decodes (ui/drafts/branches.py).

Mixed into storage.repo.Store (it provides _read/_write), like storage.drafts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import alternatives, provenance
from storage.alternatives import Choices
from storage.errors import Conflict, Invalid, NotFound
from storage.models import ChunkRow, GenerationRow, SessionRow
from storage.records import GenerationRecord, from_row, in_sql_range, pack_ids, unpack_ids, utcnow

BRANCH = "branch"
CONTEXT_IDS = 4  # ids before a token that its text is decoded after (tokenswift.text.detok keeps as many)


@dataclass(frozen=True)
class TokenAt:
    """One generated token of a draft, with what it takes to decode it (and text up to it) in context."""

    gen_id: int
    position: int  # index among the draft's generated tokens
    token: int
    choices: Choices | None  # None: no alternatives recorded for this part (a chunk written before they were)
    model: str | None
    text_before: str  # the generated text of the chunks before the token's chunk
    context: list[int]  # the CONTEXT_IDS ids before the token's chunk (prompt ids for the first chunk)
    lead: list[int]  # the chunk's ids before the token


@dataclass(frozen=True)
class Span:
    """Generated tokens from `start` on, for a token view."""

    start: int
    context: list[int]  # the ids before `start` (up to CONTEXT_IDS)
    ids: list[int]
    recorded: list[bool]  # whether each token's alternatives were recorded


@dataclass(frozen=True)
class Branch:
    record: GenerationRecord
    position: int | None  # where it leaves its parent (a generated-token index of the parent); None: the original


class BranchVerbs:
    def token_at(self, gen_id: int, position: int) -> TokenAt:
        with self._read() as s:
            row = _generation(s, gen_id)
            chunk = _chunk_at(s, row, position)
            ids = unpack_ids(chunk.token_ids)
            offset = position - chunk.token_start
            choices = alternatives.unpack(chunk.alternatives)[offset] if chunk.alternatives is not None else None
            earlier = select(ChunkRow).where(ChunkRow.generation_id == gen_id, ChunkRow.seq < chunk.seq)
            before = list(s.scalars(earlier.order_by(ChunkRow.seq)))
            context = unpack_ids(row.prompt_ids) + [t for c in before[-CONTEXT_IDS:] for t in unpack_ids(c.token_ids)]
            return TokenAt(gen_id, position, ids[offset], choices, row.model, "".join(c.text for c in before),
                           context[-CONTEXT_IDS:], ids[:offset])

    def span(self, gen_id: int, start: int) -> Span:
        """The generated tokens from `start` (clamped to the draft's) to the end."""
        with self._read() as s:
            row = _generation(s, gen_id)
            query = select(ChunkRow.token_start, ChunkRow.token_ids, ChunkRow.alternatives.is_not(None))
            chunks = s.execute(query.where(ChunkRow.generation_id == gen_id).order_by(ChunkRow.seq)).all()
            ids = unpack_ids(row.prompt_ids)
            recorded: list[bool] = []
            for _, packed, has in chunks:
                new = unpack_ids(packed)
                ids += new
                recorded += [has] * len(new)
            start = max(0, min(start, len(recorded)))
            cut = len(ids) - len(recorded) + start
            return Span(start, ids[max(0, cut - CONTEXT_IDS):cut], ids[cut:], recorded[start:])

    def branch(self, gen_id: int, position: int, token: int, prefix_text: str, token_text: str,
               max_new_tokens: int | None = None) -> GenerationRecord:
        """A new draft: `gen_id`'s text up to `position`, then `token` (one of the alternatives recorded there), then
        as many tokens as the original's target has left after it (or max_new_tokens), with its settings.
        prefix_text: the generated text before `position`; token_text: the token's text after it."""
        with self._write() as s:
            parent = _generation(s, gen_id, lock=True)
            chunk = _chunk_at(s, parent, position)
            offset = position - chunk.token_start
            choices = alternatives.unpack(chunk.alternatives)[offset] if chunk.alternatives is not None else None
            _check_choice(choices, unpack_ids(chunk.token_ids)[offset], token)
            left = parent.target_tokens - position - 1 if max_new_tokens is None else max_new_tokens
            if left < 0 or not in_sql_range(left):
                raise Invalid("max_new_tokens", "must be >= 0")
            row = _branch_row(parent, prefix_text, left)
            generated = generated_ids(s, gen_id)
            row.prompt_ids = pack_ids(unpack_ids(parent.prompt_ids) + generated[:position])
            row.resume_from = parent.written_from()  # the run goes on as the original's would have, with the token
            s.add(row)
            s.flush()
            # The token is the branch's first chunk; its alternatives are those it was chosen from.
            s.add(ChunkRow(generation_id=row.id, seq=0, token_start=0, token_ids=pack_ids([token]), text=token_text,
                           source="ai", created_at=utcnow(), alternatives=alternatives.pack([choices])))
            s.get(SessionRow, parent.session_id).updated_at = utcnow()
            s.flush()
            return from_row(GenerationRecord, row)

    def branches(self, gen_id: int) -> list[Branch]:
        """The family of `gen_id`: its original first, then every branch below it, each after its parent."""
        with self._read() as s:
            row = _generation(s, gen_id)
            while row.origin == BRANCH and row.parent_id is not None:
                row = _generation(s, row.parent_id)
            family, queue = [Branch(from_row(GenerationRecord, row), None)], [row]
            while queue:
                parent = queue.pop(0)
                query = select(GenerationRow).where(GenerationRow.parent_id == parent.id,
                                                    GenerationRow.origin == BRANCH).order_by(GenerationRow.id)
                for child in s.scalars(query):
                    at = (len(child.prompt_ids) - len(parent.prompt_ids)) // 4  # packed int32 ids
                    family.append(Branch(from_row(GenerationRecord, child), at))
                    queue.append(child)
            return family


def refuse_with_branches(s: Session, row: GenerationRow) -> None:
    """Deleting a draft with branches is refused (see the module's docstring)."""
    query = select(func.count()).where(GenerationRow.parent_id == row.id, GenerationRow.origin == BRANCH)
    if n := s.scalar(query):
        raise Conflict(f"cannot delete generation {row.id}: it has {n} branch{'es' if n != 1 else ''}; delete "
                       f"{'them' if n != 1 else 'it'} first (each branch keeps its own text)")


def _generation(s: Session, gen_id: int, *, lock: bool = False) -> GenerationRow:
    row = s.get(GenerationRow, gen_id, with_for_update=lock or None) if in_sql_range(gen_id) else None
    if row is None:
        raise NotFound("generation", gen_id)
    return row


def _chunk_at(s: Session, row: GenerationRow, position: int) -> ChunkRow:
    """The chunk holding generated token `position`, or Invalid naming `position`."""
    if not 0 <= position < row.produced_tokens:
        raise Invalid("position", f"must be a generated token's index, from 0 to {row.produced_tokens - 1} "
                                  f"(draft {row.id} has {row.produced_tokens} generated tokens)"
                      if row.produced_tokens else f"draft {row.id} has no generated tokens yet")
    query = select(ChunkRow).where(ChunkRow.generation_id == row.id, ChunkRow.token_start <= position)
    return s.scalars(query.order_by(ChunkRow.token_start.desc(), ChunkRow.seq.desc()).limit(1)).one()


def _check_choice(choices: Choices | None, current: int, token: int) -> None:
    if choices is None:
        raise Invalid("position", "no alternatives were recorded for this part of the draft (written before they "
                                  "were, or by the writer)")
    offered = [i for i in choices.ids if i >= 0]
    if token == current:
        raise Invalid("token", f"{token} is the draft's own token there: pick another to branch")
    if token not in offered:
        raise Invalid("token", f"must be one of the alternatives recorded there ({', '.join(map(str, offered))})")


def _branch_row(parent: GenerationRow, prefix_text: str, left: int) -> GenerationRow:
    values = json.loads(parent.settings_json)
    values["max_new_tokens"] = left + 1  # the chosen token is the first of them
    spans = provenance.append(provenance.parse(parent.prompt_sources, parent.prompt_text), provenance.MODEL,
                              len(prefix_text))
    return GenerationRow(
        session_id=parent.session_id, parent_id=parent.id, origin=BRANCH, prompt_text=parent.prompt_text + prefix_text,
        prompt_sources=provenance.dump(spans), model=parent.model, heads=parent.heads, mode=parent.mode,
        memory=parent.memory, authors_note=parent.authors_note, world_info=parent.world_info,  # as on Continue
        seed=parent.seed, settings_json=json.dumps(values),
        target_tokens=left + 1, status="queued" if left else "done", finish_reason=None if left else "length",
        produced_tokens=1, chunk_count=1, elapsed_s=0.0, created_at=utcnow(), finished_at=None if left else utcnow(),
    )


def generated_ids(s: Session, gen_id: int) -> list[int]:
    """The ids a draft generated: its chunks' ids in order (the store's one reading of them)."""
    query = select(ChunkRow.token_ids).where(ChunkRow.generation_id == gen_id).order_by(ChunkRow.seq)
    return [t for packed in s.scalars(query) for t in unpack_ids(packed)]
