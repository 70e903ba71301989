"""The ASGI middleware under FastAPI, through Starlette's own test client
and httpx's ASGI transport, on SQLite and Redis: one execution per key,
byte-exact replays, the tower layer's refusals as problem+json, real
concurrent duplicates, handlers that fail or raise, and the run's fence
in the handler."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.testclient import TestClient

from conftest import TOKEN

from idem_engine import Idem, InvalidInput, current_run
from idem_engine.asgi import IdempotencyMiddleware


def make_app(idem: Idem, **options):
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, idem=idem, **options)
    app.state.runs = []
    app.state.gate = None

    @app.post("/charges")
    async def charge(request: Request):
        body = await request.json()
        run = current_run()
        assert request.state.idem is run
        app.state.runs.append(body)
        if app.state.gate is not None:
            await app.state.gate.wait()
        if body.get("fail"):
            return JSONResponse({"error": "upstream down"}, status_code=503)
        if body.get("raise"):
            raise RuntimeError("the handler broke")
        return JSONResponse(
            {"charge": f"ch_{len(app.state.runs)}", "fence": run.fence},
            status_code=201,
            headers={"x-charge": "yes"},
        )

    @app.get("/charges")
    async def listing():
        app.state.runs.append("list")
        return {"charges": len(app.state.runs)}

    return app


def post(client, key, body, **headers):
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/charges", content=json.dumps(body), headers={"content-type": "application/json", **headers})


def test_a_keyed_request_runs_once_and_its_retries_replay_it(local_store):
    app = make_app(Idem(local_store.url, **local_store.options))
    with TestClient(app) as client:
        first = post(client, "order-1", {"amount": 100})
        again = post(client, "order-1", {"amount": 100})
    assert first.status_code == 201 and again.status_code == 201
    assert first.json()["charge"] == "ch_1" and isinstance(first.json()["fence"], int)
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-charge"] == "yes"
    assert "idempotent-replayed" not in first.headers
    assert int(first.headers["idempotency-key-lifetime"]) > 0
    assert app.state.runs == [{"amount": 100}]


def test_json_key_order_does_not_matter_but_another_body_is_refused(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    with TestClient(app) as client:
        post(client, "k", {"amount": 100, "currency": "eur"})
        same = client.post(
            "/charges",
            content=b'{ "currency": "eur",  "amount": 100 }',
            headers={"Idempotency-Key": "k", "content-type": "application/json"},
        )
        other = post(client, "k", {"amount": 999, "currency": "eur"})
    assert same.status_code == 201 and same.headers["idempotent-replayed"] == "true"
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert len(app.state.runs) == 1


@pytest.mark.parametrize(
    "key, rule",
    [("", "empty"), ("k" * 256, "at most 255"), ('"unclosed', "no closing quote")],
)
def test_a_malformed_key_is_refused_with_the_rule_it_broke(tmp_path, key, rule):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    with TestClient(app) as client:
        answer = post(client, key, {"amount": 1})
    assert answer.status_code == 400
    assert rule in answer.json()["detail"]
    assert app.state.runs == []


def test_uncovered_and_unkeyed_requests_pass_through_and_required_keys_are_enforced(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    with TestClient(app) as client:
        assert client.get("/charges").status_code == 200
        assert post(client, None, {"amount": 1}).status_code == 201
        assert post(client, None, {"amount": 1}).status_code == 201
    assert len(app.state.runs) == 3
    strict = make_app(Idem(f"sqlite:{tmp_path / 'strict.db'}"), required=True)
    with TestClient(strict) as client:
        refused = post(client, None, {"amount": 1})
    assert refused.status_code == 400 and strict.state.runs == []


def test_a_5xx_or_a_raising_handler_releases_the_key_so_a_retry_runs_again(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert post(client, "a", {"fail": True}).status_code == 503
        assert post(client, "a", {"fail": True}).status_code == 503
        assert post(client, "b", {"raise": True}).status_code == 500
        assert post(client, "b", {"raise": True}).status_code == 500
    assert len(app.state.runs) == 4


def test_the_exception_of_a_raising_handler_reaches_the_server(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    with TestClient(app) as client, pytest.raises(RuntimeError, match="the handler broke"):
        post(client, "b", {"raise": True})


def test_an_oversize_body_is_refused_before_anything_runs(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"), max_request_bytes=64)
    with TestClient(app) as client:
        answer = post(client, "big", {"pad": "x" * 100})
    assert answer.status_code == 413 and app.state.runs == []


def test_bad_options_are_refused_when_the_middleware_is_built(tmp_path):
    idem = Idem(f"sqlite:{tmp_path / 'idem.db'}")
    for options, complaint in [
        ({"fingerprint": "body"}, "fingerprint"),
        ({"max_wait": -1}, "max_wait"),
        ({"header": "bad header"}, "header name"),
        ({"key_in_body": "order"}, "key_in_body"),
        ({"webhook": "github"}, "signing secret"),
        ({"webhook": "svix", "webhook_secret": "s"}, "webhook sender"),
        ({"key_in_body": "/id", "mcp": "idempotency_key"}, "give one of them"),
        ({"mcp": "idempotency_key", "fingerprint": "off"}, "leave fingerprint unset"),
    ]:
        with pytest.raises(Exception, match=complaint):
            IdempotencyMiddleware(FastAPI(), idem, **options)


def test_a_key_in_the_body_is_read_as_the_tower_layer_reads_it(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"), required=True, key_in_body="/order")
    with TestClient(app) as client:
        first = post(client, None, {"order": "o-1", "amount": 1})
        again = post(client, None, {"amount": 1, "order": "o-1"})
        keyless = post(client, None, {"amount": 1})
    assert first.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert keyless.status_code == 400
    assert 'JSON pointer "/order"' in keyless.json()["detail"]
    assert app.state.runs == [{"order": "o-1", "amount": 1}]


def test_a_webhook_whose_signature_fails_is_refused_before_its_key_is_used(tmp_path):
    secret = "It's a Secret to Everybody"
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"), webhook="github", webhook_secret=secret)
    body = b'{"amount": 7}'
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()

    def deliver(client, signature):
        return client.post(
            "/charges",
            content=body,
            headers={
                "content-type": "application/json",
                "X-GitHub-Delivery": "delivery-1",
                "X-Hub-Signature-256": f"sha256={signature}",
            },
        )

    with TestClient(app) as client:
        forged = deliver(client, "00" * 32)
        signed = deliver(client, signature)
        redelivered = deliver(client, signature)
    assert forged.status_code == 400
    assert forged.json()["type"].endswith("/bad-signature")
    assert signed.status_code == 201 and "idempotent-replayed" not in signed.headers
    assert redelivered.headers["idempotent-replayed"] == "true"
    assert app.state.runs == [{"amount": 7}]


def test_over_a_remote_idem_serve_the_middleware_is_refused_before_anything_runs(serve):
    idem = Idem(serve.url, token=TOKEN)
    with pytest.raises(InvalidInput, match="remote idem serve"):
        IdempotencyMiddleware(FastAPI(), idem)


def test_concurrent_duplicates_run_once_the_others_get_409_or_the_replay(local_store):
    app = make_app(Idem(local_store.url, **local_store.options))

    async def scenario():
        app.state.gate = asyncio.Event()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            send = lambda: client.post(  # noqa: E731
                "/charges", json={"amount": 5}, headers={"Idempotency-Key": "dup"}
            )
            first = asyncio.ensure_future(send())
            while not app.state.runs:
                await asyncio.sleep(0.01)
            busy = await asyncio.gather(*(send() for _ in range(4)))
            app.state.gate.set()
            done = await first
            later = await send()
        return done, busy, later

    done, busy, later = asyncio.run(scenario())
    assert done.status_code == 201
    assert [b.status_code for b in busy] == [409] * 4
    assert all(int(b.headers["retry-after"]) >= 1 for b in busy)
    assert later.status_code == 201 and later.content == done.content
    assert len(app.state.runs) == 1


def test_a_duplicate_that_prefers_to_wait_gets_the_first_answer(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))

    async def scenario():
        app.state.gate = asyncio.Event()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            headers = {"Idempotency-Key": "w"}
            first = asyncio.ensure_future(client.post("/charges", json={"a": 1}, headers=headers))
            while not app.state.runs:
                await asyncio.sleep(0.01)
            waiting = asyncio.ensure_future(
                client.post("/charges", json={"a": 1}, headers={**headers, "Prefer": "wait=5"})
            )
            await asyncio.sleep(0.2)
            app.state.gate.set()
            return await first, await waiting

    first, waited = asyncio.run(scenario())
    assert waited.status_code == 201 and waited.content == first.content
    assert waited.headers["preference-applied"] == "wait=5"
    assert len(app.state.runs) == 1


def test_tenants_do_not_share_keys(tmp_path):
    app = make_app(
        Idem(f"sqlite:{tmp_path / 'idem.db'}"),
        tenant=lambda scope: dict(scope["headers"]).get(b"x-account", b"").decode() or None,
    )
    with TestClient(app) as client:
        a = post(client, "same", {"amount": 1}, **{"x-account": "alice"})
        b = post(client, "same", {"amount": 1}, **{"x-account": "bob"})
        a2 = post(client, "same", {"amount": 1}, **{"x-account": "alice"})
    assert a.json()["charge"] == "ch_1" and b.json()["charge"] == "ch_2"
    assert a2.headers["idempotent-replayed"] == "true" and a2.content == a.content


def test_status_only_replays_the_status_and_a_sealed_store_file_shows_no_secret(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("2026-11:" + "ab" * 32 + "\n")
    secret = tmp_path / "key-secret"
    secret.write_text("cd" * 32 + "\n")
    idem = Idem(f"sqlite:{tmp_path / 'idem.db'}", keyring=str(keys), key_secret=str(secret))
    app = make_app(idem, keep="/charges=status-only:x-charge")
    with TestClient(app) as client:
        first = post(client, "mint-1", {"amount": 100})
        again = post(client, "mint-1", {"amount": 100})
    assert first.status_code == 201 and first.json()["charge"] == "ch_1"
    assert again.status_code == 201 and again.content == b""
    assert again.headers["idempotent-replay-kept"] == "status-only"
    assert again.headers["x-charge"] == "yes"
    assert app.state.runs == [{"amount": 100}]
    dump = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("idem.db"))
    assert b"ch_1" not in dump and b"mint-1" not in dump


def test_a_bad_keep_policy_or_keyring_is_refused_when_built(tmp_path):
    with pytest.raises(Exception, match="keep"):
        IdempotencyMiddleware(FastAPI(), Idem(f"sqlite:{tmp_path / 'a.db'}"), keep="forget-it")
    (tmp_path / "bad").write_text("k:not-hex\n")
    with pytest.raises(Exception, match="keyring"):
        Idem(f"sqlite:{tmp_path / 'b.db'}", keyring=str(tmp_path / "bad"))


def test_reference_keeps_the_body_in_a_blob_beside_the_store_and_replays_it(tmp_path):
    idem = Idem(f"sqlite:{tmp_path / 'idem.db'}")
    app = make_app(idem, keep="/charges=reference:10")
    with TestClient(app) as client:
        first = post(client, "big-1", {"amount": 100})
        again = post(client, "big-1", {"amount": 100})
    assert first.status_code == 201 and again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert app.state.runs == [{"amount": 100}]
    blobs = [p for d in (tmp_path / "idem.db.blobs").iterdir() for p in d.iterdir()]
    assert len(blobs) == 1 and blobs[0].read_bytes().endswith(first.content)


def test_reference_with_a_keyring_is_refused_blobs_are_not_sealed(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("2026-11:" + "ab" * 32 + "\n")
    idem = Idem(f"sqlite:{tmp_path / 'idem.db'}", keyring=str(keys))
    with pytest.raises(Exception, match="not sealed"):
        IdempotencyMiddleware(FastAPI(), idem, keep="reference")
