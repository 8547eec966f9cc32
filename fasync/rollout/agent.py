"""Custom rollout functions (`rollout.function`) and the engine client they generate with.

A rollout function is `async def rollout(task: Task, engine: EngineClient) -> Trajectory`: it builds one
trajectory of a prompt, calling `engine.generate(token_ids)` for each model turn and doing whatever it likes
between turns (tools, an environment, a judge). The multi-turn environment loop (`fasync.rollout.env_loop`)
is one such function. Every trajectory of every group in a rollout runs at once, as an asyncio task: a
trajectory waiting on a tool holds no engine, and the turns the others ask for meanwhile share the engine's
next generate call (`EngineClient` batches the requests that wait).

The same runner serves the three modes. In sync and async the driver runs a rollout's groups to the end
(`AgentRunner.generate`); in fully_async the rollouter runs each admitted group as a task and hands the client
an engine call that waits while a weight sync or a snapshot holds generation, so that a sync waits for the
turns being generated (with partial rollout it aborts them, and they go on from their prefix under the new
weights) and never for a tool: a trajectory's next turn after a tool call is generated with whatever weights
the engine serves by then. Each token carries the version that produced it.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import math
import numbers
import pickle
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from fasync.config.schema import FasyncConfig
from fasync.data.rewards import MAX_REWARD
from fasync.errors import ConfigurationError
from fasync.rollout.trajectory import PlainData, SavedTrajectory, Trajectory, Turn, is_plain
from fasync.rollout.types import Generation, GroupId, SamplingParams
from fasync.wire import pack, unpack

EngineCall = Callable[[list[Generation], SamplingParams], Awaitable[list[Generation]]]
"""One generate call on one engine: the requests continued, finished or (aborted by a weight sync) not."""


@dataclass(frozen=True)
class Task:
    """What a rollout function builds one trajectory for."""

    group_id: GroupId
    prompt: str
    """The dataset's prompt text."""
    label: str
    prompt_ids: list[int]
    """The prompt as the model reads it (through the chat template with a chat model)."""
    request: Generation
    tokenizer: Any
    """`encode`, `decode`, `render_chat`, `stop_token_ids`: fasync.model.tokenizer."""
    config: FasyncConfig
    saved: Optional[SavedTrajectory] = None
    """What a checkpoint kept of this trajectory in flight (`save`), for the function to go on from after a
    resume; None: the trajectory starts from the prompt."""
    keep: Callable[[Optional[SavedTrajectory]], None] = field(default=lambda saved: None, repr=False)
    """Where `save` puts the trajectory's point to go on from: its group, which a checkpoint saves."""

    def trajectory(self) -> Trajectory:
        """An empty trajectory of this task's request, for the function to extend and return."""
        return Trajectory(self.request)

    def save(self, trajectory: Trajectory, state: PlainData) -> bool:
        """Mark where this trajectory stands now as a point to go on from: a checkpoint taken before the next
        `save` keeps its tokens so far (loss mask, behaviour logprobs, versions), reward and stats, and `state`,
        which the function needs to go on (plain data: a checkpoint is read as data only); a resumed run hands
        them back as `saved`. A `state` that is not plain data forgets the point instead, and returns False: a
        checkpoint then restarts the trajectory from its prompt, as it does a function that never saves."""
        if not is_plain(state):
            self.keep(None)
            return False
        self.keep(trajectory.saved(state))
        return True


RolloutFunction = Callable[[Task, "EngineClient"], Awaitable[Trajectory]]


class EngineClient:
    """One engine, as a rollout function sees it. Concurrent `generate` calls are sent together: while a call is
    in flight, the turns asked for meanwhile wait and go in the next one (one call per turn budget)."""

    def __init__(self, call: EngineCall, params: SamplingParams, request_ids: itertools.count):
        self._call = call
        self.params = params
        self._request_ids = request_ids
        self._waiting: dict[int, list[tuple[Generation, asyncio.Future]]] = {}
        self._sender: asyncio.Task | None = None

    async def generate(self, token_ids: list[int], max_new_tokens: int | None = None) -> Turn:
        """One model turn continuing `token_ids`: at most `max_new_tokens` (default `rollout.max_new_tokens`),
        ending at a stop token (`stop`) or the budget (`length`). A weight sync during the turn does not end it:
        the turn goes on from its prefix, and `versions` says which weights produced each token."""
        budget = min(max_new_tokens or self.params.max_new_tokens, self.params.max_new_tokens)
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(budget, []).append((Generation(next(self._request_ids), list(token_ids)), future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())
        generation = await future
        return Turn(generation.output_ids, generation.logprobs, generation.token_versions, generation.finish_reason)

    async def _send(self) -> None:
        while self._waiting:
            budget, batch = self._waiting.popitem()
            try:
                results = await self._call([request for request, _ in batch], replace(self.params, max_new_tokens=budget))
            except BaseException as error:  # noqa: BLE001 - handed to every turn that waited on this call
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
                continue
            for (_, future), generation in zip(batch, results):
                if future.done():
                    continue  # its trajectory was cancelled meanwhile
                if generation.finished:
                    future.set_result(generation)
                else:  # aborted for a weight sync or a snapshot: the next call continues it from its prefix
                    self._waiting.setdefault(budget, []).append((generation, future))


def import_object(spec: str, key: str):
    """The attribute named by `module:attribute`, imported from PYTHONPATH, the working directory or the config's
    directory (`fasync.data.rewards.make_importable`); a ConfigurationError naming `key` otherwise."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{key}: {spec!r} is not of the form module:attribute")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"{key}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); fasync imports it from "
            "the working directory, the config's directory and PYTHONPATH") from exc
    found = getattr(module, attribute, None)
    if found is None:
        raise ConfigurationError(f"{key}: module {module_name!r} has no attribute {attribute!r}")
    return found


def import_rollout_function(spec: str) -> RolloutFunction:
    """`rollout.function`, imported and checked to be an `async def` function."""
    function = import_object(spec, "rollout.function")
    if not asyncio.iscoroutinefunction(function):
        raise ConfigurationError(f"rollout.function: {spec} must be an `async def` function taking (task, engine) "
                                 "and returning a Trajectory")
    return function


class AgentRunner:
    """Runs a group's trajectories through the run's rollout function."""

    def __init__(self, cfg: FasyncConfig, tokenizer, function: RolloutFunction):
        """`function`: `import_rollout_function(rollout.function)`, or the multi-turn loop over `rollout.env`
        (`fasync.rollout.env_loop.EnvironmentRollout`); either pickles by reference into the rollouter's actor."""
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.function = function
        self.spec = cfg.rollout.function or cfg.rollout.env
        self.request_ids = itertools.count(1 << 40)
        """Turn request ids, apart from the groups' own."""

    def __getstate__(self) -> dict:
        # The rollouter's actor may have started before `fasync train` made the config's directory importable
        # (a Ray cluster of its own, a test session): the function travels pickled inside, and the directory of
        # the module it was imported from joins the import path before it is unpickled.
        imported = getattr(self.function, "env_class", self.function)
        module = sys.modules.get(imported.__module__)
        directory = str(Path(module.__file__).parent) if getattr(module, "__file__", None) else None
        return {"cfg": self.cfg, "tokenizer": self.tokenizer, "function": pickle.dumps(self.function),
                "directory": directory}

    def __setstate__(self, state: dict) -> None:
        if state["directory"] is not None and state["directory"] not in sys.path:
            sys.path.append(state["directory"])
        self.__init__(state["cfg"], state["tokenizer"], pickle.loads(state["function"]))

    def client(self, call: EngineCall, params: SamplingParams) -> EngineClient:
        return EngineClient(call, params, self.request_ids)

    async def run_group(self, group, client: EngineClient):
        """Every trajectory of `group` (a `fasync.rollout.groups.PromptGroup`), at once; the group's requests
        become the finished trajectories."""
        trajectories = await asyncio.gather(*(self._trajectory(group, request, client) for request in group.requests))
        group.requests = [trajectory.request for trajectory in trajectories]
        group.in_progress = {}
        group.outcomes = [trajectory.outcome for trajectory in trajectories]
        return group

    async def _trajectory(self, group, request: Generation, client: EngineClient) -> Trajectory:
        def keep(saved: Optional[SavedTrajectory]) -> None:
            if saved is None:
                group.in_progress.pop(request.request_id, None)
            else:
                group.in_progress[request.request_id] = saved

        task = Task(group.group_id, group.prompt, group.label, request.prompt_ids, request, self.tokenizer, self.cfg,
                    group.in_progress.get(request.request_id), keep)
        try:
            trajectory = await self.function(task, client)
        except (ConfigurationError, asyncio.CancelledError):
            raise
        except Exception as error:
            raise ConfigurationError(f"{self._key}: {self.spec} raised {type(error).__name__}: {error} for prompt "
                                     f"{group.prompt[:60]!r}") from error
        if not isinstance(trajectory, Trajectory):
            raise ConfigurationError(f"{self._key}: {self.spec} returned a {type(trajectory).__name__}, not a "
                                     "Trajectory (start one with task.trajectory())")
        reward = trajectory.reward
        if reward is not None and not (isinstance(reward, numbers.Real) and math.isfinite(reward)
                                       and abs(reward) <= MAX_REWARD):
            raise ConfigurationError(f"{self._key}: {self.spec} gave the reward {reward!r} for prompt "
                                     f"{group.prompt[:60]!r}; a reward must be a finite number of at most "
                                     f"{MAX_REWARD:g} in magnitude, or None for the reward function to score")
        if not trajectory.request.finished:
            trajectory.finish("stop")
        return trajectory

    @property
    def _key(self) -> str:
        return "rollout.function" if self.cfg.rollout.function is not None else "rollout.env"

    def generate(self, engines: list, groups: list, params: SamplingParams) -> list:
        """Sync and async: run every group's trajectories to the end, the groups spread over the engines."""

        def call_on(engine) -> EngineCall:
            async def call(requests: list[Generation], call_params: SamplingParams) -> list[Generation]:
                return unpack(await engine.generate.remote(pack(requests), call_params))
            return call

        async def run_all() -> list:
            clients = [self.client(call_on(engine), params) for engine in engines]
            return await asyncio.gather(*(self.run_group(group, clients[i % len(clients)])
                                          for i, group in enumerate(groups)))

        return asyncio.run(run_all())

