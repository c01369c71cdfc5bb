"""The logins of the page and the APIs, from --auth and --auth-file: read before the app's heavy imports, so that
the worker starts loading the model while the page is built (app.py)."""

from __future__ import annotations

from pathlib import Path

Credentials = list[tuple[str, str]]


def parse_credentials(auth: str | None, auth_file: str | None) -> Credentials:
    """`user:pass[,user2:pass2]` from --auth and/or one or more per line (or comma-separated) in --auth-file.
    ValueError with a readable message on a malformed entry."""
    entries: list[str] = []
    if auth:
        entries += auth.split(",")
    if auth_file:
        try:
            text = Path(auth_file).expanduser().read_text(encoding="utf-8")
        except OSError as error:
            raise ValueError(f"--auth-file: cannot read {auth_file}: {error.strerror}") from None
        entries += [part for line in text.splitlines() for part in line.split(",")]
    pairs = []
    for entry in (e.strip() for e in entries):
        if not entry or entry.startswith("#"):
            continue
        user, sep, password = entry.partition(":")
        if not sep or not user or not password:
            raise ValueError(f"auth entry {entry.split(':')[0]!r}…: expected user:password")
        pairs.append((user, password))
    return pairs
