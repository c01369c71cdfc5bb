"""What a request may carry: body and upload sizes and status reads per second (ui/api/guard.py enforces them), and
text that is Unicode."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenswift.settings import lone_surrogate

MIB = 2**20
MAX_CONTEXT_TEXT = 20_000  # characters of a Memory or Author's Note: they must leave room for the story
# The longest target a draft may ask for: about 7.5 million words, fifty long novels. A longer one is a typo that would
# hold the worker for weeks (and a PostgreSQL store's 32-bit target column could not even hold 10**12).
MAX_NEW_TOKENS = 10_000_000


def target_problem(max_new_tokens: int) -> str | None:
    """Why a draft's target is refused (below 1 or beyond MAX_NEW_TOKENS); None if it is not. In the app's range, not
    Settings' own (1..2**63-1, which a form's Markdown showed as "1..263-1")."""
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        return f"must be between 1 and {MAX_NEW_TOKENS:,} tokens (about 7.5 million words), not {max_new_tokens:,}"
    return None


@dataclass(frozen=True)
class Limits:
    """Request bodies over `body_bytes` are refused (413), uploads to the page over `upload_bytes` too. A
    novel-length opening is well under 1 MB of text; the cap keeps a stray huge body from tying up the
    server (a 5 MB prompt took 18 s to tokenise before it could be refused).

    Status reads (GET /api/generations/{id}) are limited per client address to `status_reads_per_s` on
    average, with bursts of up to `status_burst` (a token bucket; over it: 429 with Retry-After, answered
    before any store work; 0 per second: no limit). A client that follows a draft with `?since=N&wait=S`
    needs about one read per commit of the worker (at most a few per second), a page of drafts a few more:
    the limit is far above both, and it keeps 20 clients polling flat out from taking the writer's CPU on a
    small machine (issue 15: -31..-53% tokens/s on 2 cores without it)."""

    body_bytes: int = 2 * MIB
    upload_bytes: int = 2 * MIB
    status_reads_per_s: float = 5.0
    status_burst: int = 10

    def __post_init__(self):
        if not (math.isfinite(self.status_reads_per_s) and self.status_reads_per_s >= 0):
            raise ValueError(f"status reads per second must be a number >= 0, not {self.status_reads_per_s}")
        if self.status_burst < 1:
            raise ValueError(f"status read burst must be >= 1, not {self.status_burst}")

    @classmethod
    def from_flags(cls, body_mib: float | None = None, upload_mib: float | None = None,
                   status_reads_per_s: float | None = None) -> Limits:
        """From app.py's flags (None: the default). The burst is two seconds' worth of reads, at least one."""
        default = cls()
        rate = default.status_reads_per_s if status_reads_per_s is None else status_reads_per_s
        burst = default.status_burst if status_reads_per_s is None else max(1, math.ceil(2 * rate))
        return cls(int(body_mib * MIB) if body_mib else default.body_bytes,
                   int(upload_mib * MIB) if upload_mib else default.upload_bytes, rate, burst)


def unicode_problem(text: str) -> str | None:
    """Why `text` cannot be stored or tokenised (a lone surrogate, which JSON's \\ud800 escapes can carry),
    or None."""
    if (at := lone_surrogate(text)) is None:
        return None
    return f"is not valid Unicode: a lone surrogate (U+{ord(text[at]):04X}) at character {at}"


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
