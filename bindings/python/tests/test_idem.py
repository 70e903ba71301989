"""The package on each real store (SQLite, Redis, a remote idem serve):
runs once, replays, fingerprints, failures by class, real concurrency,
heartbeats past the lease, steps resumed across attempts, asyncio, and
bad input."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from idem_engine import (
    Executed,
    Idem,
    IdemError,
    InProgress,
    InvalidInput,
    InvalidStep,
    Mismatch,
    Replayed,
    ReplayedFailure,
    Terminal,
    current_run,
    fingerprint_of,
)


def open_idem(store, **options):
    return Idem(store.url, **store.options, **options)


def test_a_decorated_function_runs_once_per_key_and_replays_its_result(store):
    idem = open_idem(store)
    calls = []

    @idem.idempotent(scope="charges", key="order_id")
    def charge(order_id, amount):
        calls.append(order_id)
        return {"charge": f"ch_{order_id}", "amount": amount}

    first = charge.run("o-1", 250)
    assert isinstance(first, Executed) and first.attempt == 1 and not first.takeover
    again = charge.run("o-1", 250)
    assert again == Replayed({"charge": "ch_o-1", "amount": 250})
    assert charge("o-1", 250) == {"charge": "ch_o-1", "amount": 250}
    assert charge(order_id="o-2", amount=5)["charge"] == "ch_o-2"
    assert calls == ["o-1", "o-2"]
    record = idem.record("charges", "o-1")
    assert record["state"] == "completed" and record["fence"] == first.fence
    assert record["response"] == {"charge": "ch_o-1", "amount": 250}
    assert idem.record("charges", "never") is None


def test_a_key_used_with_another_payload_is_a_mismatch(store):
    idem = open_idem(store)

    @idem.idempotent(scope="orders", key=lambda order: order["id"], fingerprint=lambda order: order)
    def place(order):
        return order["qty"]

    assert place({"id": "a", "qty": 1}) == 1
    # The same payload with its keys in another order is the same request.
    assert place({"qty": 1, "id": "a"}) == 1
    with pytest.raises(Mismatch):
        place({"id": "a", "qty": 2})
    assert fingerprint_of({"b": 1, "a": [1, "é"]}) == fingerprint_of({"a": [1, "é"], "b": 1})


def test_terminal_failures_are_replayed_and_others_run_again(store):
    idem = open_idem(store)
    attempts = []

    @idem.idempotent(scope="mail", key="to")
    def send(to):
        attempts.append(current_run().attempt)
        if to == "nobody":
            raise Terminal("no such mailbox")
        if len(attempts) == 1:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError):
        send("ann")
    assert send("ann") == "sent"
    assert attempts == [1, 2]
    with pytest.raises(Terminal):
        send("nobody")
    with pytest.raises(ReplayedFailure) as replay:
        send("nobody")
    assert replay.value.failure_class == "terminal"
    assert replay.value.message == "no such mailbox"
    assert attempts == [1, 2, 1]


def test_concurrent_callers_of_one_key_run_it_once_and_share_its_result(store):
    idem = open_idem(store)
    runs = []
    lock = threading.Lock()

    @idem.idempotent(scope="race", key="k", wait=10.0)
    def work(k):
        with lock:
            runs.append(k)
        time.sleep(0.2)
        return f"done {k}"

    for round_ in range(3):
        results, errors = [], []

        def call(key=f"k-{round_}"):
            try:
                results.append(work.run(key))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=call) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(isinstance(r, Executed) for r in results) == 1
        assert {r.value for r in results} == {f"done k-{round_}"}
    assert sorted(runs) == [f"k-{i}" for i in range(3)]


def test_the_heartbeat_keeps_a_run_held_past_its_lease_while_the_handler_holds_the_gil(store):
    idem = open_idem(store, lease=0.6)
    other = open_idem(store, lease=0.6)
    with idem.claim("long", "k") as run:
        for _ in range(4):
            # Pure-Python work: the engine's threads need no GIL to extend.
            until = time.monotonic() + 0.4
            while time.monotonic() < until:
                pass
            with pytest.raises(InProgress):
                with other.claim("long", "k"):
                    pass
        assert not run.lease_lost
        run.check()
        run.complete("finished")
    assert idem.record("long", "k")["attempt"] == 1


def test_steps_are_journaled_and_not_run_again_by_a_later_attempt(store):
    idem = open_idem(store)
    effects = []

    @idem.idempotent(scope="ship", key="order")
    def ship(order):
        run = current_run()
        label = run.step("label", lambda dk: effects.append(("label", dk)) or f"L-{order}")
        if run.attempt == 1:
            raise TimeoutError("carrier timed out after the label")
        run.step("pickup", lambda dk: effects.append(("pickup", dk)) or "booked")
        return label

    with pytest.raises(TimeoutError):
        ship("o-9")
    assert ship("o-9") == "L-o-9"
    assert [name for name, _ in effects] == ["label", "pickup"]
    assert effects[0][1].startswith("idem-") and effects[0][1] != effects[1][1]


def test_a_step_begun_twice_in_one_run_is_refused(store):
    idem = open_idem(store)
    ran = []
    with idem.claim("twice", "k") as run:
        run.step("charge", lambda key: ran.append(key) or 1)
        with pytest.raises(InvalidStep, match="already used"):
            run.step("charge", lambda key: ran.append(key) or 2)
        run.complete("ok")
    assert len(ran) == 1


def test_asyncio_claims_steps_and_coroutines_never_block_the_loop(store):
    idem = open_idem(store, lease=0.6)
    sent = []

    @idem.idempotent(scope="welcome", key="address", wait=5.0)
    async def welcome(address):
        run = current_run()
        receipt = await run.astep("send", lambda key: asyncio.sleep(0.01, result=f"r-{address}"))
        sent.append(address)
        return {"receipt": receipt, "fence": run.fence}

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beating = asyncio.ensure_future(ticker())
        first, again = await asyncio.gather(welcome.run("ann"), welcome.run("ann"))
        outcomes = sorted([first, again], key=lambda o: isinstance(o, Replayed))
        assert isinstance(outcomes[0], Executed)
        async with idem.claim("held", "k") as run:
            await asyncio.sleep(1.5)  # past two leases: the engine extends it
            assert not run.lease_lost
            await run.acomplete([1, 2])
        async with idem.claim("held", "k") as run:
            assert run.replayed and run.result == [1, 2]
        beating.cancel()
        # The loop ran freely all along (no call blocked it).
        assert ticks > 50

    asyncio.run(main())
    assert sent in (["ann"],)


def test_bad_input_gets_a_clear_error_and_leaves_no_claim(store):
    idem = open_idem(store)
    with pytest.raises(InvalidInput, match="key"):
        with idem.claim("s", "has space"):
            pass

    @idem.idempotent(scope="s", key="k")
    def not_json(k):
        return object()

    # It ran: a result that cannot be stored must not let it run again.
    with pytest.raises(InvalidInput):
        not_json("k1")
    assert idem.record("s", "k1")["state"] == "failed"
    with pytest.raises(ReplayedFailure, match="cannot be stored"):
        not_json("k1")

    @idem.idempotent(scope="s", key="k")
    def nan(k):
        return float("nan")

    with pytest.raises(ValueError):
        nan("k3")
    assert idem.record("s", "k3")["state"] == "failed"

    with pytest.raises(IdemError, match="without run.complete"):
        with idem.claim("s", "k2"):
            pass
    assert idem.record("s", "k2")["state"] == "released"
    with pytest.raises(ValueError, match="not understood"):
        Idem("ftp://x")
    with pytest.raises(ValueError, match="lease"):
        Idem("memory:", lease=-1.0)
    with pytest.raises(ValueError, match="policy"):
        with idem.claim("s", "k4") as run:
            run.step("x", lambda key: 1, policy="sometimes")


def test_over_idem_serve_a_runs_messages_are_stored_with_it_for_the_server_to_send(serve):
    """``run.send`` against a remote ``idem serve``: the messages go with the
    completion and are stored with the result (there for ``idem serve
    --outbox`` or ``idem outbox run`` to send); a duplicate replays and
    stores nothing more; an ``outbox`` URL of its own is refused."""
    import json
    import os
    import subprocess

    from conftest import TOKEN

    idem = Idem(serve.url, token=TOKEN)
    calls = []
    for _ in range(3):
        with idem.claim("orders", "order-7") as run:
            if not run.replayed:
                calls.append(1)
                sent = run.send("order-events", {"charged": "order-7"}, headers={"source": "py"})
                run.complete({"charge": "ch_7"})
    assert len(calls) == 1
    described = subprocess.run(
        [os.environ["IDEM_BIN"], "--store", f"sqlite:{serve.folder / 'serve.db'}",
         "inspect", "shop/orders", "order-7"],
        capture_output=True, check=True, text=True,
    )
    record = json.loads(described.stdout)
    assert record["response"]["value"] == {"charge": "ch_7"}
    messages = record["response"]["messages"]
    assert [(m["id"], m["destination"], m["headers"]) for m in messages] == [
        (sent, "order-events", 1)
    ]
    with pytest.raises(InvalidInput, match="--outbox"):
        Idem(serve.url, token=TOKEN, outbox="amqp://127.0.0.1:5672")
