"""Exactly-once effects over at-least-once delivery, from Python: idem's
own executor (Rust) in this process, over SQLite (the default, no
server), Redis, PostgreSQL, DynamoDB or a remote ``idem serve``.

::

    from idem_engine import Idem

    idem = Idem("sqlite:idem.db")

    @idem.idempotent(scope="charges", key="order_id")
    def charge(order_id, amount):
        return payments.charge(order_id, amount)

Every call with the same ``order_id`` has the effect of one call.
``idem_engine.asgi`` and ``idem_engine.wsgi`` hold the ``Idempotency-Key``
middleware for web frameworks.
"""

from ._errors import (
    IdemError,
    InProgress,
    InvalidInput,
    InvalidStep,
    KeyExpired,
    LeaseLost,
    Mismatch,
    ReplayedFailure,
    ResultTooLarge,
    StepInDoubt,
    Terminal,
    Unavailable,
)
from ._idem import DEFAULT_STORE, Claim, Executed, Idem, Outcome, Replayed, fingerprint_of
from ._run import Run, RunContext, current_run

__all__ = [
    "DEFAULT_STORE",
    "Claim",
    "Executed",
    "Idem",
    "IdemError",
    "InProgress",
    "InvalidInput",
    "InvalidStep",
    "KeyExpired",
    "LeaseLost",
    "Mismatch",
    "Outcome",
    "Replayed",
    "ReplayedFailure",
    "ResultTooLarge",
    "Run",
    "RunContext",
    "StepInDoubt",
    "Terminal",
    "Unavailable",
    "current_run",
    "fingerprint_of",
]

__version__ = "0.1.0"
