"""The built-in multi-turn loop: an environment (`rollout.env: module:Class`) as a rollout function.

An environment is a class built with no arguments, one instance per trajectory:

    class Env:
        tools = {"python": python_tool}          # optional: name → function of the call's arguments → text

        async def reset(self, task) -> list[dict]:               # the first messages (system, user, ...)
        async def step(self, model_text) -> Step | tuple:         # (observation messages, reward, done)

Each turn the model speaks (a turn cut at `rollout.max_new_tokens` is closed with the template's turn end, not
trained, and counts as what the model said); a turn with tool calls (read by `rollout.tool_parser`) is answered by the tools, run
at once with a timeout each, and a turn without any goes to `step`, whose messages answer it. The trajectory's
reward is the sum of its steps' rewards (a final reward is a last step's; per-turn rewards add up). It ends when a
step says done, or truncated: after `rollout.max_turns` model turns, or when the next observation would pass the
trajectory's token budget (`rollout.max_trajectory_tokens`, and never past the model's context).

Before each model turn the loop saves the trajectory and its environment's attributes (`Task.save`): a checkpoint
in fully_async keeps that point, and the resumed run goes on from it, generating again the turn the trajectory was
in (or running again the tools or step it was waiting on), since only between turns do the tokens and the
environment's state agree.
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass, field, replace

from fasync.config.schema import FasyncConfig
from fasync.errors import ConfigurationError
from fasync.killpoints import kill_point
from fasync.rollout.agent import EngineClient, Task, import_object
from fasync.rollout.tools import TOOL_PARSERS, run_tool_calls
from fasync.rollout.trajectory import Trajectory, observation_ids, turn_end_id


@dataclass(frozen=True)
class Step:
    """What an environment's `step` returns (a plain `(observation, reward, done)` tuple works too)."""

    observation: list[dict] = field(default_factory=list)
    """Messages ({"role", "content"}) the model reads before its next turn."""
    reward: float = 0.0
    done: bool = False


def check_environment(env_class, spec: str) -> None:
    """A ConfigurationError unless `env_class` is a class with async `reset` and `step` and a `tools` mapping."""
    if not inspect.isclass(env_class):
        raise ConfigurationError(f"rollout.env: {spec} is a {type(env_class).__name__}, not a class")
    for method in ("reset", "step"):
        if not inspect.iscoroutinefunction(getattr(env_class, method, None)):
            raise ConfigurationError(f"rollout.env: {spec} needs an `async def {method}` method (docs/agentic.md)")
    if not isinstance(getattr(env_class, "tools", {}), dict):
        raise ConfigurationError(f"rollout.env: {spec}.tools must map tool names to functions")


def environment_state(env) -> dict:
    """What a checkpoint keeps of an environment: its instance attributes but `tools` (which its constructor
    builds again). Where one is not plain data, `Task.save` keeps nothing, and a resume restarts the trajectory
    from its prompt."""
    return {name: value for name, value in vars(env).items() if name != "tools"}


class EnvironmentRollout:
    """The rollout function of `rollout.env`."""

    def __init__(self, cfg: FasyncConfig, max_context: int | None = None):
        rollout = cfg.rollout
        self.max_context = max_context
        self.spec = rollout.env
        self.env_class = import_object(rollout.env, "rollout.env")
        check_environment(self.env_class, rollout.env)
        self.parse = TOOL_PARSERS[rollout.tool_parser]
        self.max_turns = rollout.max_turns
        self.max_new_tokens = rollout.max_new_tokens
        self.max_observation_tokens = rollout.max_observation_tokens
        self.token_budget = rollout.max_trajectory_tokens or \
            rollout.max_turns * (rollout.max_new_tokens + rollout.max_observation_tokens)
        self.tool_timeout_s = rollout.tool_timeout_s
        self.turn_end: int | None = None
        """`turn_end_id` of the run's tokenizer, looked up at the first trajectory."""

    async def __call__(self, task: Task, engine: EngineClient) -> Trajectory:
        env = self.env_class()
        tokenizer = task.tokenizer
        if self.turn_end is None:
            self.turn_end = turn_end_id(tokenizer)
        if task.saved is not None:
            # Resumed from a checkpoint: the trajectory and its environment as they stood before the model turn it
            # was in (or waited on the tools of).
            trajectory = task.saved.trajectory()
            vars(env).update(copy.deepcopy(task.saved.state))
        else:
            started = time.monotonic()
            first = await env.reset(task)
            # The environment's first messages are the trajectory's prompt; none: the dataset's prompt.
            trajectory = Trajectory(replace(task.request, prompt_ids=tokenizer.render_chat(list(first), True))) \
                if first else task.trajectory()
            trajectory.reward = 0.0
            trajectory.stats.env_time_s += time.monotonic() - started
        tools = getattr(env, "tools", {})
        stats = trajectory.stats
        budget = self.token_budget if self.max_context is None else \
            min(self.token_budget, self.max_context - len(trajectory.request.prompt_ids))
        done = False
        while not done:
            left = budget - trajectory.output_length
            if stats.turns == self.max_turns or left <= 1:
                break
            # The point a checkpoint goes on from: between two turns the tokens and the environment agree.
            task.save(trajectory, environment_state(env))
            # One token of room kept for closing a turn cut at its budget.
            turn = await engine.generate(trajectory.context, min(self.max_new_tokens, left - 1))
            trajectory.add_turn(turn)
            if turn.finish_reason != "stop":
                # Cut at its budget: the turn is closed as the template closes one (not trained), and what the model
                # said so far is its turn.
                trajectory.add_observation([self.turn_end])
            text = tokenizer.decode(turn.token_ids)
            calls = self.parse(text)
            kill_point("agent_step")
            if calls:
                observation = await run_tool_calls(calls, tools, self.tool_timeout_s, stats)
            else:
                started = time.monotonic()
                step = await env.step(text)
                stats.env_time_s += time.monotonic() - started
                observation, step_reward, done = step if isinstance(step, tuple) else \
                    (step.observation, step.reward, step.done)
                trajectory.reward += float(step_reward)
            if done or not observation:
                continue
            tokens = observation_ids(tokenizer, self._cut(tokenizer, observation))
            if trajectory.output_length + len(tokens) >= budget:
                break
            trajectory.add_observation(tokens)
        stats.truncated = not done
        trajectory.finish("stop" if done else "length")
        return trajectory

    def _cut(self, tokenizer, messages: list[dict]) -> list[dict]:
        """`messages` with each content cut to its share of `rollout.max_observation_tokens` (the tool output or
        environment text is cut, not the template's markers around it)."""
        share = max(1, self.max_observation_tokens // max(len(messages), 1))
        cut = []
        for message in messages:
            ids = tokenizer.encode(str(message["content"]))
            content = message["content"] if len(ids) <= share else tokenizer.decode(ids[:share])
            cut.append({**message, "content": content})
        return cut
