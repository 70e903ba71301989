"""The exceptions the client raises: one per answer a caller may branch on."""

from __future__ import annotations

from typing import Any, Optional


class IdemError(Exception):
    """Anything the idem client raises."""


class Terminal(Exception):
    """Raise it (or a subclass) from a handler for a failure that will happen
    the same way every time: it is stored and replayed to every later call
    with the key, instead of being retried."""


class InProgress(IdemError):
    """Another holder runs the key right now. Try again after
    ``retry_after`` seconds (or claim with ``wait=``)."""

    def __init__(self, scope: str, key: str, retry_after: float) -> None:
        super().__init__(
            f"{scope}/{key} is being run by another holder; "
            f"try again in {retry_after:.3f} s"
        )
        self.retry_after = retry_after


class Mismatch(IdemError):
    """The key was first used with another fingerprint (another request)."""

    def __init__(self, scope: str, key: str) -> None:
        super().__init__(f"{scope}/{key} was first used with another fingerprint")


class ReplayedFailure(IdemError):
    """An earlier run of the key failed for good; its failure is replayed.
    ``failure_class`` is ``"terminal"`` or ``"unknown"`` (a step whose
    effect is in doubt: see ``idem resolve``)."""

    def __init__(self, scope: str, key: str, failure_class: str, message: str) -> None:
        super().__init__(f"{scope}/{key} failed before ({failure_class}): {message}")
        self.failure_class = failure_class
        self.message = message


class LeaseLost(IdemError):
    """The claim is no longer held: its lease ran out and another holder
    took the key over (or it was released). Nothing was written; stop acting
    on the claim. Downstream writes fenced with ``run.fence`` refuse it too."""


class StepInDoubt(IdemError):
    """A step an earlier attempt started and never finished, under the
    ``park`` policy: the run is failed as ``unknown`` until someone checks
    the external system and runs ``idem resolve``."""

    def __init__(self, step: str, attempt: int) -> None:
        super().__init__(
            f"step {step!r} was started by attempt {attempt} and never finished: "
            "its effect is in doubt; the record is parked for idem resolve"
        )
        self.step = step
        self.attempt = attempt


class ApiError(IdemError):
    """idem serve refused a request or could not serve it: ``status`` and
    the problem's ``type`` say why, ``detail`` says what to change."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.type: str = str(problem.get("type", ""))
        self.detail: str = str(problem.get("detail", problem))
        self.retry_after: Optional[float] = None
        super().__init__(f"idem serve answered {status}: {self.detail}")

    @property
    def kind(self) -> str:
        """The last part of the problem's type: ``bad-request``,
        ``lease-lost``, ``store-unavailable``..."""
        return self.type.rsplit("/", 1)[-1]


class Unavailable(IdemError):
    """idem serve (or its store) could not be reached after the client's
    retries. Nothing ran; the call may be tried again later."""
