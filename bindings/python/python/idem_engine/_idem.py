"""``Idem``: claims as context managers (``with`` and ``async with``), and
a decorator that makes a function idempotent."""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Optional, Type, Union

from . import _native
from ._run import Run, _current, dumps

DEFAULT_STORE = "sqlite:idem.db"


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
    """The fingerprint the engine takes of a JSON-encodable value: SHA-256
    of its canonical JSON, so equal payloads match whatever their key
    order."""
    return _native.fingerprint(dumps(value))


class Claim:
    """A claim of ``scope``/``key`` for a ``with`` or ``async with`` block;
    from :meth:`Idem.claim`."""

    def __init__(
        self,
        engine: _native.Engine,
        scope: str,
        key: str,
        fingerprint: Optional[bytes],
        wait: Optional[float],
    ) -> None:
        self._engine = engine
        self._args = (scope, key, fingerprint, wait)
        self._run: Optional[Run] = None

    def __enter__(self) -> Run:
        scope, key = self._args[0], self._args[1]
        self._run = Run(scope, key, self._engine.begin(*self._args))
        return self._run

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        error: Optional[BaseException],
        trace: Optional[TracebackType],
    ) -> None:
        if self._run is not None:
            self._run._exit(error)

    async def __aenter__(self) -> Run:
        scope, key = self._args[0], self._args[1]
        self._run = Run(scope, key, await self._engine.begin_async(*self._args))
        return self._run

    async def __aexit__(
        self,
        kind: Optional[Type[BaseException]],
        error: Optional[BaseException],
        trace: Optional[TracebackType],
    ) -> None:
        if self._run is not None:
            await self._run._aexit(error)


class Idem:
    """idem's executor, in this process, over the store at ``url``:

    - ``sqlite:PATH`` (the default, ``sqlite:idem.db``: a file, no server;
      processes on one machine share it),
    - ``redis://``, ``rediss://``, ``redis+cluster://``,
    - ``postgres://``,
    - ``mysql://`` (MySQL or MariaDB),
    - ``dynamodb://TABLE?region=R`` (credentials from the environment),
    - ``memory:`` (this process only),
    - ``http(s)://`` for a remote ``idem serve`` (with ``token``).

    ``lease`` (seconds) is how long a claim is held without a heartbeat;
    the engine extends it every third of it, on threads of its own, while
    the work runs. ``retention`` and ``failure_retention`` (seconds) are
    how long results and terminal failures are kept; ``wait`` is how long
    a claim waits for a duplicate in flight by default. ``keyring`` is a
    file of keys (``id:64-hex-digits`` a line, newest first) that seal
    every stored result and step result at rest; ``key_secret`` a file
    holding the secret (64 hex digits) keys are hashed with at rest.
    ``outbox`` names the broker what runs send goes to (see
    :meth:`RunContext.send`): ``amqp://`` (RabbitMQ, publisher confirms),
    ``sqs://?endpoint=URL&region=R`` (credentials from the environment);
    the engine sends each run's messages after its completion is stored,
    and a dispatcher on its own threads sends what a process that died
    left unsent. Over ``idem serve`` the server sends (``idem serve
    --outbox URL``): ``run.send`` works without ``outbox``, and one given
    is refused.

    In a forked child (gunicorn's ``preload``, ``multiprocessing``) the
    engine opens the store again on first use; a run begun in the parent
    stays the parent's.
    """

    def __init__(
        self,
        url: str = DEFAULT_STORE,
        *,
        token: Optional[str] = None,
        lease: Optional[float] = None,
        retention: Optional[float] = None,
        failure_retention: Optional[float] = None,
        wait: Optional[float] = None,
        max_attempts: Optional[int] = None,
        max_result_bytes: Optional[int] = None,
        keyring: Optional[str] = None,
        key_secret: Optional[str] = None,
        outbox: Optional[str] = None,
    ) -> None:
        self._engine = _native.Engine(
            url,
            token=token,
            lease=lease,
            retention=retention,
            failure_retention=failure_retention,
            wait=wait,
            max_attempts=max_attempts,
            max_result_bytes=max_result_bytes,
            keyring=keyring,
            key_secret=key_secret,
            outbox=outbox,
        )

    @property
    def url(self) -> str:
        """The store's URL, its password hidden."""
        return self._engine.url

    def claim(
        self,
        scope: str,
        key: str,
        *,
        fingerprint: Any = None,
        wait: Optional[float] = None,
    ) -> Claim:
        """Claims ``key`` in ``scope`` for the block::

            with idem.claim("charges", order["id"], fingerprint=order) as run:
                if run.replayed:
                    receipt = run.result
                else:
                    receipt = charge(order, fence=run.fence)
                    run.complete(receipt)

        The same with ``async with`` and ``await run.acomplete(...)``.

        ``fingerprint``: any JSON-encodable value that must stay the same
        under the key (the request); another one raises :class:`Mismatch`.
        ``wait``: seconds to wait for a running duplicate's outcome before
        raising :class:`InProgress`.

        An exception out of the block fails the run: a :class:`Terminal`
        one is stored and replayed, any other releases the key for a retry.
        A block that ends without completing the run releases the key and
        raises.
        """
        encoded = None if fingerprint is None else dumps(fingerprint)
        return Claim(self._engine, scope, key, encoded, wait)

    def record(self, scope: str, key: str) -> Optional[dict[str, Any]]:
        """The record of ``key`` as stored (``state``, ``attempt``,
        ``fence``, ``response`` or ``class``/``message``...), or ``None``."""
        found = self._engine.record(scope, key)
        return None if found is None else json.loads(found)

    def idempotent(
        self,
        scope: str,
        key: Union[str, Callable[..., Any]],
        *,
        fingerprint: Optional[Callable[..., Any]] = None,
        wait: Optional[float] = None,
    ) -> Callable[[Callable[..., Any]], Any]:
        """Makes a function (or coroutine function) idempotent: every call
        with the same key has the effect of one call, and returns its
        result::

            @idem.idempotent(scope="charges", key="order_id")
            def charge(order_id, amount): ...

        ``key``: the name of the argument that holds the key, or a function
        of the call's arguments that returns it. ``fingerprint``: a function
        of the arguments whose (JSON-encodable) result must stay the same
        under the key. The function's result must be JSON-encodable.

        ``charge(...)`` returns the value; ``charge.run(...)`` returns
        :class:`Executed` or :class:`Replayed` (awaitables for a coroutine
        function). Inside the function, :func:`current_run` gives the fence
        and steps.
        """

        def wrap(fn: Callable[..., Any]) -> Any:
            signature = inspect.signature(fn)

            def claim_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Claim:
                if callable(key):
                    k = str(key(*args, **kwargs))
                else:
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    if key not in bound.arguments:
                        raise TypeError(
                            f"{fn.__name__} has no argument {key!r} to take the key from"
                        )
                    k = str(bound.arguments[key])
                fp = fingerprint(*args, **kwargs) if fingerprint is not None else None
                return self.claim(scope, k, fingerprint=fp, wait=wait)

            if inspect.iscoroutinefunction(fn):

                async def arun(*args: Any, **kwargs: Any) -> Outcome:
                    async with claim_for(args, kwargs) as claimed:
                        if claimed.replayed:
                            return Replayed(claimed.result)
                        token = _current.set(claimed)
                        try:
                            value = await fn(*args, **kwargs)
                        finally:
                            _current.reset(token)
                        await claimed.acomplete(value)
                        return Executed(
                            value, claimed.fence or 0, claimed.attempt or 0, claimed.takeover
                        )

                @functools.wraps(fn)
                async def acall(*args: Any, **kwargs: Any) -> Any:
                    return (await arun(*args, **kwargs)).value

                acall.run = arun  # type: ignore[attr-defined]
                return acall

            def run(*args: Any, **kwargs: Any) -> Outcome:
                with claim_for(args, kwargs) as claimed:
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
