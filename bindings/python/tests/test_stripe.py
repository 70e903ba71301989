"""The official Stripe SDK against a real uvicorn server running a FastAPI
app behind the ASGI middleware: the SDK adds one Idempotency-Key per call
and retries its own timeouts and 409s with backoff, as it does against
the real API. The first attempt outlives the SDK's timeout; every retry
must end with the first attempt's charge, run once."""

from __future__ import annotations

import asyncio
import threading
import time
from urllib.parse import parse_qs

import stripe
import uvicorn
from fastapi import FastAPI, Request

from conftest import free_port
from idem_engine import Idem
from idem_engine.asgi import IdempotencyMiddleware


def test_the_stripe_sdk_retrying_past_its_timeout_charges_once(tmp_path):
    app = FastAPI()
    # A short lease: the 409's Retry-After (the lease left) paces the SDK.
    app.add_middleware(IdempotencyMiddleware, idem=Idem(f"sqlite:{tmp_path / 'idem.db'}", lease=2))
    executions = []
    attempts = []

    class Attempts:
        """Outside the middleware: every request the SDK sent."""

        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http":
                attempts.append(dict(scope["headers"]).get(b"idempotency-key"))
            await self.app(scope, receive, send)

    @app.post("/v1/charges")
    async def create(request: Request):
        form = {name: values[0] for name, values in parse_qs((await request.body()).decode()).items()}
        executions.append(form)
        if len(executions) == 1:
            await asyncio.sleep(1.5)  # past the SDK's 0.5 s timeout
        return {"id": f"ch_{len(executions)}", "object": "charge", "amount": int(form["amount"])}

    app.add_middleware(Attempts)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        client = stripe.StripeClient(
            "sk_test_idem",
            base_addresses={"api": f"http://127.0.0.1:{port}"},
            max_network_retries=8,
            http_client=stripe.RequestsClient(timeout=0.5),
        )
        charge = client.v1.charges.create(params={"amount": 1250, "currency": "eur"})
        second = client.v1.charges.create(params={"amount": 1250, "currency": "eur"})
    finally:
        server.should_exit = True
        thread.join()
    assert charge.id == "ch_1" and charge.amount == 1250
    assert second.id == "ch_2"  # a new call, a new key
    assert len(executions) == 2
    # The first call was sent more than once, each time with its one key.
    first_key = attempts[0]
    retried = [key for key in attempts if key == first_key]
    assert first_key and len(retried) >= 2, attempts
    assert len(set(attempts)) == 2
