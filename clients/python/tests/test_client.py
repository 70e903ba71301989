"""The client against a real idem serve: runs once, replays, fingerprints,
failures by class, real concurrency, heartbeats, fencing after a stall,
steps resumed across attempts, tenants, and bad input."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import BILLING, SHOP
from idem_client import (
    ApiError,
    Executed,
    Idem,
    IdemError,
    InProgress,
    LeaseLost,
    Mismatch,
    Replayed,
    ReplayedFailure,
    Terminal,
    current_run,
    fingerprint_of,
)


def test_a_decorated_function_runs_once_per_key_and_replays_its_result(server):
    idem = Idem(server.url, SHOP)
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


def test_a_key_used_with_another_payload_is_a_mismatch(server):
    idem = Idem(server.url, SHOP)

    @idem.idempotent(scope="orders", key=lambda order: order["id"], fingerprint=lambda order: order)
    def place(order):
        return order["qty"]

    assert place({"id": "a", "qty": 1}) == 1
    # The same payload with its keys in another order is the same request.
    assert place({"qty": 1, "id": "a"}) == 1
    with pytest.raises(Mismatch):
        place({"id": "a", "qty": 2})
    assert fingerprint_of({"b": 1, "a": [1, "é"]}) == fingerprint_of({"a": [1, "é"], "b": 1})


def test_terminal_failures_are_replayed_and_others_run_again(server):
    idem = Idem(server.url, SHOP)
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


def test_concurrent_callers_of_one_key_run_it_once_and_share_its_result(server):
    idem = Idem(server.url, SHOP)
    runs = []
    lock = threading.Lock()

    @idem.idempotent(scope="race", key="k", wait=10.0)
    def work(k):
        with lock:
            runs.append(k)
        time.sleep(0.2)
        return f"done {k}"

    for round_ in range(5):
        results, errors = [], []

        def call(key=f"k-{round_}"):
            try:
                results.append(work.run(key))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=call) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(isinstance(r, Executed) for r in results) == 1
        assert {r.value for r in results} == {f"done k-{round_}"}
    assert sorted(runs) == [f"k-{i}" for i in range(5)]


def test_the_heartbeat_keeps_a_long_run_held_past_its_lease(server):
    idem = Idem(server.url, SHOP, lease=0.6)
    other = Idem(server.url, SHOP, lease=0.6)
    with idem.claim("long", "k") as run:
        for _ in range(8):
            time.sleep(0.3)
            with pytest.raises(InProgress):
                with other.claim("long", "k"):
                    pass
        assert not run.lease_lost.is_set()
        run.complete("finished")
    assert idem.record("long", "k")["attempt"] == 1


def test_a_stalled_holder_is_fenced_out_by_the_takeover(server):
    idem = Idem(server.url, SHOP, lease=0.3)
    with pytest.raises(LeaseLost):
        with idem.claim("stall", "k") as stalled:
            stalled._stop.set()  # the process stalls: no more heartbeats
            time.sleep(0.6)
            with idem.claim("stall", "k") as taker:
                assert taker.takeover and taker.attempt == 2
                assert taker.fence > stalled.fence
                taker.complete({"by": "taker"})
            stalled.complete({"by": "stalled"})
    record = idem.record("stall", "k")
    assert record["response"] == {"by": "taker"}


def test_a_holder_cut_off_from_idem_serve_sees_its_lease_run_out(server):
    """No extension can be confirmed once idem serve is gone, so another
    worker may take the key over when the lease runs out: the holder must
    be told, not left to act on a lease nobody extended."""
    idem = Idem(server.url, SHOP, lease=0.6)
    with pytest.raises(LeaseLost):
        with idem.claim("cut-off", "k") as run:
            run.check()
            server.process.kill()
            server.process.wait()
            time.sleep(0.8)
            run.check()
    assert run.lease_lost.is_set()


def test_steps_are_journaled_and_not_run_again_by_a_later_attempt(server):
    idem = Idem(server.url, SHOP)
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


def test_no_tenant_sees_another_tenants_records(server):
    shop, billing = Idem(server.url, SHOP), Idem(server.url, BILLING)
    with shop.claim("orders", "o-1") as run:
        run.complete("shop's")
    assert billing.record("orders", "o-1") is None
    with billing.claim("orders", "o-1") as run:
        assert not run.replayed
        run.complete("billing's")
    with shop.claim("orders", "o-1") as run:
        assert run.replayed and run.result == "shop's"
    with pytest.raises(ApiError) as refused:
        with Idem(server.url, "x" * 20).claim("orders", "o-1"):
            pass
    assert refused.value.status == 401


def test_bad_input_gets_a_clear_error_and_leaves_no_claim(server):
    idem = Idem(server.url, SHOP)
    with pytest.raises(ApiError) as bad:
        with idem.claim("s", "has space"):
            pass
    assert bad.value.status == 400 and bad.value.kind == "bad-request"
    assert "key" in bad.value.detail

    @idem.idempotent(scope="s", key="k")
    def not_json(k):
        return object()

    # It ran: a result that cannot be stored must not let it run again.
    with pytest.raises(TypeError):
        not_json("k1")
    assert idem.record("s", "k1")["state"] == "failed"
    with pytest.raises(ReplayedFailure, match="cannot be stored"):
        not_json("k1")

    @idem.idempotent(scope="s", key="k")
    def nan(k):
        return float("nan")

    with pytest.raises(TypeError):
        nan("k3")
    assert idem.record("s", "k3")["state"] == "failed"

    with pytest.raises(IdemError, match="without run.complete"):
        with idem.claim("s", "k2"):
            pass
    assert idem.record("s", "k2")["state"] == "released"
    with pytest.raises(ValueError):
        Idem("ftp://x")


def test_ended_runs_do_not_pile_up_in_the_heartbeats(server):
    idem = Idem(server.url, SHOP)
    for i in range(300):
        with idem.claim("pile", f"k{i}") as run:
            run.complete(i)
    # One heartbeat thread serves every run; entries of ended runs are
    # dropped once they outnumber the live ones.
    assert len(idem._heartbeats._due) <= 64
