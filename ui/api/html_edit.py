"""Edits to the HTML page Gradio serves at /, made on its way out (ASGI middleware): the guard takes the endpoint
list out of the login page (guard.py); PageScript puts a script first in <head>, where it runs before Gradio's own
modules load (what Gradio's `head=` cannot do: Gradio adds that to the page after its modules have started)."""

from __future__ import annotations

import re
from collections.abc import Callable

HEAD_TAG = re.compile(rb"<head(\s[^>]*)?>", re.IGNORECASE)


async def send_edited(app, scope, receive, send, edit: Callable[[bytes], bytes]) -> None:
    """Runs `app` for this request and sends its answer with `edit` applied to the whole body, asked for
    uncompressed so that it can be edited. A HEAD goes through as it is: it has no body to edit (its length is
    the unedited page's)."""
    if scope["method"] != "GET":
        await app(scope, receive, send)
        return
    headers = [(k, v) for k, v in scope["headers"] if k != b"accept-encoding"]
    start, parts = None, []

    async def held(message):
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            body = edit(b"".join(parts))
            kept = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*kept, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

    await app({**scope, "headers": headers}, receive, held)


class PageScript:
    """`script` (a <script> element) first in the <head> of the page at /, the login page included. An answer
    without a <head> (an error, a redirect) goes out as it came."""

    def __init__(self, app, script: str):
        self.app, self.script = app, script.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/":
            await send_edited(self.app, scope, receive, send, self._insert)
        else:
            await self.app(scope, receive, send)

    def _insert(self, body: bytes) -> bytes:
        return HEAD_TAG.sub(lambda tag: tag.group(0) + self.script, body, count=1)
