"""Context shifting: what the model sees of a draft longer than its context, with a pinned Memory and an
Author's Note (KoboldCpp's ContextShift, NovelAI's Memory / Author's Note).

The model sees a *window*: the prompt's leading BOS (an attention sink, when the tokenizer adds one), then
the Memory, then the most recent story tokens (the prompt's text and the generated text) with the Author's
Note inserted `note_depth` tokens before their end. When the next token would not fit in the window, the
oldest story tokens are dropped, `step` at a time (a quarter of the window by default), so the cost of
rebuilding is paid once per `step` tokens, not per token.

Exactness (design §3): the window used to predict the token at story index t is a pure function of t,
the token ids, the Memory, the note and these options. Windows change only at *boundaries*:

    b0 = the prompt's length; b1 = the first t whose window would overflow; b(i+1) = b(i) + step + 1

and the window of boundary b holds the story up to b (the newest `keep` tokens once anything is dropped).
A token t in [b(i), b(i+1)) is predicted from window(b(i)) + story[b(i):t]. So plain decoding shifts
before predicting b(i+1), TokenSwift cuts its candidates so that no iteration predicts past a boundary,
and a resumed run rebuilds window(b(i)) + story[b(i):t]: all three see the same window for every token.

The mechanism is re-prefilling the window (not re-rotating cached keys as ContextShift does): the kept
tokens' keys and values then depend only on the window's own tokens. Re-rotated keys would still carry
what their layers saw of the dropped text, which a resume from stored ids could not rebuild, and the
Author's Note, re-inserted near the end at every shift, moves tokens relative to each other anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .settings import Settings, SettingsError


@dataclass(frozen=True)
class PinnedText:
    """The draft's Memory and Author's Note as token ids (tokenized by the caller, without special tokens)."""

    memory: tuple[int, ...] = ()
    note: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", tuple(int(t) for t in self.memory))
        object.__setattr__(self, "note", tuple(int(t) for t in self.note))


@dataclass(frozen=True)
class ContextUse:
    """What the model sees right now, for the status line ("context: memory 180 + last 7,800 tokens")."""

    memory: int  # pinned tokens (BOS, Memory, Author's Note)
    recent: int  # story tokens in the window
    shifts: int  # windows rebuilt since the run started


class WindowPlan:
    """The boundaries and windows of one run (see the module docstring)."""

    def __init__(self, prompt: Sequence[int], lead: int, pinned: PinnedText, size: int, step: int,
                 note_depth: int):
        """prompt: the prompt ids; lead: how many of its first ids (0 or 1: a BOS) stay pinned at the top;
        size: tokens in one window (the root's position is at most size - 1); step: tokens dropped per shift."""
        self.prompt, self.prompt_len, self.lead, self.pinned = list(prompt), len(prompt), lead, pinned
        self.head = list(prompt[:lead]) + list(pinned.memory)
        self.size, self.step, self.note_depth = size, step, note_depth
        self.fixed = len(self.head) + len(pinned.note)
        # Story tokens kept right after a shift: the window then has room for exactly `step` more.
        self.keep = size - step - self.fixed
        if self.keep < 1:
            raise SettingsError("shift_step", f"Memory and Author's Note ({self.fixed} tokens) plus shift_step "
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

    def boundary(self, t: int) -> int:
        """The boundary whose window predicts the token at story index t (t >= the prompt's length)."""
        if t < self.b1:
            return self.prompt_len
        return self.b1 + (t - self.b1) // (self.step + 1) * (self.step + 1)

    def next_boundary(self, t: int) -> int:
        """The first boundary after the one that predicts t."""
        b = self.boundary(t)
        return self.b1 if b == self.prompt_len else b + self.step + 1

    def kept_start(self, b: int) -> int:
        """Story index of the oldest token window(b) keeps."""
        if b == self.prompt_len and self.fits0:
            return self.lead
        return b - self.keep

    def window(self, ids: Sequence[int], b: int) -> list[int]:
        """The window of boundary b: pinned head, kept story with the note `note_depth` tokens before its end."""
        kept = list(ids[self.kept_start(b):b])
        cut = max(0, len(kept) - self.note_depth)
        return self.head + kept[:cut] + list(self.pinned.note) + kept[cut:]


def window_plan(settings: Settings, prompt: Sequence[int], lead: int, pinned: PinnedText,
                model_context: int) -> WindowPlan:
    """The plan for these settings; a window larger than the model's trained context is refused (no RoPE
    scaling is applied behind the writer's back)."""
    size = settings.context_window or model_context
    if size > model_context:
        raise SettingsError("context_window", f"{size} exceeds the model's context of {model_context} tokens "
                                              "(no RoPE scaling is applied)")
    step = settings.shift_step or max(1, size // 4)
    if step >= size:
        raise SettingsError("shift_step", f"must be smaller than the window ({size} tokens)")
    return WindowPlan(prompt, lead, pinned, size, step, settings.note_depth)


def leading_bos(lm, prompt: Sequence[int]) -> int:
    """1 when the prompt starts with the BOS the tokenizer adds itself (kept at the top of every window as the
    attention sink the model was trained with), else 0."""
    bos = getattr(lm.tokenizer, "bos_token_id", None)
    if bos is None or not prompt or prompt[0] != bos:
        return 0
    return 1 if lm.encode("x")[:1] == [bos] else 0


def pinned_ids(lm, memory: str, note: str) -> PinnedText:
    """Tokenize the writer's Memory and Author's Note (no special tokens: they sit inside the window). The
    note is framed as Kobold Lite frames it, so the model reads it as an aside rather than story text."""
    def encode(text: str) -> tuple[int, ...]:
        return tuple(lm.tokenizer(text, add_special_tokens=False).input_ids) if text else ()

    memory, note = memory.strip(), note.strip()
    return PinnedText(encode(memory + "\n") if memory else (),
                      encode(f"\n[Author's note: {note}]\n") if note else ())
