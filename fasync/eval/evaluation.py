"""Evaluating the policy on the eval set with the run's engines, while training goes on.

An evaluation generates `eval.samples_per_prompt` completions of every eval prompt with the eval's sampling
settings, scores them with the run's reward and sums them up (`fasync.eval.scores`). In sync it runs between
two rollouts, after the weight push, and training waits for it. In async and fully_async it runs in a thread
of its own beside the rollouts: its generate calls take turns with the rollouts' on each engine, so training
goes on, and its result goes on the first row written after it finished, with the weight version it generated
with (`eval/weight_version`). A weight sync that aborts its requests (fully_async's partial rollout) sends them
again to go on from their prefix under the new weights, as partial rollouts do: sent again from the start, an
evaluation longer than the time between two syncs would never finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from fasync.config.schema import FasyncConfig
from fasync.data.held_out import EvalPrompts
from fasync.data.scoring import RewardRunner
from fasync.eval.scores import PromptResult, eval_metrics
from fasync.launch.faults import Watchdog
from fasync.rollout.groups import GroupFactory, PromptGroup
from fasync.rollout.types import SamplingParams

Generate = Callable[[list[PromptGroup], SamplingParams], object]
"""Runs the groups' requests (to the end, or until a weight sync aborts them) and puts the results in
`group.requests`: the run's engines (`fasync.drivers.generation.generate`), or one engine in this process
(`fasync eval`)."""

EVAL_REQUEST_IDS = 1 << 48
"""Eval requests are numbered from here, apart from the training requests an engine may hold at the same time."""


class _InOrder:
    """The eval prompts as a dataset that `GroupFactory` draws from in order, each once."""

    def __init__(self, prompts: EvalPrompts):
        self.problems = prompts.dataset.problems
        self.location = prompts.dataset.location

    def draw(self, cursor: int, count: int, rng) -> list[int]:
        return list(range(cursor, cursor + count))


def eval_config(cfg: FasyncConfig) -> FasyncConfig:
    """The config with the eval's sampling settings in place of the rollout's."""
    spec = cfg.eval
    rollout = cfg.rollout.model_copy(update={
        "n_samples_per_prompt": spec.samples_per_prompt, "temperature": spec.temperature, "top_p": spec.top_p,
        "max_new_tokens": spec.max_new_tokens or cfg.rollout.max_new_tokens})
    return cfg.model_copy(update={"rollout": rollout})


class Evaluator:
    """Generates the eval set with `generate` and scores it with the run's `rewards`; `evaluate` returns the
    `eval/` metrics of one evaluation."""

    def __init__(self, cfg: FasyncConfig, tokenizer, rewards: RewardRunner, prompts: EvalPrompts,
                 generate: Generate):
        self.cfg = eval_config(cfg)
        self.tokenizer, self.rewards = tokenizer, rewards
        self.prompts = prompts
        self.generate = generate
        self.last_groups: list[PromptGroup] = []
        """The groups of the last evaluation, scored (`fasync eval` shows some)."""

    def _groups(self) -> tuple[GroupFactory, list[PromptGroup]]:
        factory = GroupFactory(self.cfg, self.tokenizer, _InOrder(self.prompts), self.rewards)
        factory.load_state_dict({**factory.state_dict(), "request_ids": EVAL_REQUEST_IDS})
        return factory, factory.new_groups(len(self.prompts))

    def evaluate(self) -> dict[str, float]:
        started = time.monotonic()
        factory, groups = self._groups()
        todo = groups
        while todo:  # requests a weight sync aborted go on from their prefix, under the new weights
            self.generate(todo, factory.params)
            todo = [group for group in groups if not group.finished]
        factory.score_all(groups)  # a completion the reward could not score (`reward.on_error: drop`) counts 0
        results = []
        for group in groups:
            results.append(PromptResult([s.reward for s in group.samples],
                                        self.prompts.data_sources[group.prompt_index],
                                        [len(s.output_ids) for s in group.samples]))
        self.last_groups = groups
        metrics = eval_metrics(results, self.cfg.eval.k, self.cfg.eval.correct_reward)
        versions = [s.oldest_version for group in groups for s in group.samples if s.token_versions]
        metrics["eval/weight_version"] = min(versions, default=None)
        metrics["eval/time_s"] = time.monotonic() - started
        return metrics


class Evaluation:
    """When a training run evaluates (`eval.every` optimizer steps, `eval.before_train`), and the results to put
    on its rows. `beside`: evaluations run in a thread of their own (the async modes) instead of in the caller's.

    A row holds at most one evaluation's result, and one evaluation runs at a time: an evaluation that falls due
    while another runs, or while every row of the rollout already has a result to hold, starts at the end of the
    next rollout instead. At the run's last rollout the one running is waited for."""

    def __init__(self, evaluator: Evaluator, every: int, beside: bool, watchdog: Watchdog):
        self.evaluator = evaluator
        self.watchdog = watchdog
        self.every = every
        self._step = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fasync-eval") if beside else None
        self._running: Future | None = None
        self._results: list[dict] = []
        """Finished evaluations whose results no row holds yet, oldest first."""

    def start(self, step: int, before_train: bool) -> None:
        """At the run's start (or resume) at optimizer `step`: count the interval from there, and evaluate the
        initial weights when `before_train` and no step was taken yet."""
        self._step = step
        if before_train and step == 0:
            self._begin(step)

    def _begin(self, step: int) -> None:
        self._step = step
        if self._thread is None:
            self._results.append(self.evaluator.evaluate())
        else:
            self._running = self._thread.submit(self.evaluator.evaluate)

    def _collect(self, wait: bool) -> None:
        if self._running is not None and (wait or self._running.done()):
            running, self._running = self._running, None
            self._results.append(self.watchdog.result(running, "the evaluation"))

    def at_rollout_end(self, step: int, rows: int, last: bool) -> list[dict]:
        """At the end of a rollout (drain) of `rows` rows, `step` optimizer steps in, once its weights are pushed:
        start an evaluation that is due, and return the results for the rollout's last rows, oldest first (at
        the `last` rollout, waiting for the one running)."""
        self._collect(wait=last)
        due = bool(self.every) and step // self.every > self._step // self.every
        if due and self._running is None and len(self._results) < rows:
            self._begin(step)
            self._collect(wait=last)
        taken, self._results = self._results[:rows], self._results[rows:]
        return taken

    def close(self) -> None:
        """Stop waiting for an evaluation still running (the run is ending) and end the thread."""
        if self._thread is not None:
            if self._running is not None and not self._running.done():
                self.watchdog.cancel()
            self._thread.shutdown(wait=True)
