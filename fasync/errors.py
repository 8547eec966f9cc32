"""The exception a user's configuration raises when it cannot work, the faults that end a run, and the one line
that says why a run ended.

Here, below every package, so that the rollouter (inside an actor), the drivers and the stall watchdog
(fasync.launch.faults) raise and describe the same faults. Ray is imported only to describe its errors.
"""

from __future__ import annotations

import re


class ConfigurationError(Exception):
    """A config names something unusable (missing file, bad dataset line, reward that does not import).

    The message is one line, fit to print as is, and names the config key at fault.
    """


class RunFault(RuntimeError):
    """A fault that ends the run; its message is the run's stop reason."""


class Stalled(RunFault):
    pass


class ActorFailed(RunFault):
    pass


class WeightSyncMismatch(RunFault):
    pass


class TooManyBadSteps(RunFault):
    pass


class NothingToTrain(RunFault):
    """Dynamic sampling dropped every prompt group of a rollout's sampling rounds (`after`)."""

    @classmethod
    def after(cls, groups: int, rounds: int) -> "NothingToTrain":
        """The fault, said the same way in every mode. (Built here, not in `__init__`: an exception that crosses
        from an actor is rebuilt from its message.)"""
        return cls(
            f"dynamic sampling dropped all {groups} prompt groups of {rounds} sampling rounds "
            f"(rollout.max_sampling_rounds: {rounds}): the rewards within every group agreed, so there was nothing "
            "to train on; check that reward.function tells completions apart (it may give every completion the "
            "same value), or set rollout.dynamic_sampling: false")


ACTOR_DIED = "died (killed, out of memory, or crashed: the Ray logs under /tmp/ray/session_latest/logs say which)"


def first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def actor_id(handle) -> str | None:
    """The id Ray's errors name an actor by (`RayActorError.actor_id`); None for what is not an actor."""
    ident = getattr(handle, "_actor_id", None)
    return ident.hex() if ident is not None else None


def describe_failure(error: BaseException, actors: dict[str, str] | None = None) -> str:
    """One line for an error that ended the run: a `RunFault`'s own message, the actor that died (by its
    name in `actors`, actor id → name, when known), the remote error inside Ray's wrapper, or the error's
    type and first line."""
    from ray.exceptions import RayActorError

    while getattr(error, "cause", None) is not None and error.cause is not error:
        error = error.cause  # RayTaskError wraps what the actor raised
    if isinstance(error, RunFault):
        return str(error)
    if isinstance(error, RayActorError):
        name = (actors or {}).get(error.actor_id, "an actor")
        raised = _creation_error(str(error))
        return f"{name} failed to start: {raised}" if raised else f"{name} {ACTOR_DIED}"
    return f"{type(error).__name__}: {first_line(error)}"


def _creation_error(text: str) -> str | None:
    """What an actor's constructor raised, from Ray's report of an actor that died in its creation task (the
    last `SomeError: message` line of the traceback it carries); None for any other death."""
    if "creation task" not in text:
        return None
    raised = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", text, re.M)
    if not raised:
        return None
    kind, message = raised[-1]
    return message if kind == "ConfigurationError" else f"{kind}: {message}"
