"""Continuous batching for fully_async: requests stream into a vLLM engine that one thread keeps stepping.

The rollouter (`fasync.rollout.rollouter`, fully_async with `rollout.engine: vllm`) submits a group's requests
as soon as admission lets the group in, and collects requests as they end; a group leaves for the queue
when its last request has finished, whatever the others in the engine still generate. This module is the
engine's side of that: `RequestStream` holds the requests submitted and not yet collected, and a thread of
its own steps the engine whenever any of them can make progress.

The mechanism is the one the call-based path already uses, vLLM's offline `LLMEngine` (`LLM.llm_engine`),
stepped by hand, with `add_request` and `abort_request` between steps; not vLLM's `AsyncLLM`. In vLLM 0.32
`AsyncLLM` always runs its engine core in a process of its own (`EngineCoreClient.make_async_mp_client`
has no in-process client), and across that process boundary `collective_rpc` arguments travel as msgpack:
the weight push would need a transport of its own, the engine process imports vLLM once more (seconds on
CPU), and the actor's death would no longer be the engine's. It would also be a second engine object beside
the `LLM` that sync and async generate with. A thread that steps the same `LLM` keeps one engine, one weight
load and one failure path for every mode; what `AsyncLLM` adds over it (an asyncio front end and its own
pause modes) the rollouter does itself:

- `pause` (the engine's `_running` cleared) stops the stepping and keeps every request in the engine
  (vLLM's "keep"), and the tokens after `resume` carry the version loaded meanwhile. The load either
  recomputes their keys and values (`VLLMEngine` preempts the running requests) or, under
  `async.pause_mode: keep`, keeps them: then only a request whose prompt is not yet fully prefilled starts
  again (`restart_unsampled`), since its first token would attend to old keys and values without carrying an
  old version. A request's prompt is salted with the version it is added under (`versioned_prompt`), so
  that the prefix cache never hands blocks computed by one version's weights to a request of another.
- `abort` ends every request submitted so far, each with the tokens it generated (vLLM's "abort"); the
  rollouter resubmits them from that prefix (partial rollout, and a checkpoint's snapshot).
- Without partial rollout the rollouter submits nothing new during a weight sync and loads once every
  request has finished under the old weights (vLLM's "wait").

Every step runs under the engine's `_busy` lock, as the call-based path's steps and every weight load do, so
the weights never change within a step, and each token carries the version the engine served at that step.
Outputs arrive as deltas (`RequestOutputKind.DELTA`): a step costs the new tokens, not the whole completion
so far.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fasync.rollout.types import FinishReason, Generation, SamplingParams


def vllm_sampling(params: SamplingParams, max_tokens: int, delta: bool = False):
    """vLLM's sampling parameters for fasync's `params`, at most `max_tokens` new tokens: fasync's stop ids and
    nothing else (`ignore_eos`, as the torch engine), and the sampled token's logprob with each token."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        max_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k is not None else -1,  # vLLM's "no cut"
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=True,  # fasync's stop ids only, as in the torch engine
        logprobs=0,  # the sampled token's logprob only
        detokenize=False,
        output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.CUMULATIVE,
    )


def versioned_prompt(token_ids: list[int], version: int):
    """vLLM's prompt for `token_ids`, added while the engine serves weight `version`: salted with it
    (`cache_salt`), so that vLLM's prefix cache shares blocks only between requests of the same weights. A load
    that keeps the KV cache (`async.pause_mode: keep`) cannot empty that cache while requests hold blocks."""
    from vllm import TokensPrompt

    return TokensPrompt(prompt_token_ids=token_ids, cache_salt=f"version-{version}")


def sampled_logprobs(completion) -> list[float]:
    """The behaviour logprob of each token of a vLLM `CompletionOutput`."""
    return [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)]


def ended_reason(output) -> FinishReason:
    """fasync's finish reason for a vLLM `RequestOutput`: `stop` or `length` when it finished, else `abort`."""
    reason = output.outputs[0].finish_reason
    return reason if output.finished and reason in ("stop", "length") else "abort"


@dataclass
class _Held:
    """A request submitted to the stream and not yet collected."""

    request: Generation
    """As submitted: prompt, output so far (a resumed partial rollout), their logprobs and versions."""
    max_tokens: int
    params: SamplingParams
    added: bool = False
    """Handed to vLLM (the thread adds submitted requests before its next step)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def ended(self, reason: FinishReason) -> Generation:
        req = self.request
        return replace(req, output_ids=req.output_ids + self.tokens, logprobs=req.logprobs + self.logprobs,
                       token_versions=req.token_versions + self.versions, finish_reason=reason)


class RequestStream:
    """The requests in a vLLM engine and the thread that steps it (see the module docstring).

    `busy` and `running` are the engine's (`RolloutEngine._busy`, `_running`): a step holds `busy` and runs only
    while `running` is set. `version` reads the weight version the engine serves; `max_model_len` bounds a
    request's context."""

    def __init__(self, llm_engine, busy: threading.Lock, running: threading.Event, version: Callable[[], int],
                 max_model_len: int):
        self._engine = llm_engine
        self._busy = busy
        self._running = running
        self._version = version
        self._max_model_len = max_model_len
        self._changed = threading.Condition()
        """Guards what follows; notified when a request is submitted, aborted or ends, and on `wake`."""
        self._held: dict[str, _Held] = {}
        self._aborting: set[str] = set()
        """Requests vLLM holds that `abort` ended: the thread aborts them in vLLM before its next step."""
        self._ended: list[Generation] = []
        self._failure: BaseException | None = None
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet ended."""
        with self._changed:
            return len(self._held)

    def submit(self, requests: list[Generation], params: SamplingParams) -> None:
        """Continue each request from its output so far, alongside those in flight; returns at once. A request
        already at `max_new_tokens` (or at the model's length) ends as `length` without generating."""
        with self._changed:
            self._raise_failure()
            for req in requests:
                left = min(params.max_new_tokens - len(req.output_ids),
                           self._max_model_len - len(req.prompt_ids) - len(req.output_ids))
                if left <= 0:
                    self._ended.append(replace(req, finish_reason="length"))
                else:
                    self._held[f"fasync-stream-{next(self._ids)}"] = _Held(req, left, params)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fasync-vllm-stream", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def take_ended(self) -> list[Generation]:
        """The requests that ended since the last call, finished or aborted (with the tokens they generated),
        waiting until there is one, or until nothing is in flight (then none)."""
        with self._changed:
            self._changed.wait_for(lambda: self._ended or not self._held or self._failure is not None)
            self._raise_failure()
            ended, self._ended = self._ended, []
            return ended

    def abort(self) -> None:
        """End every request submitted so far, each with what it generated; later ones run normally."""
        with self._changed:
            for rid, held in list(self._held.items()):
                if held.added:
                    self._aborting.add(rid)
                self._end(rid, "abort")
            self._changed.notify_all()

    def kept(self) -> list[int]:
        """The fasync request ids in flight that have output tokens: the requests a load between two steps
        interrupts part-way through."""
        with self._changed:
            return [held.request.request_id for held in self._held.values() if held.request.output_ids or held.tokens]

    def restart_unsampled(self) -> None:
        """Under `busy`, at a load that keeps the KV cache: requests vLLM holds that have sampled nothing yet (a
        prompt prefilled in chunks across the pause) leave vLLM and are added again at the next step, under the
        new version, so that no token attends to keys and values of weights older than its version says."""
        with self._changed:
            unsampled = [rid for rid, held in self._held.items() if held.added and not held.tokens]
            for rid in unsampled:
                held = self._held.pop(rid)
                held.added = False
                self._held[f"fasync-stream-{next(self._ids)}"] = held
        if unsampled:
            self._engine.abort_request(unsampled)

    def wake(self) -> None:
        """Look at `running` again (the engine resumed)."""
        with self._changed:
            self._changed.notify_all()

    # -- the stepping thread ---------------------------------------------------------------------------------

    def _end(self, rid: str, reason: FinishReason) -> None:
        self._ended.append(self._held.pop(rid).ended(reason))

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the vLLM engine's stepping thread failed: {self._failure!r}") from self._failure

    def _has_work(self) -> bool:
        return bool(self._aborting) or (self._running.is_set() and bool(self._held))

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(self._has_work)
                with self._busy:
                    # A pause that took `busy` between the look above and here: the step waits for `resume`.
                    if self._running.is_set() or self._aborting:
                        self._step()
        except BaseException as error:  # noqa: BLE001 - handed to `take_ended`, which raises it in the caller
            with self._changed:
                self._failure = error
                self._changed.notify_all()

    def _step(self) -> None:
        """One engine step over what is in flight (under `busy`): aborts and new requests first."""
        with self._changed:
            aborting, self._aborting = list(self._aborting), set()
            adding = [(rid, held) for rid, held in self._held.items() if not held.added]
            for _, held in adding:
                held.added = True
            running = self._running.is_set()
        if aborting:
            self._engine.abort_request(aborting)
        version = self._version()
        for rid, held in adding:
            req = held.request
            self._engine.add_request(rid, versioned_prompt(req.prompt_ids + req.output_ids, version),
                                     vllm_sampling(held.params, held.max_tokens, delta=True))
        if not running:
            return
        if not self._engine.has_unfinished_requests():
            with self._changed:
                lost = sum(held.added for held in self._held.values())
            if lost:  # else the thread would spin on requests that can never end
                raise RuntimeError(f"vLLM holds none of the {lost} requests submitted to it")
            return
        outputs = self._engine.step()
        with self._changed:
            for output in outputs:
                held = self._held.get(output.request_id)
                if held is None:  # aborted meanwhile: it ended with what it had
                    continue
                completion = output.outputs[0]
                held.tokens += completion.token_ids
                held.logprobs += sampled_logprobs(completion)
                held.versions += [version] * len(completion.token_ids)
                if output.finished:
                    self._end(output.request_id, ended_reason(output))
            self._changed.notify_all()
