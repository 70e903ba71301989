"""The exceptions idem raises: one per answer a caller may branch on.

The engine raises them (``_native``); each carries the whole cause in its
text, and the fields a caller needs as attributes."""

from __future__ import annotations


class IdemError(Exception):
    """Anything idem raises."""


class Terminal(Exception):
    """Raise it (or a subclass) from a handler for a failure that will happen
    the same way every time: it is stored and replayed to every later call
    with the key, instead of being retried."""


class InvalidInput(IdemError, ValueError):
    """A value idem was given breaks a rule: a store URL it does not read,
    a key or scope outside the key rules, a setting out of range, a
    fingerprint that is not JSON. The text says which rule."""


class Unavailable(IdemError):
    """The store could not be opened, or did not answer for a whole lease
    (retried meanwhile). A claim that raises this ran nothing."""


class InProgress(IdemError):
    """Another holder runs the key right now. Try again after
    ``retry_after`` seconds (or claim with ``wait=``)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Mismatch(IdemError):
    """The key was first used with another fingerprint (another request)."""


class KeyExpired(IdemError):
    """The key ran before and its record has expired; the store remembers
    the key (``remember=`` in its URL), so this late call is refused rather
    than run again. ``age`` is how many seconds ago it ran, at least."""

    def __init__(self, message: str, age: float) -> None:
        super().__init__(message)
        self.age = age


class ReplayedFailure(IdemError):
    """An earlier run of the key failed for good; its failure is replayed.
    ``failure_class`` is ``"terminal"`` or ``"unknown"`` (a step whose
    effect is in doubt: see ``idem resolve``); ``message`` is what failed."""

    def __init__(self, text: str, failure_class: str, message: str) -> None:
        super().__init__(text)
        self.failure_class = failure_class
        self.message = message


class LeaseLost(IdemError):
    """The claim is no longer held: its lease ran out and another holder
    may have taken the key over. Nothing was written; stop acting on the
    claim. Downstream writes fenced with ``run.fence`` refuse it too."""


class ResultTooLarge(IdemError, ValueError):
    """The result is over the store's limit (``max_result_bytes``). The
    work ran, so the key is recorded as failed for good, saying why."""


class StepInDoubt(IdemError):
    """A step an earlier attempt began and never finished, under the
    ``park`` policy: the run is failed as ``unknown`` until someone checks
    the external system and runs ``idem resolve``."""

    def __init__(self, message: str, step: str, attempt: int) -> None:
        super().__init__(message)
        self.step = step
        self.attempt = attempt


class InvalidStep(IdemError, ValueError):
    """A step was misused: its name is invalid or already used in this
    run, or its result could not be journaled."""
