"""The client: claims as a context manager, and a decorator that makes a
function idempotent."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Union

from ._errors import ApiError, InProgress, LeaseLost, Mismatch, ReplayedFailure
from ._heartbeat import Heartbeats
from ._run import Run, _current
from ._transport import Transport


@dataclass(frozen=True)
class Executed:
    """The call ran now: ``value`` is what the function returned."""

    value: Any
    fence: int
    attempt: int
    takeover: bool


@dataclass(frozen=True)
class Replayed:
    """The call ran before: ``value`` is its stored result (as JSON
    decodes it: tuples come back as lists)."""

    value: Any


Outcome = Union[Executed, Replayed]


def fingerprint_of(value: Any) -> str:
    """The fingerprint of a JSON-encodable value: SHA-256 of its canonical
    JSON (sorted keys, no spaces), so equal payloads match whatever their
    key order."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _millis(seconds: float, name: str) -> int:
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"{name} must be at least 1 ms, got {seconds!r} s")
    return ms


class Idem:
    """A client of ``idem serve`` at ``url`` (``http://127.0.0.1:8700``),
    calling with ``token`` (one of the server's ``--tokens``; ``None`` for a
    server without them).

    ``lease`` (seconds) is how long a claim is held without a heartbeat;
    the client extends it every third of it while the work runs.
    ``retention`` (seconds) is how long outcomes are kept (the server's
    default when ``None``).
    """

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        lease: float = 30.0,
        retention: Optional[float] = None,
        timeout: float = 10.0,
        retries: int = 4,
    ) -> None:
        self._transport = Transport(url, token, timeout=timeout, retries=retries)
        self._lease_ms = _millis(lease, "lease")
        self._retention_ms = None if retention is None else _millis(retention, "retention")
        self._heartbeats = Heartbeats()

    @contextmanager
    def claim(
        self,
        scope: str,
        key: str,
        *,
        fingerprint: Any = None,
        wait: Optional[float] = None,
    ) -> Iterator[Run]:
        """Claims ``key`` in ``scope`` for the ``with`` block::

            with idem.claim("charges", order["id"], fingerprint=order) as run:
                if run.replayed:
                    receipt = run.result
                else:
                    receipt = charge(order, fence=run.fence)
                    run.complete(receipt)

        ``fingerprint``: any JSON-encodable value that must stay the same
        under the key (the request); another one raises :class:`Mismatch`.
        ``wait``: seconds to wait for a running duplicate's outcome before
        raising :class:`InProgress`.

        An exception out of the block fails the run: a :class:`Terminal`
        one is stored and replayed, any other releases the key for a retry.
        A block that ends without ``run.complete`` releases the key and
        raises.
        """
        body: dict[str, Any] = {"scope": scope, "key": key, "lease_ms": self._lease_ms}
        if self._retention_ms is not None:
            body["retention_ms"] = self._retention_ms
        if fingerprint is not None:
            body["fingerprint"] = fingerprint_of(fingerprint)
        wait_ms = 0 if wait is None else max(0, round(wait * 1000))
        if wait_ms:
            body["wait_ms"] = wait_ms
        sent = time.monotonic()
        answer = self._transport.call("POST", "/v1/claim", body, extra_time=wait_ms / 1000)
        outcome = answer["outcome"]
        if outcome == "in_progress":
            raise InProgress(scope, key, answer["retry_after_ms"] / 1000)
        if outcome == "mismatch":
            raise Mismatch(scope, key)
        if outcome == "failed":
            raise ReplayedFailure(scope, key, answer["class"], answer["message"])
        run = Run(
            self._transport, scope, key, answer, self._lease_ms, self._retention_ms, self._heartbeats, sent
        )
        if run.fence is not None:
            try:
                run.check()
            except LeaseLost:
                # The claim was lost before the work began: it must not begin.
                run._end()
                raise
        try:
            yield run
        except BaseException as error:
            run._exit(error)
            raise
        run._exit(None)

    def record(self, scope: str, key: str) -> Optional[dict[str, Any]]:
        """The record of ``key`` as stored, or ``None`` if there is none."""
        try:
            return self._transport.call("GET", "/v1/record", query={"scope": scope, "key": key})
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def idempotent(
        self,
        scope: str,
        key: Union[str, Callable[..., Any]],
        *,
        fingerprint: Optional[Callable[..., Any]] = None,
        wait: Optional[float] = None,
    ) -> Callable[[Callable[..., Any]], Any]:
        """Makes a function idempotent: every call with the same key has the
        effect of one call, and returns its result::

            @idem.idempotent(scope="charges", key="order_id")
            def charge(order_id, amount): ...

        ``key``: the name of the argument that holds the key, or a function
        of the call's arguments that returns it. ``fingerprint``: a function
        of the arguments whose (JSON-encodable) result must stay the same
        under the key. The function's result must be JSON-encodable.

        ``charge(...)`` returns the value; ``charge.run(...)`` returns
        :class:`Executed` or :class:`Replayed`. Inside the function,
        :func:`current_run` gives the fence and steps.
        """

        def wrap(fn: Callable[..., Any]) -> Any:
            signature = inspect.signature(fn)

            def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
                if callable(key):
                    return str(key(*args, **kwargs))
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                if key not in bound.arguments:
                    raise TypeError(f"{fn.__name__} has no argument {key!r} to take the key from")
                return str(bound.arguments[key])

            def run(*args: Any, **kwargs: Any) -> Outcome:
                fp = fingerprint(*args, **kwargs) if fingerprint is not None else None
                with self.claim(scope, key_of(args, kwargs), fingerprint=fp, wait=wait) as claimed:
                    if claimed.replayed:
                        return Replayed(claimed.result)
                    token = _current.set(claimed)
                    try:
                        value = fn(*args, **kwargs)
                    finally:
                        _current.reset(token)
                    claimed.complete(value)
                    return Executed(value, claimed.fence or 0, claimed.attempt or 0, claimed.takeover)

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                return run(*args, **kwargs).value

            call.run = run  # type: ignore[attr-defined]
            return call

        return wrap

