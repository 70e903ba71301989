"""``Idempotency-Key`` middleware for WSGI applications (Flask, Django,
Falcon, Pyramid), with the Rust tower layer's decisions and status
table::

    from flask import Flask
    from idem_engine import Idem, current_run
    from idem_engine.wsgi import IdempotencyMiddleware

    app = Flask(__name__)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, idem=Idem("sqlite:idem.db"))

    @app.post("/charges")
    def charge():
        run = current_run()          # also request.environ["idem.run"]
        return {"charged": True, "fence": run.fence}

The answers are those of :mod:`idem_engine.asgi`. The engine waits for
the store without holding the GIL, and the lease's heartbeat runs on the
engine's own threads, so a long handler keeps its key.
"""

from __future__ import annotations

import io
from http import HTTPStatus
from typing import Any, Callable, Iterable, List, Optional, Tuple
from urllib.parse import quote

from ._http import RAISED, Answer, Headers, context_of, guard
from ._idem import Idem
from ._run import running

Environ = dict
StartResponse = Callable[..., Callable[[bytes], Any]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

#: Request headers WSGI keeps outside ``HTTP_*``.
_UNPREFIXED = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}


class IdempotencyMiddleware:
    """Wraps ``app``: covered requests run once per key, over ``idem``'s
    store. ``tenant(environ)`` and the options are those of
    :class:`idem_engine.asgi.IdempotencyMiddleware`."""

    def __init__(
        self,
        app: WSGIApp,
        idem: Idem,
        tenant: Optional[Callable[[Environ], Optional[str]]] = None,
        **options: Any,
    ) -> None:
        self.app = app
        self._tenant = tenant
        self._guard = guard(idem, tenant, options)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        if not self._guard.covers(method):
            return self.app(environ, start_response)
        body = _body(environ)
        path = quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""), safe="/;=,@:+$!*'()~")
        target = path + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else "")
        tenant = self._tenant(environ) if self._tenant is not None else None
        begun = self._guard.begin(method, target, _headers(environ), body, None, tenant)
        if isinstance(begun, tuple):
            return _send(start_response, begun)
        run = context_of(begun, f"{method} {path}")
        inner = dict(environ, **{"wsgi.input": io.BytesIO(body), "idem.run": run})
        response = _Response()
        raised: Optional[BaseException] = None
        try:
            with running(run):
                made = response.answer(self.app(inner, response.start_response))
        except Exception as error:  # noqa: BLE001 - answered, then raised on
            raised = error
        answer = begun.finish(*(RAISED if raised is not None else made))
        if raised is not None:
            raise raised
        return _send(start_response, answer)


def _body(environ: Environ) -> bytes:
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        return stream.read(int(length))
    if environ.get("wsgi.input_terminated"):
        return stream.read()
    return b""


def _headers(environ: Environ) -> Headers:
    headers: Headers = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            header = name[5:].replace("_", "-").lower()
        elif name in _UNPREFIXED and value:
            header = _UNPREFIXED[name]
        else:
            continue
        headers.append((header, value.encode("latin-1")))
    return headers


class _Response:
    """The app's response, held whole."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: Headers = []
        self.chunks: List[bytes] = []

    def start_response(
        self, status: str, headers: List[Tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], Any]:
        self.status = int(status.split(" ", 1)[0])
        self.headers = [(name.lower(), value.encode("latin-1")) for name, value in headers]
        return self.chunks.append

    def answer(self, body: Iterable[bytes]) -> Answer:
        try:
            self.chunks.extend(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        return self.status, self.headers, b"".join(self.chunks)


def _send(start_response: StartResponse, answer: Answer) -> List[bytes]:
    status, headers, body = answer
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    start_response(
        f"{status} {phrase}", [(name, value.decode("latin-1")) for name, value in headers]
    )
    return [body]


__all__ = ["IdempotencyMiddleware"]
