"""The viewer's web routes (Starlette), each a few lines over :class:`RunViewer`.

- ``GET /`` and ``GET /runs/{id}``: the page (one HTML file, plain JS and CSS).
- ``GET /api/runs``: the runs list.
- ``GET /api/runs/{id}/events``: Server-Sent Events of one run, a snapshot then what is new.
- ``GET /api/runs/{id}/rows?follow=F&start=N&end=M``: rows of a followed run, as they
  scroll into view; with ``q=TEXT`` (a search) or ``errors=1`` (errors only), the
  positions are those of the rows that match.
- ``GET /api/runs/{id}/entries?seq=N&seq=M``: whole entries, when a row is opened.
- ``POST /api/runs/{id}/approvals``: ``{"answers": [{"call_id", "allow", "note"}]}``, only
  when turned on.

Requests must name this server as their Host (a web page elsewhere cannot reach it by
DNS rebinding), and a POST must come from this page (same Origin, JSON body) and carry
the token the viewer printed at start in its URL (header ``X-Approval-Token``): another
program on the machine, or on the network, cannot answer for the person at the page.
Every response forbids framing (``frame-ancestors 'none'``) and loading anything from
elsewhere (``Content-Security-Policy``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .cluster import Answer
from .row_filter import RowFilter
from .service import RunViewer, ViewerError

_STATIC = ("viewer.js", "viewer.css")
TOKEN_HEADER = "X-Approval-Token"
# Inline style attributes only: the page draws bars with them; no inline script.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def create_app(
    viewer: RunViewer,
    *,
    allowed_hosts: Sequence[str] = ("*",),
    approval_token: str | None = None,
) -> Starlette:
    """The ASGI app serving ``viewer``. ``allowed_hosts`` are the Host headers accepted;
    an approval must carry ``approval_token`` (none given: every approval is refused)."""
    page = _asset("index.html")
    assets = {name: _asset(name) for name in _STATIC}

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers=_NO_CACHE)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in assets:
            return Response("not found", 404)
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        return Response(assets[name], media_type=kind, headers=_NO_CACHE)

    async def runs(request: Request) -> Response:
        return await _answer(viewer.runs())

    async def events(request: Request) -> Response:
        state_id = request.path_params["state_id"]
        updates = viewer.follow(state_id, still_wanted=lambda: _connected(request))
        try:
            first = await anext(updates)
        except ViewerError as error:
            return JSONResponse({"error": str(error)}, error.status)
        return StreamingResponse(
            _event_stream(first.to_json(), updates),
            media_type="text/event-stream",
            headers={**_NO_CACHE, "X-Accel-Buffering": "no"},
        )

    async def rows(request: Request) -> Response:
        query = request.query_params
        try:
            start, end = int(query.get("start", "")), int(query.get("end", ""))
        except ValueError:
            return JSONResponse({"error": "start and end must be whole numbers"}, 400)
        try:
            keep = RowFilter(query.get("q", ""), query.get("errors", "") in ("1", "true"))
            state_id, follow = request.path_params["state_id"], query.get("follow", "")
            rows = viewer.page(state_id, follow, start, end, keep)
        except ViewerError as error:
            return JSONResponse({"error": str(error)}, error.status)
        return _compact(rows)

    async def entries(request: Request) -> Response:
        try:
            seqs = [int(value) for value in request.query_params.getlist("seq")]
        except ValueError:
            return JSONResponse({"error": "seq must be whole numbers"}, 400)
        found = viewer.entries(request.path_params["state_id"], seqs[:100])
        return await _answer(_wrapped("entries", found))

    async def approve(request: Request) -> Response:
        if not _from_this_page(request):
            return JSONResponse({"error": "approvals come from this viewer's page only"}, 403)
        if viewer.allow_approvals and not _has_token(request, approval_token):
            return JSONResponse(
                {
                    "error": "this page has not the viewer's token: open the address "
                    "alpineagents ui printed when it started (it ends in ?token=...)"
                },
                403,
            )
        try:
            body = await request.json()
            answers = [_answer_of(item) for item in body["answers"]]
        except (ValueError, KeyError, TypeError) as error:
            return JSONResponse(
                {"error": f'send {{"answers": [{{"call_id": "...", "allow": true}}]}}: {error}'},
                400,
            )
        done = viewer.approve(request.path_params["state_id"], answers)
        return await _answer(_wrapped("recorded_in", done))

    routes = [
        Route("/", index),
        Route("/runs/{state_id:path}", index),
        Route("/static/{name}", asset),
        Route("/api/runs", runs),
        Route("/api/runs/{state_id:path}/events", events),
        Route("/api/runs/{state_id:path}/rows", rows),
        Route("/api/runs/{state_id:path}/entries", entries),
        Route("/api/runs/{state_id:path}/approvals", approve, methods=["POST"]),
    ]
    middleware = [
        Middleware(_SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
    ]
    return Starlette(routes=routes, middleware=middleware)


_NO_CACHE = {"Cache-Control": "no-store"}


async def _answer(work: Any) -> Response:
    try:
        return JSONResponse(await work)
    except ViewerError as error:
        return JSONResponse({"error": str(error)}, error.status)


async def _wrapped(key: str, work: Any) -> dict[str, Any]:
    return {key: await work}


async def _connected(request: Request) -> bool:
    return not await request.is_disconnected()


async def _event_stream(first: dict[str, Any], updates: AsyncIterator[Any]) -> AsyncIterator[str]:
    yield _event(first)
    try:
        async for update in updates:
            yield _event(update.to_json())
    except ViewerError as error:
        yield f"event: failure\ndata: {json.dumps({'error': str(error)})}\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"id: {data['next_seq']}\ndata: {_json(data)}\n\n"


def _compact(data: dict[str, Any]) -> Response:
    return Response(_json(data), media_type="application/json", headers=_NO_CACHE)


def _json(data: dict[str, Any]) -> str:
    # One line (an event's data must be), without the spaces JSONResponse leaves out too.
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _answer_of(item: Any) -> Answer:
    allow = item["allow"]
    if not isinstance(allow, bool):
        raise TypeError("allow must be true or false")
    return Answer(str(item["call_id"]), allow, str(item.get("note") or ""))


class _SecurityHeaders:
    """Adds the Content-Security-Policy (no framing, nothing from elsewhere) to every
    response, the refusals of the middleware after it included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()))
                headers.append((b"x-frame-options", b"DENY"))  # for browsers before CSP 2
                headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _has_token(request: Request, token: str | None) -> bool:
    given = request.headers.get(TOKEN_HEADER, "")
    return token is not None and hmac.compare_digest(given.encode(), token.encode())


def _from_this_page(request: Request) -> bool:
    # A form or fetch from another site carries its own Origin; a JSON content type
    # cannot be sent cross-site without a preflight this server never answers.
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None and origin.split("://", 1)[-1] != host:
        return False
    return request.headers.get("content-type", "").startswith("application/json")
