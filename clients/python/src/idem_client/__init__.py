"""Exactly-once effects over at-least-once delivery, from Python: the
client of ``idem serve``.

::

    from idem_client import Idem

    idem = Idem("http://127.0.0.1:8700", token="...")

    @idem.idempotent(scope="charges", key="order_id")
    def charge(order_id, amount):
        return payments.charge(order_id, amount)

Every call with the same ``order_id`` has the effect of one call.
"""

from ._client import Executed, Idem, Outcome, Replayed, fingerprint_of
from ._errors import (
    ApiError,
    IdemError,
    InProgress,
    LeaseLost,
    Mismatch,
    ReplayedFailure,
    StepInDoubt,
    Terminal,
    Unavailable,
)
from ._run import Run, current_run

__all__ = [
    "ApiError",
    "Executed",
    "Idem",
    "IdemError",
    "InProgress",
    "LeaseLost",
    "Mismatch",
    "Outcome",
    "Replayed",
    "ReplayedFailure",
    "Run",
    "StepInDoubt",
    "Terminal",
    "Unavailable",
    "current_run",
    "fingerprint_of",
]

__version__ = "0.1.0"
