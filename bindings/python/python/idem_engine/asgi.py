"""``Idempotency-Key`` middleware for ASGI applications (Starlette,
FastAPI, Quart, Django's ASGI handler), with the Rust tower layer's
decisions and status table::

    from fastapi import FastAPI, Request
    from idem_engine import Idem, current_run
    from idem_engine.asgi import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, idem=Idem("sqlite:idem.db"))

    @app.post("/charges")
    async def charge(request: Request):
        run = current_run()          # also request.state.idem
        return {"charged": True, "fence": run.fence}

A covered request (POST and PATCH by default) with an ``Idempotency-Key``
runs once: a retry with the same key and body gets the stored response
with ``Idempotent-Replayed: true``; a retry while the first still runs
gets 409 with ``Retry-After`` (or waits, with ``Prefer: wait=N``); the
same key with another body gets 422; a malformed key 400, all as
``application/problem+json``. 2xx and 4xx responses are stored (except
408, 409, 425 and 429); anything else releases the key. A handler that
raises answers 500 (the key released) and the exception is raised on to
the server.

The response is held whole before it is sent (it is stored), so put
streaming endpoints outside the covered methods.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping, Optional

from ._http import RAISED, Answer, Headers, context_of, guard
from ._idem import Idem
from ._run import running

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class IdempotencyMiddleware:
    """Wraps ``app``: covered requests run once per key, over ``idem``'s
    store.

    ``tenant(scope)``, when given, names the verified caller (from your
    authentication, never from a header the client sets), so no caller
    can replay another's response. Options, with the tower layer's
    defaults: ``methods`` (``["POST", "PATCH"]``), ``header``
    (``"Idempotency-Key"``), ``required`` (``False``: a request without a
    key passes unguarded), ``fingerprint`` (``"request"``: method, path,
    query and body, JSON canonicalised; ``"off"``; or a list of JSON
    pointers such as ``["/amount"]``), ``max_request_bytes`` and
    ``max_response_bytes`` (1 MiB), ``max_wait`` (10 s) and
    ``default_wait`` (0 s) for duplicates in flight,
    ``forward_takeovers`` and ``reject_old_uuid_v7`` (``False``), and
    ``keep``: what is stored of responses for replays (``"full"``;
    ``"status-only"``; ``"redacted:/card/number,x-api-key"``;
    ``"reference"``, bodies over 64 KiB kept in a blob store; per path
    prefix as ``"/tokens=status-only;/users=redacted:/ssn"``), and
    ``blobs``: the blob store for ``"reference"`` (``"dir:PATH"``,
    ``"postgres://…"``; default a directory beside the embedded store).
    ``key_in_body`` (``"/id"``, ``"fields:/a,/b"``) reads the key of a
    request without the header from its JSON body; ``webhook``
    (``"standard"``, ``"stripe"``, ``"github"``) with ``webhook_secret``
    checks a webhook sender's signatures before a key is claimed; ``mcp``
    (``"idempotency_key"``) serves MCP tool calls keyed by that argument.
    """

    def __init__(
        self,
        app: ASGIApp,
        idem: Idem,
        tenant: Optional[Callable[[Scope], Optional[str]]] = None,
        **options: Any,
    ) -> None:
        self.app = app
        self._tenant = tenant
        self._guard = guard(idem, tenant, options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guard.covers(scope["method"]):
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        if body is None:
            return  # the client went away before it finished sending
        target = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers: Headers = [(name.decode("latin-1"), value) for name, value in scope["headers"]]
        tenant = self._tenant(scope) if self._tenant is not None else None
        begun = await self._guard.begin_async(
            scope["method"], target, headers, body, None, tenant
        )
        if isinstance(begun, tuple):
            await _send(send, begun)
            return
        run = context_of(begun, f"{scope['method']} {scope['path']}")
        inner = dict(scope, state={**scope.get("state", {}), "idem": run})
        response = _Response()
        raised: Optional[BaseException] = None
        try:
            with running(run):
                await self.app(inner, _replay(body, receive), response.send)
        except Exception as error:  # noqa: BLE001 - answered, then raised on
            raised = error
        made = RAISED if raised is not None or not response.complete else response.answer()
        await _send(send, await begun.finish_async(*made))
        if raised is not None:
            raise raised


async def _body(receive: Receive) -> Optional[bytes]:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the body read already, then the client's
    own messages (its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class _Response:
    """The app's response, held whole."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: Headers = []
        self.chunks: list[bytes] = []
        self.complete = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = [
                (name.decode("latin-1"), bytes(value)) for name, value in message.get("headers", [])
            ]
        elif message["type"] == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.complete = True

    def answer(self) -> Answer:
        return self.status, self.headers, b"".join(self.chunks)


async def _send(send: Send, answer: Answer) -> None:
    status, headers, body = answer
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(name.encode("latin-1"), value) for name, value in headers],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


__all__ = ["IdempotencyMiddleware"]
