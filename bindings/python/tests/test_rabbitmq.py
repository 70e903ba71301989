"""The aio-pika consumer against a real RabbitMQ broker, on SQLite and
Redis: duplicates run once and are acked, a retryable failure goes
through a retry queue and runs again, terminal failures and keyless
messages are dead-lettered with idem's headers, and two consumers on one
queue run each key once while duplicates of a running key wait."""

from __future__ import annotations

import asyncio
import json
import uuid

import aio_pika
import pytest

from idem_engine import Idem, InvalidInput, Terminal, current_run
from idem_engine.rabbitmq import RabbitConsumer


async def connected(amqp_url):
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=16)
    return connection, channel


async def publish(channel, queue, body, key=None, **properties):
    headers = {} if key is None else {"Idempotency-Key": key}
    await channel.default_exchange.publish(
        aio_pika.Message(json.dumps(body).encode(), headers=headers, **properties), routing_key=queue
    )


async def settle_all(consumer, queue, count, handler, timeout=20):
    """Takes ``count`` deliveries from ``queue`` and runs each through
    ``consumer``; returns their settlements."""
    settled = []
    async with queue.iterator() as deliveries:
        async for message in deliveries:
            settled.append(await consumer.handle(message, handler))
            if len(settled) == count:
                break
    return settled


async def cleanup(channel, consumer):
    for name in [consumer.queue, consumer.dead_letter_queue] + [
        consumer.retry_queue(d) for d in consumer.retry_delays
    ]:
        await channel.queue_delete(name)


def test_duplicates_run_once_and_are_all_acked(amqp_url, local_store):
    async def scenario():
        connection, channel = await connected(amqp_url)
        name = f"py-dup-{uuid.uuid4().hex[:8]}"
        consumer = RabbitConsumer(Idem(local_store.url, **local_store.options), channel, name)
        queue = await consumer.declare()
        runs = []

        async def ship(message, run):
            assert current_run() is run and isinstance(run.fence, int)
            runs.append(json.loads(message.body))
            return {"shipped": len(runs)}

        try:
            for _ in range(3):
                await publish(channel, name, {"order": 7}, key="order-7")
            await publish(channel, name, {"order": 8}, key="order-8")
            settled = await asyncio.wait_for(settle_all(consumer, queue, 4, ship), 20)
            left = await channel.declare_queue(name, passive=True)
            return runs, settled, left.declaration_result.message_count
        finally:
            await cleanup(channel, consumer)
            await connection.close()

    runs, settled, left = asyncio.run(scenario())
    assert runs == [{"order": 7}, {"order": 8}]
    assert [s.action for s in settled] == ["ack"] * 4
    assert [s.replayed for s in settled] == [False, True, True, False]
    assert [s.key for s in settled] == ["order-7"] * 3 + ["order-8"]
    assert left == 0


def test_a_retryable_failure_goes_through_a_retry_queue_and_runs_again(amqp_url, tmp_path):
    async def scenario():
        connection, channel = await connected(amqp_url)
        name = f"py-retry-{uuid.uuid4().hex[:8]}"
        consumer = RabbitConsumer(
            Idem(f"sqlite:{tmp_path / 'idem.db'}"), channel, name, retry_delays=(0.2, 0.5)
        )
        queue = await consumer.declare()
        attempts = []

        async def flaky(message, run):
            attempts.append(run.attempt)
            if len(attempts) == 1:
                raise ConnectionError("the warehouse is away")
            return "shipped"

        try:
            await publish(channel, name, {"order": 1}, key="o-1")
            settled = await asyncio.wait_for(settle_all(consumer, queue, 2, flaky), 20)
            return attempts, settled
        finally:
            await cleanup(channel, consumer)
            await connection.close()

    attempts, settled = asyncio.run(scenario())
    assert attempts == [1, 2]
    assert settled[0].action == "retry" and "the warehouse is away" in settled[0].reason
    assert settled[1].action == "ack" and not settled[1].replayed


def test_terminal_failures_and_keyless_messages_are_dead_lettered_with_idems_headers(
    amqp_url, tmp_path
):
    async def scenario():
        connection, channel = await connected(amqp_url)
        name = f"py-dead-{uuid.uuid4().hex[:8]}"
        consumer = RabbitConsumer(
            Idem(f"sqlite:{tmp_path / 'idem.db'}"), channel, name, keys=["header:Idempotency-Key"]
        )
        queue = await consumer.declare()
        runs = []

        async def refuse(message, run):
            runs.append(message.body)
            raise Terminal("order 9 does not exist")

        try:
            await publish(channel, name, {"order": 9}, key="o-9")
            await publish(channel, name, {"order": 10})
            settled = await asyncio.wait_for(settle_all(consumer, queue, 2, refuse), 20)
            dead = await channel.declare_queue(consumer.dead_letter_queue, passive=True)
            letters = []
            for _ in range(2):
                letter = await dead.get(timeout=5)
                letters.append(letter)
                await letter.ack()
            return runs, settled, letters
        finally:
            await cleanup(channel, consumer)
            await connection.close()

    runs, settled, letters = asyncio.run(scenario())
    assert len(runs) == 1
    assert [s.action for s in settled] == ["dead_letter", "dead_letter"]
    first, keyless = letters
    assert first.headers["Idem-Reason"].endswith("order 9 does not exist")
    assert first.headers["Idem-Key"] == "o-9"
    assert first.headers["Idem-Consumer"] == dict(settled[0].dead_letter_headers)["Idem-Consumer"]
    assert first.headers["Idem-Consumer"].startswith("py-dead-")
    assert json.loads(first.body) == {"order": 9}
    assert "no idempotency key" in keyless.headers["Idem-Reason"]
    assert "Idem-Key" not in keyless.headers


def test_two_consumers_on_one_queue_run_each_key_once(amqp_url, local_store):
    async def scenario():
        idem = Idem(local_store.url, **local_store.options)
        name = f"py-pair-{uuid.uuid4().hex[:8]}"
        workers = []
        for _ in range(2):
            connection, channel = await connected(amqp_url)
            workers.append((connection, channel, RabbitConsumer(idem, channel, name, retry_delays=(0.2,))))
        await workers[0][2].declare()
        runs = []
        acked = asyncio.Event()
        settled = []

        async def ship(message, run):
            runs.append(json.loads(message.body)["order"])
            await asyncio.sleep(0.3)  # duplicates arrive at the other worker meanwhile
            return "shipped"

        def on_message(consumer):
            async def handle(message):
                settled.append(await consumer.handle(message, ship))
                if sum(s.action == "ack" for s in settled) == 20:
                    acked.set()
            return handle

        try:
            for order in range(10):
                for _ in range(2):
                    await publish(workers[0][1], name, {"order": order}, key=f"o-{order}")
            for _, channel, consumer in workers:
                queue = await channel.declare_queue(name, passive=True)
                await queue.consume(on_message(consumer))
            await asyncio.wait_for(acked.wait(), 30)
            return runs, settled
        finally:
            await cleanup(workers[0][1], workers[0][2])
            for connection, _, _ in workers:
                await connection.close()

    runs, settled = asyncio.run(scenario())
    assert sorted(runs) == list(range(10))
    acks = [s for s in settled if s.action == "ack"]
    assert len(acks) == 20 and sum(not s.replayed for s in acks) == 10
    assert all(s.action in ("ack", "retry") for s in settled)


def test_bad_options_are_refused_when_the_consumer_is_built(tmp_path):
    idem = Idem(f"sqlite:{tmp_path / 'idem.db'}")
    with pytest.raises(Exception, match="key source"):
        RabbitConsumer(idem, None, "q", keys=["body"])
    with pytest.raises(ValueError, match="retry_delays"):
        RabbitConsumer(idem, None, "q", retry_delays=())


def test_a_handler_sends_through_the_outbox_once_per_key(amqp_url, local_store):
    """``run.send`` in a consumer's handler: the engine sends each run's
    message to RabbitMQ after its completion, with the message's id as
    ``message_id`` and ``Idempotency-Key``; duplicates replay and send
    nothing more, and a run that fails sends nothing."""

    async def scenario():
        connection, channel = await connected(amqp_url)
        name = f"py-send-{uuid.uuid4().hex[:8]}"
        out = await channel.declare_queue(f"{name}.shipped", durable=True)
        idem = Idem(local_store.url, outbox=amqp_url, **local_store.options)
        consumer = RabbitConsumer(idem, channel, name)
        queue = await consumer.declare()
        sent = {}

        async def ship(message, run):
            order = json.loads(message.body)
            sent[order["order"]] = run.send(
                out.name, {"shipped": order["order"]}, headers={"source": "py"}
            )
            if order["order"] == 9:
                raise Terminal("order 9 does not exist")
            return {"shipped": order["order"]}

        try:
            for _ in range(3):
                await publish(channel, name, {"order": 7}, key="order-7")
            await publish(channel, name, {"order": 8}, key="order-8")
            await publish(channel, name, {"order": 9}, key="order-9")
            await asyncio.wait_for(settle_all(consumer, queue, 5, ship), 20)
            received = []
            deadline = asyncio.get_running_loop().time() + 10
            while len(received) < 2 and asyncio.get_running_loop().time() < deadline:
                message = await out.get(no_ack=True, fail=False)
                if message is None:
                    await asyncio.sleep(0.05)
                    continue
                received.append(message)
            await asyncio.sleep(0.3)
            late = await out.get(no_ack=True, fail=False)
            return sent, received, late
        finally:
            await cleanup(channel, consumer)
            await channel.queue_delete(f"{name}.shipped")
            await connection.close()

    sent, received, late = asyncio.run(scenario())
    assert late is None, late.body
    assert [json.loads(m.body) for m in received] == [{"shipped": 7}, {"shipped": 8}]
    assert [m.message_id for m in received] == [sent[7], sent[8]]
    assert [m.headers["Idempotency-Key"] for m in received] == [sent[7], sent[8]]
    assert all(m.headers["source"] == "py" for m in received)


def test_a_send_without_an_outbox_or_to_an_unknown_broker_is_refused(local_store):
    idem = Idem(local_store.url, **local_store.options)
    with pytest.raises(InvalidInput, match="outbox"):
        with idem.claim("orders", f"no-outbox-{uuid.uuid4().hex[:8]}") as run:
            run.send("somewhere", b"x")
    with pytest.raises(InvalidInput, match="not a broker"):
        Idem(local_store.url, outbox="smtp://mail", **local_store.options)
