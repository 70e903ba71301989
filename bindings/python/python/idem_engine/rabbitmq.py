"""Exactly-once handlers for RabbitMQ consumers with aio-pika: every
delivery runs through idem's consumer layer (the Rust ``idem-consumer``
code, not a copy), which reads its key, runs the handler once per key and
decides what happens to the message; this adapter carries that out on the
same topology as the Rust ``idem-rabbitmq`` crate, so Python and Rust
workers can share a queue::

    import aio_pika
    from idem_engine import Idem
    from idem_engine.rabbitmq import RabbitConsumer

    async def ship(message, run):
        order = json.loads(message.body)
        return await warehouse.ship(order, fence=run.fence)

    connection = await aio_pika.connect_robust("amqp://guest:guest@127.0.0.1/")
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=16)
    consumer = RabbitConsumer(Idem("sqlite:idem.db"), channel, "orders")
    await consumer.consume(ship)

| the consumer layer decides | on the broker |
|---|---|
| ack (ran now, or a duplicate of a completed one) | ``basic.ack`` |
| retry after *d* (in progress elsewhere, a retryable failure, the store away) | a copy to ``<queue>.retry.<ms>ms``, the smallest delay at least *d*, whose TTL dead-letters it back to ``<queue>``; then the ack |
| dead-letter (a terminal failure, attempts exhausted, no usable key, a key reused with another payload) | a copy to ``<queue>.dead`` with ``Idem-Reason``, ``Idem-Key`` and ``Idem-Consumer``; then the ack |

Copies keep the original's body, properties and headers and are
published with publisher confirms (aio-pika's default): the original is
acked only once its copy is confirmed. A retry copy that is not confirmed
requeues the original (``basic.nack``); a dead-letter copy that is not
confirmed becomes a retry after the longest delay. Nothing is lost; at
worst a message is delivered once more, which its key makes harmless.

The handler is ``async def handler(message, run)``: its return value
(JSON) is stored and replayed to duplicates; raising ``Terminal``
dead-letters the message, any other exception retries it with backoff.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Tuple

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from . import _native
from ._idem import Idem
from ._run import RunContext, _encoded, _failure, running

#: The retry delays (seconds) unless configured, as idem-rabbitmq's.
DEFAULT_RETRY_DELAYS: Tuple[float, ...] = (1.0, 5.0, 30.0, 120.0, 600.0)

#: Counts how many times a message went through a retry queue.
RETRIES_HEADER = "x-idem-retries"

Handler = Callable[[AbstractIncomingMessage, RunContext], Awaitable[Any]]


@dataclass(frozen=True)
class Settlement:
    """What the consumer layer decided for a delivery, and was done."""

    #: ``"ack"``, ``"retry"`` or ``"dead_letter"``.
    action: str
    #: For a retry, the delay asked for (seconds).
    after: Optional[float]
    #: Why (a retry's cause, a dead-letter's reason).
    reason: Optional[str]
    #: For an ack, whether the delivery was a duplicate of a completed one.
    replayed: bool
    #: The delivery's key, when one could be read.
    key: Optional[str]
    #: The headers a dead-letter copy carries.
    dead_letter_headers: List[Tuple[str, str]] = field(default_factory=list)


def _text_headers(message: AbstractIncomingMessage) -> List[Tuple[str, str]]:
    headers = []
    for name, value in (message.headers or {}).items():
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                continue
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            headers.append((name, str(value)))
    return headers


def _delivery_count(message: AbstractIncomingMessage) -> Optional[int]:
    """Quorum queues count earlier deliveries in ``x-delivery-count``."""
    earlier = (message.headers or {}).get("x-delivery-count")
    return earlier + 1 if isinstance(earlier, int) and not isinstance(earlier, bool) else None


class RabbitConsumer:
    """Runs the deliveries of ``queue`` on ``channel`` through idem.

    ``scope`` names the keys' scope (default: the queue's name). ``keys``
    says where keys come from, tried in order: ``"header:NAME"``,
    ``"message_id"``, a JSON pointer into the body (``"/order_id"``),
    ``"fields:/a,/b"`` (a hash of those fields), ``"composite:/a,/b"``
    (their values joined with ``:``) or ``"content_hash"`` (default: the ``Idempotency-Key`` header, then the
    message id). ``fingerprint`` (default ``True``) dead-letters a key
    reused with another body. ``retry_delays`` are the retry queues'
    delays in seconds.
    """

    def __init__(
        self,
        idem: Idem,
        channel: AbstractChannel,
        queue: str,
        *,
        scope: Optional[str] = None,
        keys: Optional[Sequence[str]] = None,
        fingerprint: Optional[bool] = None,
        retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
    ) -> None:
        if not retry_delays or any(d <= 0 for d in retry_delays):
            raise ValueError("retry_delays: give at least one delay, each above zero")
        self.channel = channel
        self.queue = queue
        self.retry_delays = tuple(sorted(retry_delays))
        self._guard = _native.ConsumerGuard(
            idem._engine,
            scope or queue,
            keys=list(keys) if keys is not None else None,
            fingerprint=fingerprint,
            name=queue,
            max_retry_delay=self.retry_delays[-1],
        )

    @property
    def dead_letter_queue(self) -> str:
        """``<queue>.dead``."""
        return f"{self.queue}.dead"

    def retry_queue(self, delay: float) -> str:
        """The retry queue of ``delay`` seconds."""
        return f"{self.queue}.retry.{round(delay * 1000)}ms"

    async def declare(self) -> AbstractQueue:
        """Declares the topology (durable): ``<queue>`` dead-lettering to
        ``<queue>.dead``, one retry queue per delay dead-lettering back to
        ``<queue>``, and ``<queue>.dead``. Returns ``<queue>``."""
        await self.channel.declare_queue(self.dead_letter_queue, durable=True)
        main = await self.channel.declare_queue(
            self.queue,
            durable=True,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.dead_letter_queue,
            },
        )
        for delay in self.retry_delays:
            await self.channel.declare_queue(
                self.retry_queue(delay),
                durable=True,
                arguments={
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": self.queue,
                    "x-message-ttl": round(delay * 1000),
                },
            )
        return main

    async def consume(self, handler: Handler) -> str:
        """Declares the topology and consumes ``<queue>`` with manual
        acknowledgements; returns the consumer tag."""
        queue = await self.declare()
        return await queue.consume(lambda message: self.handle(message, handler))

    async def handle(self, message: AbstractIncomingMessage, handler: Handler) -> Settlement:
        """Runs one delivery through idem and settles it on the broker."""
        begun = await self._guard.begin_async(
            message.body, _text_headers(message), message.message_id, _delivery_count(message)
        )
        if isinstance(begun, tuple):
            decided = begun
        else:
            run = RunContext(begun.context, f"{self.queue}/{begun.key}")
            try:
                with running(run):
                    value = await handler(message, run)
            except Exception as error:  # noqa: BLE001 - recorded as the failure it is
                decided = await begun.fail_async(*_failure(error))
            else:
                decided = await begun.complete_async(*_encoded(value))
        settlement = Settlement(*decided)
        await self._settle(message, settlement)
        return settlement

    async def _settle(self, message: AbstractIncomingMessage, settlement: Settlement) -> None:
        if settlement.action == "ack":
            await message.ack()
        elif settlement.action == "retry":
            await self._retry(message, settlement.after or 0.0)
        else:
            try:
                await self._copy(message, self.dead_letter_queue, dict(settlement.dead_letter_headers))
            except Exception:  # noqa: BLE001 - not confirmed: retried instead, never lost
                await self._retry(message, self.retry_delays[-1])
                return
            await message.ack()

    async def _retry(self, message: AbstractIncomingMessage, after: float) -> None:
        delay = next((d for d in self.retry_delays if d >= after), self.retry_delays[-1])
        retries = (message.headers or {}).get(RETRIES_HEADER)
        retries = retries + 1 if isinstance(retries, int) and not isinstance(retries, bool) else 1
        try:
            await self._copy(message, self.retry_queue(delay), {RETRIES_HEADER: retries})
        except Exception:  # noqa: BLE001 - not confirmed: the broker delivers it again
            await message.nack(requeue=True)
            return
        await message.ack()

    async def _copy(self, message: AbstractIncomingMessage, queue: str, extra: dict) -> None:
        copy = aio_pika.Message(
            message.body,
            headers={**(message.headers or {}), **extra},
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=message.delivery_mode,
            priority=message.priority,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            message_id=message.message_id,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
        )
        await self.channel.default_exchange.publish(copy, routing_key=queue, mandatory=True)


__all__ = ["DEFAULT_RETRY_DELAYS", "RETRIES_HEADER", "RabbitConsumer", "Settlement"]
