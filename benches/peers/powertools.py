"""AWS Lambda Powertools' idempotency utility on Redis, one caller, as its
documentation shows it: `@idempotent_function` over a
`RedisCachePersistenceLayer`. Run by the `idem-peers` benchmark against the
Redis it started, so both sides are measured on one server in one run.

Prints one line per case: `<case> <operations per second>`.

Usage: python powertools.py PORT SECONDS REPLAY_KEYS
"""

import sys
import time
import uuid
import warnings

from aws_lambda_powertools.utilities.idempotency import (
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
    RedisCachePersistenceLayer,
)

# Outside Lambda there is no remaining time to read, and the Redis layer's
# new name is not in this release's docs yet: quiet both warnings.
warnings.simplefilter("ignore")
port, seconds, replay_keys = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
runs = 0


def charge_with(config):
    # A layer takes the configuration of its first function only: one each.
    layer = RedisCachePersistenceLayer(host="127.0.0.1", port=port, ssl=False)

    @idempotent_function(
        data_keyword_argument="order", persistence_store=layer, config=config
    )
    def charge(order):
        global runs
        runs += 1
        return {"ok": True}

    return charge


def rate(call, keys):
    """Calls `call` on `keys(i)` for `seconds`: calls per second."""
    done, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        call(order={"order_id": keys(done)})
        done += 1
    return done / (time.monotonic() - start)


def case(name, local_cache):
    config = IdempotencyConfig(
        event_key_jmespath="order_id",
        expires_after_seconds=3600,
        use_local_cache=local_cache,
        local_cache_max_items=2 * replay_keys,
    )
    charge = charge_with(config)
    run = uuid.uuid4().hex
    before = runs
    unique = rate(charge, lambda i: f"{run}-u{i}")
    assert runs - before > 0
    # Replays: the keys are completed first, then asked for again.
    for i in range(replay_keys):
        charge(order={"order_id": f"{run}-r{i}"})
    before = runs
    replays = rate(charge, lambda i: f"{run}-r{(i * 7919) % replay_keys}")
    assert runs == before, "a replay ran the function"
    print(f"unique{name} {unique:.0f}")
    print(f"replays{name} {replays:.0f}")


case("", False)
case("_local_cache", True)
