"""What the ASGI and WSGI adapters share: the engine's middleware built
from their options, and the answer a handler that raised stands for. The
decisions (keys, fingerprints, which answer for which state) are the
engine's, the same code as the Rust tower layer's."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple, TypeVar

from . import _native
from ._idem import Idem
from ._run import RunContext

#: Header lines: ``(lowercase name, value)``.
Headers = List[Tuple[str, bytes]]

#: An answer: ``(status, headers, body)``.
Answer = Tuple[int, Headers, bytes]

#: What a handler that raised answers, as the frameworks' own error pages
#: do: a 500, which releases the key so a retry runs again.
RAISED: Answer = (500, [("content-type", b"text/plain; charset=utf-8")], b"Internal Server Error")

S = TypeVar("S")


def guard(idem: Idem, tenant: Optional[Callable[[S], Optional[str]]], options: Any) -> Any:
    """The engine's middleware over ``idem``'s store, with ``options``
    (see the adapters) and per-tenant keys when ``tenant`` is given."""
    return _native.HttpGuard(idem._engine, tenant=tenant is not None, **options)


def context_of(turn: Any, what: str) -> RunContext:
    """The handler's view of ``turn``'s run."""
    return RunContext(turn.context, what)


__all__ = ["Answer", "Headers", "RAISED", "context_of", "guard"]
