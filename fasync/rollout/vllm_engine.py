"""The vLLM rollout engine (GPU only; vLLM is imported when the engine is built).

Written against vLLM's offline V1 API (0.10.2 and later): an `LLM` whose
`llm_engine` is stepped by hand, so that pause and abort are seen between
engine steps and unfinished requests keep what they generated. Behaviour
logprobs come from `logprobs_mode="processed_logprobs"`: after temperature and
top-p, i.e. of the distribution sampled from, as in the torch engine. New
weights reach the workers through `collective_rpc` and a worker extension that
calls the model's own `load_weights`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from fasync.config.schema import FasyncConfig
from fasync.errors import ConfigurationError
from fasync.rollout.engine import Continuation, RolloutEngine
from fasync.rollout.types import SamplingParams

GPU_MEMORY_SHARE = {True: 0.4, False: 0.85}
"""Fraction of GPU memory vLLM may claim, by `resources.colocate` (colocated, the trainer needs the rest)."""


class WeightLoader:
    """Mixed into every vLLM worker (`worker_extension_cls`) so the engine can hand it new weights."""

    def load_named_weights(self, named_tensors: list) -> None:
        self.model_runner.model.load_weights(weights=named_tensors)


class VLLMEngine(RolloutEngine):
    def __init__(self, cfg: FasyncConfig, seed: int = 0):
        super().__init__()
        if cfg.model.path is None:
            raise ConfigurationError("rollout.engine: vllm needs model.path (a Hugging Face model directory)")
        import torch

        if not torch.cuda.is_available():
            raise ConfigurationError("rollout.engine: vllm needs a CUDA GPU; use rollout.engine: hf on CPU")
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ConfigurationError("rollout.engine: vllm is not installed (pip install 'fasync[gpu]')") from exc
        self.llm = LLM(
            model=cfg.model.path,
            dtype=cfg.model.dtype,
            seed=seed,
            gpu_memory_utilization=GPU_MEMORY_SHARE[cfg.resources.colocate],
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WeightLoader",
        )
        self._request_ids = itertools.count()

    def _load_state_dict(self, state_dict: dict) -> None:
        from fasync.model.hf import hf_parameter_names

        named = [(name, tensor.detach().cpu()) for name, tensor in hf_parameter_names(state_dict).items()]
        self.llm.collective_rpc("load_named_weights", args=(named,))
        # Cached prefixes hold keys and values computed by the old weights.
        self.llm.reset_prefix_cache()

    def _continue(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams, interrupted: Callable[[], bool]
    ) -> list[Continuation]:
        from vllm import SamplingParams as VLLMSamplingParams

        engine = self.llm.llm_engine
        limit = engine.model_config.max_model_len
        ids = [f"fasync-{next(self._request_ids)}" for _ in contexts]
        results = {rid: Continuation([], [], "length") for rid in ids}
        latest = {}
        for rid, context, budget in zip(ids, contexts, budgets):
            budget = min(budget, limit - len(context))
            if budget <= 0:
                continue
            engine.add_request(rid, {"prompt_token_ids": context}, VLLMSamplingParams(
                max_tokens=budget,
                temperature=params.temperature,
                top_p=params.top_p,
                stop_token_ids=list(params.stop_token_ids),
                logprobs=0,  # the sampled token's logprob only
                detokenize=False,
            ))
            latest[rid] = None
        while engine.has_unfinished_requests():
            if interrupted():
                engine.abort_request([rid for rid, out in latest.items() if out is None or not out.finished])
                break
            for out in engine.step():
                latest[out.request_id] = out
        for rid, out in latest.items():
            completion = out.outputs[0] if out is not None else None
            if completion is None:
                results[rid] = Continuation([], [], "abort")
                continue
            tokens = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
            finished = out.finished and completion.finish_reason in ("stop", "length")
            results[rid] = Continuation(tokens, logprobs, completion.finish_reason if finished else "abort")
        return [results[rid] for rid in ids]
