"""One run as its handler sees it (``RunContext``: the fence, the
lease-lost check, steps) and as the ``with`` block and the decorated
function hold it (``Run``: ended with ``complete``, ``fail`` or
``release``): the engine's run behind Python values."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
from typing import Any, Awaitable, Callable, Iterator, Mapping, Optional, TypeVar, Union

from . import _native
from ._errors import IdemError, LeaseLost, Terminal

T = TypeVar("T")

_current: contextvars.ContextVar[Optional["RunContext"]] = contextvars.ContextVar(
    "idem_current_run", default=None
)


def current_run() -> "RunContext":
    """The run this code runs in (inside a function decorated with
    ``Idem.idempotent``, or a request handler behind the ASGI or WSGI
    middleware): its ``fence``, ``attempt``, ``takeover``, ``check`` and
    ``step``."""
    run = _current.get()
    if run is None:
        raise IdemError("current_run() is only available inside an idempotent call")
    return run


@contextlib.contextmanager
def running(run: "RunContext") -> Iterator[None]:
    """``current_run()`` is ``run`` while a handler runs."""
    token = _current.set(run)
    try:
        yield
    finally:
        _current.reset(token)


def dumps(value: Any) -> bytes:
    """``value`` as the JSON idem stores (no NaN or infinities)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()


def _encoded(value: Any) -> tuple[Optional[bytes], Optional[str]]:
    try:
        return dumps(value), None
    except (TypeError, ValueError) as e:
        return None, str(e)


def _failure(error: BaseException) -> tuple[str, str]:
    if isinstance(error, Terminal):
        return str(error) or type(error).__name__, "terminal"
    return f"{type(error).__name__}: {error}", "retryable"


class RunContext:
    """A run as its handler sees it: pass ``fence`` to downstream writes
    that refuse an older holder's, call ``check()`` before an irreversible
    step, and journal side effects with ``step``. The engine's own threads
    extend the lease every third of it, whatever this thread does.

    A request that passed through the HTTP middleware unguarded (no key,
    none required) has no run: ``fence`` is ``None`` and ``step`` raises.
    """

    def __init__(self, native: Optional[_native.Context], what: str) -> None:
        self._ctx = native
        self._what = what

    def _live(self) -> _native.Context:
        if self._ctx is None:
            raise IdemError(f"{self._what}: there is no run to act on")
        return self._ctx

    @property
    def fence(self) -> Optional[int]:
        """The fencing number: pass it to downstream writes that refuse an
        older holder's (``None`` without a run)."""
        return None if self._ctx is None else self._ctx.fence

    @property
    def attempt(self) -> Optional[int]:
        """Which attempt of the key this is (1 for the first)."""
        return None if self._ctx is None else self._ctx.attempt

    @property
    def takeover(self) -> bool:
        """Whether this run took the key over from a worker that stalled or
        died."""
        return self._ctx is not None and self._ctx.takeover

    @property
    def lease_lost(self) -> bool:
        """Whether the lease is known lost (see :meth:`check`)."""
        return self._ctx is not None and self._ctx.lease_lost

    def check(self) -> None:
        """Raises :class:`LeaseLost` if the lease was lost: call it before
        an irreversible step. It reads the engine's last confirmed deadline
        and the clock, so a process that stalled finds out at once."""
        if self._ctx is not None:
            self._ctx.check()

    def send(
        self,
        destination: str,
        payload: Union[bytes, str, Any],
        headers: Optional[Mapping[str, str]] = None,
    ) -> str:
        """Sends a message through the engine's outbox (``Idem(outbox=...)``):
        held until the run ends, stored with its result in the same write,
        sent after it, and never again when a duplicate is replayed; a run
        that fails or is released sends nothing. ``destination`` is the
        broker's (a RabbitMQ routing key, an SQS queue URL, a subject, a
        topic); ``payload`` is bytes, text (UTF-8), or a value sent as
        JSON. Returns the message's id (a UUIDv7): the broker's
        deduplication id and the ``Idempotency-Key`` header a consumer
        downstream keys on. Raises :class:`InvalidInput` without an
        outbox, for a malformed or oversize message, or after the run
        ended."""
        if isinstance(payload, str):
            body = payload.encode()
        elif isinstance(payload, (bytes, bytearray, memoryview)):
            body = bytes(payload)
        else:
            body = dumps(payload)
        return self._live().send(destination, body, list((headers or {}).items()))

    def step(self, name: str, fn: Callable[[str], T], policy: str = "retry") -> T:
        """A journaled step: runs ``fn(downstream_key)`` once across every
        attempt of the run and returns its result (JSON-encodable), from
        the journal when an earlier attempt finished it.

        Pass ``downstream_key`` to an external API that deduplicates on a
        key (a payment provider's Idempotency-Key). If an earlier attempt
        began the step and never finished, its effect is in doubt:
        ``policy="retry"`` runs it again with the same downstream key;
        ``"skip"`` returns ``None`` without running it; ``"park"`` raises
        :class:`StepInDoubt` and the run ends failed as ``unknown``. A name
        used twice in one run raises :class:`InvalidStep`.
        """
        begun = self._live().begin_step(name, policy)
        if not isinstance(begun, _native.Step):
            return None if begun is None else json.loads(begun)  # type: ignore[return-value]
        value = fn(begun.key)
        begun.finish(dumps(value))
        return value

    async def astep(
        self, name: str, fn: Callable[[str], Union[T, Awaitable[T]]], policy: str = "retry"
    ) -> T:
        """:meth:`step` for asyncio: ``fn`` may be a coroutine function."""
        begun = await self._live().begin_step_async(name, policy)
        if not isinstance(begun, _native.Step):
            return None if begun is None else json.loads(begun)  # type: ignore[return-value]
        value = fn(begun.key)
        if inspect.isawaitable(value):
            value = await value
        await begun.finish_async(dumps(value))
        return value  # type: ignore[return-value]


class Run(RunContext):
    """A claim of ``scope``/``key``.

    When ``replayed`` is true, the key ran before: ``result`` is its stored
    result, and there is nothing to do. Otherwise the caller holds the key:
    do the work (see :class:`RunContext`) and end with ``complete(result)``,
    ``fail(...)`` or ``release()`` (or their ``a``-prefixed awaitables).
    """

    def __init__(
        self, scope: str, key: str, native: Union[_native.Run, bytes]
    ) -> None:
        held = None if isinstance(native, bytes) else native
        super().__init__(None if held is None else held.context, f"{scope}/{key}")
        self.scope = scope
        self.key = key
        self.replayed = held is None
        self.result: Any = json.loads(native) if isinstance(native, bytes) else None
        self._native = held
        self._ended = self.replayed

    def _held(self) -> _native.Run:
        if self._native is None:
            raise IdemError(f"{self.scope}/{self.key} was replayed: there is no claim to act on")
        if self._ended:
            raise IdemError(f"{self.scope}/{self.key}: the run has already ended")
        return self._native

    def _live(self) -> _native.Context:
        self._held()
        return super()._live()

    def complete(self, result: Any) -> None:
        """Stores ``result`` (anything ``json.dumps`` takes, without NaN or
        infinities); every later claim of the key gets it back. While the
        store is away, the engine retries for up to a lease.

        The work has run by now, so a result that cannot be stored (not
        JSON, or over ``max_result_bytes``) is recorded as a terminal
        failure with the reason, and the error is raised."""
        native = self._held()
        self._ended = True
        native.complete(*_encoded(result))

    async def acomplete(self, result: Any) -> None:
        """:meth:`complete`, awaited without blocking the event loop."""
        native = self._held()
        self._ended = True
        await native.complete_async(*_encoded(result))

    def fail(self, message: str, terminal: bool = False, unknown: bool = False) -> None:
        """Records a failure: by default retryable (the key is released and
        the next claim runs it again); ``terminal`` is stored and replayed;
        ``unknown`` parks the record for ``idem resolve``."""
        native = self._held()
        self._ended = True
        native.fail(message, "unknown" if unknown else "terminal" if terminal else "retryable")

    async def afail(self, message: str, terminal: bool = False, unknown: bool = False) -> None:
        """:meth:`fail`, awaited."""
        native = self._held()
        self._ended = True
        await native.fail_async(
            message, "unknown" if unknown else "terminal" if terminal else "retryable"
        )

    def release(self) -> None:
        """Gives the claim back without an outcome: the next claim runs the
        work."""
        native = self._held()
        self._ended = True
        native.release()

    async def arelease(self) -> None:
        """:meth:`release`, awaited."""
        native = self._held()
        self._ended = True
        await native.release_async()

    def _on_exit(self, error: Optional[BaseException]) -> Union[None, str, tuple[str, bool]]:
        """What leaving the block does: nothing (``None``), ``"release"``
        (it ended without an outcome), or a failure ``(message, terminal)``
        to record."""
        if self._ended:
            return None
        if error is None:
            return "release"
        if isinstance(error, LeaseLost):
            self._ended = True
            return None
        message, failure_class = _failure(error)
        return message, failure_class == "terminal"

    def _unfinished(self) -> IdemError:
        return IdemError(
            f"{self.scope}/{self.key}: the block ended without run.complete(result); "
            "the claim was released"
        )

    def _exit(self, error: Optional[BaseException]) -> None:
        action = self._on_exit(error)
        if action == "release":
            self.release()
            raise self._unfinished()
        if isinstance(action, tuple):
            try:
                self.fail(action[0], terminal=action[1])
            except IdemError:
                # The handler's own error says more; an unrecorded failure
                # leaves the claim to run out, as a crash would.
                pass

    async def _aexit(self, error: Optional[BaseException]) -> None:
        action = self._on_exit(error)
        if action == "release":
            await self.arelease()
            raise self._unfinished()
        if isinstance(action, tuple):
            try:
                await self.afail(action[0], terminal=action[1])
            except IdemError:
                pass
