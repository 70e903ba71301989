"""The WSGI middleware under Flask, through Flask's own test client, on
SQLite and Redis: one execution per key, replays, refusals, handlers that
fail or raise, and duplicates from real threads."""

from __future__ import annotations

import threading

import pytest
from flask import Flask, jsonify, request

from idem_engine import Idem, current_run
from idem_engine.wsgi import IdempotencyMiddleware


def make_app(idem: Idem, **options):
    app = Flask(__name__)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, idem=idem, **options)
    runs = []
    gate = threading.Event()
    gate.set()
    app.config.update(runs=runs, gate=gate)

    @app.post("/charges")
    def charge():
        body = request.get_json()
        run = current_run()
        assert request.environ["idem.run"] is run
        runs.append(body)
        gate.wait(10)
        if body.get("fail"):
            return jsonify(error="upstream down"), 503
        if body.get("raise"):
            raise RuntimeError("the handler broke")
        return jsonify(charge=f"ch_{len(runs)}", fence=run.fence), 201, {"x-charge": "yes"}

    return app


def post(client, key, body):
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/charges", json=body, headers=headers)


def test_a_keyed_request_runs_once_and_its_retries_replay_it(local_store):
    app = make_app(Idem(local_store.url, **local_store.options))
    client = app.test_client()
    first = post(client, "order-1", {"amount": 100})
    again = post(client, "order-1", {"amount": 100})
    assert first.status_code == 201 and again.status_code == 201
    assert first.get_json()["charge"] == "ch_1" and isinstance(first.get_json()["fence"], int)
    assert again.data == first.data
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["x-charge"] == "yes"
    assert app.config["runs"] == [{"amount": 100}]


def test_refusals_are_problem_json_and_run_nothing(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"), required=True)
    client = app.test_client()
    post(client, "k", {"amount": 1})
    mismatch = post(client, "k", {"amount": 2})
    missing = post(client, None, {"amount": 1})
    malformed = post(client, "k" * 256, {"amount": 1})
    for answer, status in [(mismatch, 422), (missing, 400), (malformed, 400)]:
        assert answer.status_code == status
        assert answer.headers["content-type"] == "application/problem+json"
    assert "at most 255" in malformed.get_json()["detail"]
    assert len(app.config["runs"]) == 1


def test_a_5xx_or_a_raising_handler_releases_the_key(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    client = app.test_client()
    assert post(client, "a", {"fail": True}).status_code == 503
    assert post(client, "a", {"fail": True}).status_code == 503
    # Flask answers an exception with its own 500 page inside the app.
    assert post(client, "b", {"raise": True}).status_code == 500
    assert post(client, "b", {"raise": True}).status_code == 500
    assert len(app.config["runs"]) == 4


def test_an_exception_that_escapes_the_app_answers_500_and_is_raised_on(tmp_path):
    app = make_app(Idem(f"sqlite:{tmp_path / 'idem.db'}"))
    app.config["PROPAGATE_EXCEPTIONS"] = True
    client = app.test_client()
    with pytest.raises(RuntimeError, match="the handler broke"):
        post(client, "b", {"raise": True})
    app.config["PROPAGATE_EXCEPTIONS"] = False
    assert post(client, "b", {"raise": True}).status_code == 500
    assert len(app.config["runs"]) == 2


def test_duplicates_from_threads_run_once(local_store):
    app = make_app(Idem(local_store.url, **local_store.options))
    gate = app.config["gate"]
    gate.clear()
    answers = {}

    def send(i):
        answers[i] = post(app.test_client(), "dup", {"amount": 5})

    first = threading.Thread(target=send, args=(0,))
    first.start()
    while not app.config["runs"]:
        threading.Event().wait(0.01)
    others = [threading.Thread(target=send, args=(i,)) for i in range(1, 5)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    gate.set()
    first.join()
    assert answers[0].status_code == 201
    assert sorted(answers[i].status_code for i in range(1, 5)) == [409] * 4
    assert post(app.test_client(), "dup", {"amount": 5}).data == answers[0].data
    assert len(app.config["runs"]) == 1
