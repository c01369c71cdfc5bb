"""One FastAPI app: the REST API (ui/api/api.py) under /api, the OpenAI-compatible endpoint (ui/api/openai_api.py)
under /v1 and the Gradio page at /, behind the same login."""

from __future__ import annotations

import logging
import secrets

import gradio as gr
from fastapi import FastAPI
from starlette.routing import Mount

from storage import Store
from ui.api.api import create_router
from ui.api.credentials import Credentials
from ui.api.guard import Guard, gradio_sessions
from ui.api.html_edit import PageScript
from ui.api.openai_api import add_openai_routes
from ui.drafts.exports import Exports
from ui.drafts.limits import Limits
from ui.drafts.texts import DraftTexts
from ui.drafts.tokens import PromptTokens
from ui.page import CSS, FIRST_IN_HEAD, HEAD, THEME, build_page

log = logging.getLogger(__name__)

# Gradio's queue looks for new events every 1 ms while it has none (or while a concurrency limit holds the next),
# and for progress messages every 10 ms (on Windows 50 and 100 ms): an idle app took 8-9% of a core, on a writer's
# 2-core machine beside the model's worker. At these a queued click waits up to 20 ms more for its turn (each one
# behind a limit of 1, as the Plan tab's events are); the live polls skip the queue (live.POLL); nothing uses
# gr.Progress.
QUEUE_IDLE_S = 0.02
PROGRESS_IDLE_S = 0.1


def create_app(store: Store, credentials: Credentials | None = None, *, own_worker: bool = True,
               limits: Limits | None = None, exports: Exports | None = None) -> Guard:
    """own_worker: app.py spawned the worker (else --no-worker: one runs elsewhere on the same store).
    limits: body and upload sizes (ui/drafts/limits.py). exports: the folder for Library exports, which the caller
    removes at shutdown (a new one in the system's temp folder if not given)."""
    hint = ("The app's worker has stopped; see the terminal, then restart the app." if own_worker else
            "The app runs without one (--no-worker): start `python -m worker --db <same url>`.")
    limits = limits or Limits()
    app = FastAPI(title="TokenSwift Studio", docs_url="/api/docs", openapi_url="/api/openapi.json", redoc_url=None)
    tokens, texts = PromptTokens(store), DraftTexts(store)  # one of each for the API and the page
    app.include_router(create_router(store, tokens, texts))  # before the mount: / would shadow it
    add_openai_routes(app, store, tokens, texts)  # /v1, for OpenAI clients (SillyTavern, scripts)
    page = build_page(store, worker_hint=hint, exports=exports or Exports(), tokens=tokens, texts=texts)
    # run_history: Gradio 6 records each clicked event's inputs and outputs (the draft's text, the charts) in the tab's
    # localStorage, the whole list of up to 100 runs re-serialized at each message of the event: a fifth of the
    # browser's CPU in the browser tests, taken from the worker on a small machine, and a copy of the writer's text
    # outside the store. The Library is the app's history.
    app = gr.mount_gradio_app(app, page, path="/", auth=credentials or None, auth_message="TokenSwift Studio",
                              theme=THEME, css=CSS, head=HEAD, footer_links=[], max_file_size=limits.upload_bytes,
                              run_history=False)
    quiet_queue(page)
    gradio_app = next(route.app for route in app.routes if isinstance(route, Mount))
    return Guard(PageScript(app, FIRST_IN_HEAD), credentials or None, limits, sessions=gradio_sessions(gradio_app))


def quiet_queue(page: gr.Blocks) -> None:
    """Gradio's queue (mounted: it starts with the server) polls at QUEUE_IDLE_S and PROGRESS_IDLE_S."""
    page._queue.sleep_when_free = QUEUE_IDLE_S
    page._queue.progress_update_sleep_when_free = PROGRESS_IDLE_S


def share_link(port: int) -> None:
    """--share: a public gradio.live tunnel to the local server (needs network)."""
    try:
        url = gr.networking.setup_tunnel("127.0.0.1", port, secrets.token_urlsafe(32), None, None)
    except Exception as error:  # noqa: BLE001 - no network, blocked port: say so, keep serving locally
        print(f"--share: could not open a public link ({type(error).__name__}: {error}); serving locally only.",
              flush=True)
        return
    print(f"Public link (anyone with it can use the app; protect it with --auth): {url}", flush=True)
