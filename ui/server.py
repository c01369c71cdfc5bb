"""One FastAPI app: the REST API (ui/api.py) under /api and the Gradio page at /, behind the same login."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import gradio as gr
from fastapi import FastAPI

from storage import Store
from ui.api import create_router
from ui.page import CSS, HEAD, THEME, build_page
from ui.tokens import PromptTokens

log = logging.getLogger(__name__)

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


def create_app(store: Store, credentials: Credentials | None = None, *, own_worker: bool = True) -> FastAPI:
    """own_worker: app.py spawned the worker (else --no-worker: one runs elsewhere on the same store)."""
    hint = ("The app's worker has stopped; see the terminal, then restart the app." if own_worker else
            "The app runs without one (--no-worker): start `python -m worker --db <same url>`.")
    app = FastAPI(title="TokenSwift Studio", docs_url="/api/docs", openapi_url="/api/openapi.json", redoc_url=None)
    tokens = PromptTokens(store)  # one tokenizer cache for the API and the Write tab
    app.include_router(create_router(store, credentials or None, tokens))  # before the mount: / would shadow it
    page = build_page(store, worker_hint=hint, tokens=tokens)
    return gr.mount_gradio_app(app, page, path="/", auth=credentials or None, auth_message="TokenSwift Studio",
                               theme=THEME, css=CSS, head=HEAD, footer_links=[])


def share_link(port: int) -> None:
    """--share: a public gradio.live tunnel to the local server (needs network)."""
    try:
        url = gr.networking.setup_tunnel("127.0.0.1", port, secrets.token_urlsafe(32), None, None)
    except Exception as error:  # noqa: BLE001 - no network, blocked port: say so, keep serving locally
        print(f"--share: could not open a public link ({type(error).__name__}: {error}); serving locally only.",
              flush=True)
        return
    print(f"Public link (anyone with it can use the app; protect it with --auth): {url}", flush=True)
