"""The app's front door: the ASGI middleware in front of the REST API and the Gradio page (and of
html_edit.PageScript, which edits the page).

- Request bodies are capped (413 naming the limit): `Limits.body_bytes`, or `Limits.upload_bytes` (plus room
  for the multipart framing) on Gradio's upload route. A body sent without a length is read up to the cap.
- With credentials, every path but the login page and static assets needs a login: HTTP Basic with one of
  the pairs (API clients, curl, a browser opening /api/docs), a bearer API key that is one of the pairs'
  passwords (OpenAI clients: `OpenAI(base_url=.../v1, api_key=password)`), or the session cookie that Gradio's
  login form set. The API's docs and schema, Gradio's heartbeat and stream routes and uploads included. The login page
  is served without Gradio's list of endpoints.
- Failed logins (a wrong Basic pair, a refused login form) are limited per client address: after `free`
  failures each attempt must wait, twice as long as the last (429 with Retry-After); a success clears it.
- Under /v1 (ui/api/openai_api.py) these answers come in OpenAI's error shape, which its clients read.
- Status reads (GET /api/generations/{id}) are limited per client address (`Limits.status_reads_per_s`,
  ui/api/ratelimit.py): over it, 429 with Retry-After before the API or the store sees the request. With
  credentials the login is checked first, so a stranger's reads are 401s and use up nobody's budget.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from starlette.requests import HTTPConnection

from ui.api.html_edit import send_edited
from ui.api.openai_input import OPENAI_PREFIX, error_body
from ui.api.ratelimit import Buckets, is_status_read, retry_after
from ui.drafts.limits import Limits, size

UPLOAD_PATHS = ("/gradio_api/upload", "/gradio_api/upload/")
MULTIPART_SLACK = 64 * 1024
LOGIN_FORM = ("/login", "/login/")
PUBLIC = {"/", "/favicon.ico", "/manifest.json", "/robots.txt", "/theme.css", "/gradio_api/theme.css", *LOGIN_FORM}
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon", "/gradio_api/assets/")
API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)

Sessions = Callable[[dict[str, str]], bool]  # request cookies -> a logged-in browser?


class Throttle:
    """Failed logins per client address, with a doubling wait once `free` are used up."""

    def __init__(self, free: int = 5, first_wait_s: float = 1.0, max_wait_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, max_clients: int = 10_000):
        self.free, self.first_wait_s, self.max_wait_s = free, first_wait_s, max_wait_s
        self.clock, self.max_clients = clock, max_clients
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # client -> (count, when allowed)

    def retry_after(self, client: str) -> float:
        """Seconds before `client` may try again (0: now)."""
        _, allowed = self._failures.get(client, (0, 0.0))
        return max(0.0, allowed - self.clock())

    def failed(self, client: str) -> None:
        count = self._failures.pop(client, (0, 0.0))[0] + 1
        over = count - self.free
        wait = 0.0 if over <= 0 else min(self.max_wait_s, self.first_wait_s * 2 ** (over - 1))
        self._failures[client] = (count, self.clock() + wait)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)


class Guard:
    def __init__(self, app, credentials: Sequence[tuple[str, str]] | None, limits: Limits,
                 throttle: Throttle | None = None, sessions: Sessions | None = None,
                 status_reads: Buckets | None = None):
        self.app, self.credentials, self.limits = app, list(credentials or []), limits
        self.throttle = throttle or Throttle()
        self.status_reads = status_reads or Buckets(limits.status_reads_per_s, limits.status_burst)
        self.sessions = sessions  # set by ui/server.py once Gradio is mounted

    async def __call__(self, scope, receive, send) -> None:
        in_session = self.sessions is not None and scope["type"] == "websocket" and self.sessions(
            HTTPConnection(scope).cookies)
        if scope["type"] == "websocket" and self.credentials and not in_session:
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        receive = await self._capped(scope, receive, send, path)
        if receive is None:
            return
        client = scope["client"][0] if scope.get("client") else "unknown"
        if not self.credentials:
            if await self._within_status_limit(scope, send, client):
                await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        logged_in = await self._login(connection, client, send)
        if logged_in is None:  # refused, answered
            return
        if logged_in:
            if await self._within_status_limit(scope, send, client):
                await self.app(scope, receive, send)
        elif scope["method"] == "POST" and path in LOGIN_FORM:
            await self._login_form(scope, receive, send, client)
        elif path == "/" and scope["method"] in ("GET", "HEAD"):
            await self._login_page(scope, receive, send)
        elif path in PUBLIC or path.startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
        else:
            headers = {"WWW-Authenticate": 'Basic realm="TokenSwift Studio"'} if path.startswith("/api") else {}
            await _answer(send, 401, "log in first (HTTP Basic, an API key: the app's password as a bearer token, "
                                     "or the login page)", headers, path)

    # --- sizes ---------------------------------------------------------------------------------------

    async def _capped(self, scope, receive, send, path: str):
        """`receive`, or a replay of the body read up to the cap; None when the request was refused."""
        limit = self.limits.upload_bytes + MULTIPART_SLACK if path in UPLOAD_PATHS else self.limits.body_bytes
        shown = self.limits.upload_bytes if path in UPLOAD_PATHS else self.limits.body_bytes
        what = "upload" if path in UPLOAD_PATHS else "request body"
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _answer(send, 400, "Content-Length is not a number", path=path)
                return None
            if declared > limit:
                await _answer(send, 413, f"{what} of {size(declared)} is over the {size(shown)} limit", path=path)
                return None
            return receive  # the server reads exactly Content-Length bytes: no more can arrive
        if headers.get(b"transfer-encoding") is None:
            return receive
        body, more = [], True
        total = 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return receive
            total += len(message.get("body", b""))
            if total > limit:
                await _answer(send, 413, f"{what} is over the {size(shown)} limit", path=path)
                return None
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        replay = [{"type": "http.request", "body": b"".join(body), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        return replayed

    # --- status reads --------------------------------------------------------------------------------

    async def _within_status_limit(self, scope, send, client: str) -> bool:
        """True when the request may go on; else it was answered 429."""
        if not is_status_read(scope) or (wait := self.status_reads.take(client)) == 0:
            return True
        rate = f"{self.status_reads.rate_per_s:g}"
        await _answer(send, 429, f"status reads: over the limit of {rate} per second from this address (bursts "
                                 f"of {self.status_reads.burst}); try again in {retry_after(wait)} s, or follow "
                                 "a draft with ?since=N&wait=10", {"Retry-After": str(retry_after(wait))})
        return False

    # --- login ---------------------------------------------------------------------------------------

    async def _login(self, connection: HTTPConnection, client: str, send) -> bool | None:
        """True: logged in; False: not (yet); None: refused and answered (bad pair, or throttled)."""
        header, path = connection.headers.get("authorization"), connection.url.path
        pair = _basic(header) or _bearer(header)
        if pair is None:
            return self.sessions is not None and self.sessions(connection.cookies)
        if (wait := self.throttle.retry_after(client)) > 0:
            await _too_many(send, wait, path)
            return None
        if self._known(*pair):
            self.throttle.succeeded(client)
            return True
        self.throttle.failed(client)
        what = "user or password" if pair[0] is not None else "API key (the app's password)"
        await _answer(send, 401, f"wrong {what}", {"WWW-Authenticate": 'Basic realm="TokenSwift Studio"'}, path)
        return None

    def _known(self, user: str | None, password: str) -> bool:
        """user None: a bearer API key, which may be any pair's password."""
        found = False
        for known_user, known_password in self.credentials:
            # compare_digest on both parts, for every pair: no timing hint about which part was wrong.
            ok_user = user is None or secrets.compare_digest(user.encode(), known_user.encode())
            found |= ok_user & secrets.compare_digest(password.encode(), known_password.encode())
        return found

    async def _login_form(self, scope, receive, send, client: str) -> None:
        """Gradio checks the form; this counts its answers (200 logged in, 4xx refused)."""
        if (wait := self.throttle.retry_after(client)) > 0:
            await _too_many(send, wait)
            return

        async def watched(message):
            if message["type"] == "http.response.start":
                if message["status"] == 200:
                    self.throttle.succeeded(client)
                elif 400 <= message["status"] < 500:
                    self.throttle.failed(client)
            await send(message)

        await self.app(scope, receive, watched)

    async def _login_page(self, scope, receive, send) -> None:
        """Gradio's login page, without the endpoint list it would embed."""
        await send_edited(self.app, scope, receive, send,
                          lambda body: API_INFO.sub(b"window.gradio_api_info = {};</script>", body))


def _basic(header: str | None) -> tuple[str, str] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return ("", "")  # malformed: a failed attempt like any other
    return user, password


def _bearer(header: str | None) -> tuple[None, str] | None:
    """An API key (Authorization: Bearer KEY), as (no user, the key)."""
    if not header or not header.lower().startswith("bearer "):
        return None
    return None, header[7:].strip()


async def _too_many(send, wait: float, path: str = "") -> None:
    seconds = max(1, round(wait))
    await _answer(send, 429, f"too many failed logins from this address; try again in {seconds} s",
                  {"Retry-After": str(seconds)}, path)


async def _answer(send, status: int, detail: str, headers: dict[str, str] | None = None, path: str = "") -> None:
    """path: under /v1, OpenAI's error shape (its clients show its message); elsewhere FastAPI's."""
    shaped = error_body(status, detail) if path.startswith(OPENAI_PREFIX) else {"detail": detail}
    body = json.dumps(shaped).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def gradio_sessions(gradio_app) -> Sessions:
    """Is a browser logged in to this Gradio app? Its login form keeps a token per session in a cookie."""

    def logged_in(cookies: dict[str, str]) -> bool:
        cookie = gradio_app.cookie_id
        token = cookies.get(f"access-token-{cookie}") or cookies.get(f"access-token-unsecure-{cookie}")
        return token is not None and token in gradio_app.tokens

    return logged_in
