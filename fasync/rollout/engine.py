"""The rollout engine interface: batched generation with behaviour logprobs, versioned weights,
and pause/abort/resume for the fully-async driver.

The control calls arrive from other threads than `generate` (a Ray actor with a
control concurrency group), so the state they touch is an Event, a counter and a
lock, and backends check `interrupted()` between decode steps.

An engine that `streams` (vLLM) also takes requests while it generates: `submit` adds them to what is in
flight and `take_ended` returns them as they end, which the fully_async rollouter uses for continuous batching.
Every engine serves `generate`, one closed batch per call, which sync and async use.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace

from fasync.killpoints import kill_point
from fasync.rollout.types import FinishReason, Generation, SamplingParams
from fasync.weights.checksum import probed_names, weights_checksum


@dataclass
class Continuation:
    """What a backend generated for one request in one call."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class RolloutEngine(ABC):
    streams = False
    """Whether `submit` and `take_ended` work: requests join and leave while the engine generates."""

    def __init__(self) -> None:
        self._version = 0
        self._running = threading.Event()
        self._running.set()
        self._abort_count = 0
        self._abort_lock = threading.Lock()
        # One generate or weight load at a time: both use the model.
        self._busy = threading.Lock()
        self._probed: list[str] = []
        """The parameters `served_weights` checks: `probed_names` of the last load."""

    @property
    def weight_version(self) -> int:
        return self._version

    # -- what a backend implements ---------------------------------------------------------------

    @abstractmethod
    def _continue(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams, interrupted: Callable[[], bool]
    ) -> list[Continuation]:
        """Extend each context (prompt + output so far) by at most its budget (≥ 1) of new tokens.

        Stop once `interrupted()` turns true, marking the unfinished ones `abort`; a backend that
        reaches its own length limit before the budget finishes with `length`."""

    @abstractmethod
    def _load_state_dict(self, state_dict: dict) -> None: ...

    def _served_parameters(self, names: list[str]) -> dict | None:
        """name → tensor of the weights this engine samples with now, for the trainer's parameter `names`
        (read back from the model that serves, not from what was handed to `load_weights`); None when the
        backend cannot read its weights back in the trainer's layout, and only the served version is checked."""
        return None

    def rng_state(self) -> bytes | None:
        """The sampling stream's state as bytes, for a checkpoint (driver.pt holds no tensors); None when the
        backend cannot save it (a resume then continues with a fresh stream from the engine's seed)."""
        return None

    def set_rng_state(self, state) -> None:  # noqa: B027 - a backend without a savable stream keeps this
        """Restore what `rng_state` returned."""

    # -- the interface ---------------------------------------------------------------------------

    def generate(
        self, requests: list[Generation], params: SamplingParams, token_budget: int | None = None
    ) -> list[Generation]:
        """Continue every unfinished request from its output so far, in order.

        Tokens already generated count against `max_new_tokens`. Each new token carries its
        behaviour logprob and the weight version that produced it. With a `token_budget` a request
        gets at most that many new tokens in this call, and comes back unfinished (`finish_reason`
        None) if it has more to go. Blocks while paused."""
        self._running.wait()
        aborts_seen = self._abort_count

        def interrupted() -> bool:
            return self._abort_count != aborts_seen or not self._running.is_set()

        with self._busy:
            version = self._version
            results = list(requests)
            todo = []
            for i, req in enumerate(requests):
                if req.finished:
                    continue
                if len(req.output_ids) >= params.max_new_tokens:
                    results[i] = replace(req, finish_reason="length")
                else:
                    todo.append(i)
            if todo:
                left = [params.max_new_tokens - len(requests[i].output_ids) for i in todo]
                budgets = left if token_budget is None else [min(n, token_budget) for n in left]
                continuations = self._continue(
                    [requests[i].prompt_ids + requests[i].output_ids for i in todo], budgets, params, interrupted
                )
                kill_point("engine_generate")
                for i, new, budget, remaining in zip(todo, continuations, budgets, left):
                    req = requests[i]
                    reason = new.finish_reason
                    if reason == "length" and budget < remaining and len(new.token_ids) == budget:
                        reason = None  # the call's budget ran out, not the completion's
                    results[i] = replace(
                        req,
                        output_ids=req.output_ids + new.token_ids,
                        logprobs=req.logprobs + new.logprobs,
                        token_versions=req.token_versions + [version] * len(new.token_ids),
                        finish_reason=reason,
                    )
            return results

    def submit(self, requests: list[Generation], params: SamplingParams) -> None:
        """Continue every request from its output so far, alongside the requests in flight; returns at once.
        Tokens already generated count against `max_new_tokens`; each new token carries its behaviour logprob
        and the weight version that produced it. `abort` ends the requests submitted so far; `pause` holds them
        in the engine until `resume`, and a weight load meanwhile applies to their next tokens."""
        raise NotImplementedError(f"{type(self).__name__} generates closed batches only (`generate`)")

    def take_ended(self) -> list[Generation]:
        """The submitted requests that ended since the last call, finished or aborted (with the tokens they
        generated); waits until one has, or until none is in flight."""
        raise NotImplementedError(f"{type(self).__name__} generates closed batches only (`generate`)")

    def load_weights(self, state_dict: dict, version: int) -> int:
        """Load the trainer's weights as `version`; waits for a generate call in progress. Returns the
        version the engine now serves."""
        with self._busy:
            self._load_state_dict(state_dict)
            kill_point("engine_load")
            self._version = version
            self._probed = probed_names(state_dict)

    def served_weights(self) -> tuple[int, str]:
        """(the weight version this engine serves, `weights_checksum` of the `probed_names` of the last load
        as the engine's model now holds them). The driver compares it with the trainer's checksum of the
        weights it sent: an engine that kept its old weights, or loaded them wrongly, serves a different one."""
        with self._busy:
            served = self._served_parameters(self._probed) if self._probed else None
            return self._version, weights_checksum(served) if served is not None else None

    def sleep(self) -> None:  # noqa: B027 - an engine with no memory to hand back keeps this
        """Hand the engine's GPU memory to training (colocated sync runs, between generation and the next
        weight push); the vLLM engine overrides it."""

    def wake_up(self, tags: list[str] | None = None) -> None:  # noqa: B027 - see `sleep`
        """Take back what `sleep` released: `["weights"]` before a weight push, `["kv_cache"]` before
        generating, None for both."""

    def abort(self) -> None:
        """Make the generate calls made so far return promptly (unfinished requests `abort`), and end the
        requests submitted so far; later calls and submissions run normally."""
        with self._abort_lock:
            self._abort_count += 1

    def pause(self) -> None:
        """Interrupt generation in progress and hold new calls until `resume`; returns once the
        engine is idle. (A `generate` call in progress returns its requests unfinished; submitted requests
        stay in the engine.)"""
        self._running.clear()
        with self._busy:
            pass

    def resume(self) -> None:
        self._running.set()
