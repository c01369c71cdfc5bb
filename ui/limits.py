"""What a request may carry: body and upload sizes (ui/guard.py enforces them) and text that is Unicode."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
MAX_CONTEXT_TEXT = 20_000  # characters of a Memory or Author's Note: they must leave room for the story


@dataclass(frozen=True)
class Limits:
    """Request bodies over `body_bytes` are refused (413), uploads to the page over `upload_bytes` too. A
    novel-length opening is well under 1 MB of text; the cap keeps a stray huge body from tying up the
    server (a 5 MB prompt took 18 s to tokenise before it could be refused)."""

    body_bytes: int = 2 * MIB
    upload_bytes: int = 2 * MIB

    @classmethod
    def from_mib(cls, body_mib: float | None = None, upload_mib: float | None = None) -> Limits:
        default = cls()
        return cls(int(body_mib * MIB) if body_mib else default.body_bytes,
                   int(upload_mib * MIB) if upload_mib else default.upload_bytes)


def unicode_problem(text: str) -> str | None:
    """Why `text` cannot be stored or tokenised (a lone surrogate, which JSON's \\ud800 escapes can carry),
    or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"is not valid Unicode: a lone surrogate (U+{ord(text[error.start]):04X}) at character "
                f"{error.start}")
    return None


def context_text_problem(text: str) -> str | None:
    """Why a Memory or Author's Note cannot be kept, or None."""
    if problem := unicode_problem(text):
        return problem
    if len(text) > MAX_CONTEXT_TEXT:
        return f"at most {MAX_CONTEXT_TEXT:,} characters, got {len(text):,}"
    return None


def printable(text: str) -> str:
    """`text` with lone surrogates escaped, so an error message that quotes it can be sent as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def size(n_bytes: int) -> str:
    return f"{n_bytes / MIB:g} MB" if n_bytes >= MIB else f"{n_bytes / 1024:g} KB"
