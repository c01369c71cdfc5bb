"""Context shifting: what the model sees of a draft longer than its context, with a pinned Memory and an
Author's Note (KoboldCpp's ContextShift, NovelAI's Memory / Author's Note), and World Info (world_info.py).

The model sees a *window*: the prompt's leading BOS (an attention sink, when the tokenizer adds one), then
the Memory and the World Info entries active there, then the most recent story tokens (the prompt's text and
the generated text) with the Author's Note inserted `note_depth` tokens before their end (moved back to where a word
begins: word_cut). An instruction draft
keeps its chat format instead (PinnedText.frame): the Memory and World Info inside the system turn, the
instruction's turn, then the story as the assistant's open turn; the note is a user turn of its own near the
end (WindowPlan.layout says why).

When the next token would not fit in the window, the oldest story tokens are dropped, `step` at a time (a
quarter of the window by default), so the cost of rebuilding is paid once per `step` tokens, not per token.

Exactness (design §3): the window used to predict the token at story index t is a pure function of t,
the token ids, the Memory, the note and these options. Windows change only at *boundaries*:

    b0 = the prompt's length; b1 = the first t whose window would overflow; b(i+1) = b(i) + step + 1

and the window of boundary b holds the story up to b (the newest `keep` tokens once anything is dropped).
A token t in [b(i), b(i+1)) is predicted from window(b(i)) + story[b(i):t]. So plain decoding shifts
before predicting b(i+1), TokenSwift cuts its candidates so that no iteration predicts past a boundary,
and a resumed run rebuilds window(b(i)) + story[b(i):t]: all three see the same window for every token.

World Info whose entries are not all constant adds *checkpoints* (every world_info.CHECKPOINT story tokens from
the prompt's end). At a checkpoint c in (b(i), t] whose active entries (read in story[:c]) differ from those of
the window in use, the window is built again at c: window(b(i)) with c's entries and the story up to c, so the
same oldest story token. Its entries take a fixed budget (`reserve`, counted in `fixed`) whichever are in, so
the boundaries keep their formula and every such window fits. Checkpoints are a function of the ids alone, so
plain decoding, TokenSwift (no iteration predicts past a checkpoint either) and a resumed run (WindowPlan.built
walks the checkpoints since b(i)) again see the same window for every token.

The mechanism is re-prefilling the window (not re-rotating cached keys as ContextShift does): the kept
tokens' keys and values then depend only on the window's own tokens. Re-rotated keys would still carry
what their layers saw of the dropped text, which a resume from stored ids could not rebuild, and the
Author's Note, re-inserted near the end at every shift, moves tokens relative to each other anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from tokenswift.settings import Settings, SettingsError
from tokenswift.text.prompting import ChatFrame, chat_frame, chat_turn, prompt_ids
from tokenswift.text.world_info import CHECKPOINT, WorldIds, WorldInfo, world_ids


@dataclass(frozen=True)
class PinnedText:
    """The draft's Memory and Author's Note as token ids, as they sit in the window (pinned_ids); frame: an
    instruction draft's chat turns, which then take the place of the prompt's first ids; world: its World Info."""

    memory: tuple[int, ...] = ()
    note: tuple[int, ...] = ()
    frame: ChatFrame | None = None
    world: WorldIds | None = None
    # The ids that begin a word (their text starts with a space or a line break): the note is put before one of
    # them, never inside a word (WindowPlan.layout). A function of the tokenizer: left out of comparisons.
    word_starts: frozenset[int] = field(default=frozenset(), compare=False, repr=False)
    after_answer: AfterAnswer | None = None  # an instruction draft's: how its story goes on once the answer ends

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", tuple(int(t) for t in self.memory))
        object.__setattr__(self, "note", tuple(int(t) for t in self.note))


@dataclass(frozen=True)
class AfterAnswer:
    """How an instruction draft goes on past the end of the model's answer, when the writer asked for more.

    A chat model ends its answer where its story ends; forbidden to, it talks to the reader ("I hope you enjoyed
    it… What do you want me to write next?"). So the sampler gives the end of text's probability to a section break
    (a token of three line breaks) instead, and from the story's first section break on, the writer's side of the
    conversation asks for more: the story so far is the model's closed answer, a turn of the writer's says "Go on
    with the story from where it stops" (the Author's Note's turn, which says so already when there is a note), and
    the model's reopened turn holds the story's last tokens (`pinned`; WindowPlan.layout); from there the end of text
    is banned as in any draft. On the default model (scripts/instruction_drafts.py, 4 instructions x 3 seeds, 1,500
    tokens) the share of words in assistant talk went from 8.7% to 5.6% (drafts over 10%: 6 of 12 -> 4); the
    story's own text as the window instead (an opening's layout) measured worse (28%): an instruct model continuing
    raw text drifts into comments on it, and a section break at every end of the answer gave 14%. A function of the
    ids, so plain decoding, TokenSwift (no iteration writes past the first break) and a resume switch at the same
    token."""

    section_break: int
    pinned: PinnedText


@dataclass(frozen=True)
class ContextUse:
    """What the model sees right now, for the status line ("context: memory 180 + last 7,800 tokens")."""

    memory: int  # the writer's pinned tokens: Memory, World Info and Author's Note
    recent: int  # story tokens in the window
    shifts: int  # windows rebuilt since the run started
    frame: int = 0  # the other pinned tokens: BOS, or an instruction draft's chat turns (not the writer's Memory)


class WindowPlan:
    """The boundaries and windows of one run (see the module docstring)."""

    def __init__(self, prompt: Sequence[int], lead: int, pinned: PinnedText, size: int, step: int,
                 note_depth: int):
        """prompt: the prompt ids; lead: how many of its first ids (0 or 1: a BOS) stay pinned at the top (a
        chat frame's turns instead, when pinned has one); size: tokens in one window (the root's position is at
        most size - 1); step: tokens dropped per shift."""
        frame = pinned.frame
        if frame is not None:
            if tuple(prompt[:len(frame.prompt)]) != frame.prompt:
                raise SettingsError("prompt", "does not start with its instruction's chat turns")
            lead = len(frame.prompt)
        self.prompt, self.prompt_len, self.lead, self.pinned = list(prompt), len(prompt), lead, pinned
        self.answered_from: WindowPlan | None = None  # the instruction's plan, when this one goes on past its answer
        # (before, after, opener, close): the pinned ids around the Memory, and the assistant turn's markers.
        self.turns = ((frame.before, frame.after, frame.opener, frame.close) if frame is not None
                      else (tuple(prompt[:lead]), (), (), ()))
        before, after, opener, close = self.turns
        self.head = [*before, *pinned.memory, *after, *opener]
        self.size, self.step, self.note_depth = size, step, note_depth
        # World Info's budget, reserved whichever entries are in: the boundaries do not move with them.
        self.reserve = pinned.world.reserve(size) if pinned.world is not None else 0
        self.dynamic = pinned.world is not None and pinned.world.info.dynamic
        self.fixed = (len(self.head) + self.reserve
                      + (len(close) + len(pinned.note) + len(opener) if pinned.note else 0))
        # Story tokens kept right after a shift: the window then has room for exactly `step` more.
        self.keep = size - step - self.fixed
        if self.keep < 1:
            what = "Memory, Author's Note and World Info" if self.reserve else "Memory and Author's Note"
            raise SettingsError("shift_step", f"{what} ({self.fixed} tokens) plus shift_step "
                                              f"({step}) leave no room in a window of {size} tokens")
        story0 = self.prompt_len - lead
        self.fits0 = self.fixed + story0 <= size - 1  # the whole prompt fits with room to predict
        first_len = self.fixed + (story0 if self.fits0 else self.keep)
        self.b1 = self.prompt_len + size - first_len + 1

    def with_pinned(self, pinned: PinnedText) -> WindowPlan:
        """The same plan with another Memory / note (an edit picked up at a shift). Its boundaries may differ,
        but every later window is still a pure function of t, the ids and the new text, so a run resumed
        with that text continues exactly as this one."""
        return WindowPlan(self.prompt, self.lead, pinned, self.size, self.step, self.note_depth)

    def after_answer(self, ids: Sequence[int]) -> WindowPlan:
        """The plan for ids: this one, or, once an instruction draft's story has its first section break (its
        answer's end), the plan of the story going on from the token after it as a continuation (AfterAnswer)."""
        after = self.pinned.after_answer
        end = next((i for i in range(self.prompt_len, len(ids)) if ids[i] == after.section_break), None) \
            if after is not None else None
        if end is None:
            return self
        plan = WindowPlan(ids[:end + 1], 0, after.pinned, self.size, self.step, self.note_depth)
        plan.answered_from = self
        return plan

    def boundary(self, t: int) -> int:
        """The boundary whose window predicts the token at story index t (t >= the prompt's length)."""
        if t < self.b1:
            return self.prompt_len
        return self.b1 + (t - self.b1) // (self.step + 1) * (self.step + 1)

    def next_boundary(self, t: int) -> int:
        """The first boundary after the one that predicts t."""
        b = self.boundary(t)
        return self.b1 if b == self.prompt_len else b + self.step + 1

    def next_checkpoint(self, t: int) -> int:
        """The first checkpoint after t (world_info.CHECKPOINT); past the next boundary when there are none."""
        if not self.dynamic:
            return self.next_boundary(t) + 1
        return t + CHECKPOINT - (t - self.prompt_len) % CHECKPOINT

    def active(self, ids: Sequence[int], at: int) -> tuple[int, ...]:
        """The World Info entries a window built at story index `at` holds: those active in ids[:at]."""
        world = self.pinned.world
        if world is None:
            return ()
        return world.chosen(ids[max(self.lead, at - world.info.depth):at], self.reserve)

    def built(self, ids: Sequence[int], t: int) -> int:
        """Where the window that predicts t was built: its boundary b, or the latest checkpoint in (b, t] whose
        entries differ from those of the window before it (the same walk a run makes, one checkpoint at a time)."""
        at = self.boundary(t)
        if not self.dynamic:
            return at
        entries, c = self.active(ids, at), self.next_checkpoint(at)
        while c <= t:
            if (now := self.active(ids, c)) != entries:
                at, entries = c, now
            c += CHECKPOINT
        return at

    def pinned_size(self, entries: Sequence[int]) -> int:
        """The window's tokens besides the story: `fixed`, with these World Info entries in place of the reserve."""
        world = self.pinned.world
        return self.fixed - self.reserve + (sum(len(world.contents[i]) for i in entries) if world else 0)

    def frame_size(self) -> int:
        """The pinned tokens that are neither Memory, World Info nor the writer's note: BOS, or the chat turns around
        them (past an instruction draft's answer without a note, the turn that asks the model to go on too)."""
        asked = self.answered_from is not None and not self.answered_from.pinned.note
        return self.fixed - self.reserve - len(self.pinned.memory) - (0 if asked else len(self.pinned.note))

    def kept_start(self, b: int) -> int:
        """Story index of the oldest token window(b) keeps."""
        if b == self.prompt_len and self.fits0:
            return self.lead
        return b - self.keep

    def window(self, ids: Sequence[int], b: int, at: int | None = None) -> list[int]:
        """The window of boundary b, built at `at` (b when None): pinned head and World Info, kept story up to
        `at` with the note `note_depth` tokens before its end."""
        return [t for _, piece in self.layout(ids, b, at) for t in piece]

    def layout(self, ids: Sequence[int], b: int, at: int | None = None) -> list[tuple[str, list[int]]]:
        """window(b) (built at `at`) in labelled pieces: "frame" (BOS, chat turns), "memory", "world info" (one
        per entry), "story" and "note".

        In a chat draft the note is a user turn: the story before it is a closed assistant turn, and the last
        `note_depth` tokens reopen the assistant's turn after it. Written inside the open turn, the note would
        read as the model's own story (it would go on from it, or echo it); in the system or instruction turn
        it would sit a whole window away from the end. As the turn just before the one being written, it is
        where chat models are trained to take direction, and the reopened turn's story keeps the join."""
        at = b if at is None else at
        kept = list(ids[self.kept_start(b):at])
        before, after, opener, close = (list(part) for part in self.turns)
        world = self.pinned.world
        entries = [("world info", list(world.contents[i])) for i in self.active(ids, at)] if world else []
        pieces = [("frame", before), ("memory", list(self.pinned.memory)), *entries, ("frame", after)]
        if not self.pinned.note:
            return [*pieces, ("frame", opener), ("story", kept)]
        cut = word_cut(kept, max(0, len(kept) - self.note_depth), self.pinned.word_starts)
        if cut:  # else the note follows the instruction's turn (no empty assistant turn before it)
            pieces += [("frame", opener), ("story", kept[:cut]), ("frame", close)]
        return [*pieces, ("note", list(self.pinned.note)), ("frame", opener), ("story", kept[cut:])]

    def ahead(self, ids: Sequence[int], b: int) -> list[int]:
        """The leading tokens of window(b) that the story so far (ids, shorter than b) already settles: the pinned
        ones and the kept story written so far, up to where the note may yet go (word_cut moves its place back up to
        WORD_REACH tokens, once the token at b - note_depth is written). A guess where World Info comes and goes
        (its entries are read near b): decode/lookahead.py takes only the slots whose tokens match."""
        settled = len(ids)
        if self.pinned.note and settled <= b - self.note_depth:
            settled = min(settled, b - self.note_depth - WORD_REACH + 1)
        padded = [*ids[:b], *[-1] * (b - len(ids))]
        out, story = [], self.kept_start(b)
        for name, piece in self.layout(padded, b):
            if name != "story":
                out += piece
                continue
            take = max(0, min(len(piece), settled - story))
            out += piece[:take]
            story += len(piece)
            if take < len(piece):
                break
        return out

    def seen(self, ids: Sequence[int]) -> list[tuple[str, list[int]]]:
        """What predicts the token after ids, labelled as layout, after the story no longer in view
        ("shifted") and with the story written since the window was built."""
        b = self.boundary(len(ids))
        at = self.built(ids, len(ids))
        return [("shifted", list(ids[self.lead:self.kept_start(b)])), *self.layout(ids, b, at),
                ("story", list(ids[at:]))]


WORD_REACH = 8  # tokens the note's place may move back to reach a word's start (longer words are split)
# How tokenizers write a token's leading space or line break: byte-level BPE (GPT-2, Llama 3, SmolLM) and SentencePiece.
WORD_MARKS = (" ", "\n", "\t", "\u0120", "\u010a", "\u0109", "\u2581", "<0x0A>", "<0x09>")


def word_cut(kept: Sequence[int], cut: int, starts: frozenset[int]) -> int:
    """`cut` moved back to the nearest token of kept[cut - WORD_REACH + 1:cut + 1] that begins a word, so that the note
    sits between words ("they" … note … "'re" split one); unmoved when none does. A function of the ids alone, so
    plain decoding, TokenSwift and a resume still build the same window."""
    for i in range(cut, max(0, cut - WORD_REACH), -1):
        if kept[i] in starts:
            return i
    return cut


@lru_cache(maxsize=4)
def word_start_ids(tokenizer) -> frozenset[int]:
    """The ids of `tokenizer` whose text starts with a space or a line break (WORD_MARKS)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return frozenset(i for i, piece in enumerate(pieces) if isinstance(piece, str) and piece.startswith(WORD_MARKS))


def window_plan(settings: Settings, prompt: Sequence[int], lead: int, pinned: PinnedText,
                model_context: int) -> WindowPlan:
    """The plan for these settings; a window larger than the model's trained context is refused (no RoPE
    scaling is applied behind the writer's back)."""
    size, step = settings.window(model_context)
    return WindowPlan(prompt, lead, pinned, size, step, settings.note_depth)


def leading_bos(lm, prompt: Sequence[int]) -> int:
    """1 when the prompt starts with the BOS the tokenizer adds itself (kept at the top of every window as the
    attention sink the model was trained with), else 0."""
    bos = getattr(lm.tokenizer, "bos_token_id", None)
    if bos is None or not prompt or prompt[0] != bos:
        return 0
    return 1 if lm.encode("x")[:1] == [bos] else 0


def pinned_ids(lm, memory: str, note: str, instruction: str | None = None,
               world: WorldInfo | None = None) -> PinnedText:
    """Tokenize the writer's Memory and Author's Note (no special tokens: they sit inside the window). In an
    opening the note is framed as Kobold Lite frames it, so the model reads it as an aside rather than story
    text. instruction: an instruction draft's, whose chat turns frame the window (the Memory is then the
    system turn's text, and the note a user turn). world: the draft's World Info (world_info.py)."""
    def encode(text: str) -> tuple[int, ...]:
        return tuple(lm.tokenizer(text, add_special_tokens=False).input_ids) if text else ()

    memory, note = memory.strip(), note.strip()
    lore = world_ids(lm, world, chat=instruction is not None) if world is not None else None
    starts = word_start_ids(lm.tokenizer) if note else frozenset()
    if instruction is None:
        return PinnedText(encode(memory + "\n") if memory else (),
                          encode(f"\n[Author's note: {note}]\n") if note else (), world=lore, word_starts=starts)
    asked = f"Go on with the story from where it stops. Author's note for what comes next: {note}"
    frame = chat_frame(lm, instruction, memory, system=lore is not None)
    turn = tuple(chat_turn(lm, "user", asked)) if note else ()
    section_break = lm.tokenizer("\n\n\n", add_special_tokens=False).input_ids
    after = None
    if len(section_break) == 1:  # else the model has no such token: its end of text stays banned
        goes_on = turn or tuple(chat_turn(lm, "user", "Go on with the story from where it stops."))
        after = AfterAnswer(section_break[0], PinnedText(encode(memory), goes_on, frame, lore,
                                                         starts or word_start_ids(lm.tokenizer)))
    return PinnedText(encode(memory), turn, frame, lore, starts, after)


def draft_context(lm, text: str, form: str, memory: str = "", note: str = "",
                  world: WorldInfo | None = None) -> tuple[list[int], PinnedText]:
    """A new draft's prompt ids and pinned ids, from its text: an opening, or (form "instruction") the instruction,
    whose chat turns then stay at the top of every window, as the app's worker keeps an instruction draft's
    (worker/job.py). Without them in the pinned ids a shift would drop the turns with the oldest story."""
    return prompt_ids(lm, text, form), pinned_ids(lm, memory, note, text if form == "instruction" else None, world)
