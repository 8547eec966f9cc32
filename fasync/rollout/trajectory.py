"""Multi-turn trajectories: one token sequence of model turns and the observations between them.

A trajectory is the request (`fasync.rollout.types.Generation`) its model turns extend, so that the trainer, the
correction, staleness, the lag and the ledger see one more completion: its output holds every token after the
prompt, and `loss_mask` marks the observation tokens (tool results, environment messages, the chat template's
turn markers) that the loss does not train on. The model's tokens are kept exactly as the engine sampled them,
never decoded and re-encoded (re-encoding the text drifts from what was sampled); an observation is rendered
through the chat template on its own (`observation_ids`), which a test checks against rendering the whole
conversation at once.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Optional

from fasync.rollout.types import FinishReason, Generation, trained_mask

_PROBE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
"""A conversation that ends with an assistant turn: what `observation_ids` renders new messages after (digits:
every tokenizer, the embedded task alphabet included, has them)."""


@dataclass(frozen=True)
class Turn:
    """What the engine client's `generate` returns: one model turn."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    """The weight version that produced each token (a turn a weight sync interrupted spans two)."""
    finish_reason: FinishReason
    """`stop`: the model ended its turn; `length`: the turn's or the trajectory's token budget ran out."""


@dataclass
class TrajectoryStats:
    """What one trajectory did, for the rollout's metrics (`fasync.metrics.registry`, `agent/*`)."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: Counter = field(default_factory=Counter)
    """Tool calls that failed, by kind (`timeout`, `crash`, `output_limit`, `unknown_tool`, `bad_call`, ...)."""
    tool_time_s: float = 0.0
    env_time_s: float = 0.0
    truncated: bool = False
    """The trajectory ran out of turns or tokens before the environment said it was done."""

    def copy(self) -> "TrajectoryStats":
        return replace(self, tool_errors=Counter(self.tool_errors))


@dataclass(frozen=True)
class Outcome:
    """What a finished trajectory brings besides its tokens: the reward its rollout function or environment
    gave (None: the run's reward function scores the model's text) and its stats."""

    reward: Optional[float]
    stats: TrajectoryStats


PlainData = None | bool | int | float | str | list | tuple | dict
"""What a checkpoint keeps of a rollout function's own state: a checkpoint is read back as data only
(`fasync.checkpoint.safe_load`), so no object of the function's classes."""


def is_plain(value) -> bool:
    """Whether `value` is plain data: None, booleans, numbers, strings, and lists, tuples and string-keyed dicts of
    plain data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and is_plain(item) for key, item in value.items())
    return False


@dataclass(frozen=True)
class SavedTrajectory:
    """A trajectory in flight as a checkpoint keeps it (`fasync.rollout.agent.Task.save`): its tokens so far with
    their loss mask, behaviour logprobs and per-token versions, its reward and stats so far, and the plain `state`
    its rollout function needs to go on from there."""

    request: Generation
    reward: Optional[float]
    stats: TrajectoryStats
    state: PlainData

    def trajectory(self) -> "Trajectory":
        """The trajectory to go on with (its stats a copy: the saved point stays as it was)."""
        return Trajectory(self.request, self.reward, self.stats.copy())


@dataclass
class Trajectory:
    """A trajectory being built by a rollout function: the request it extends, its reward (None: the run's
    reward function scores the decoded model text) and its stats."""

    request: Generation
    reward: Optional[float] = None
    stats: TrajectoryStats = field(default_factory=TrajectoryStats)

    @property
    def context(self) -> list[int]:
        """Every token so far, prompt first: what the next model turn continues."""
        return self.request.prompt_ids + self.request.output_ids

    @property
    def output_length(self) -> int:
        return len(self.request.output_ids)

    def add_turn(self, turn: Turn) -> None:
        """Append a model turn's tokens as sampled, trained."""
        req = self.request
        self.request = replace(req, output_ids=req.output_ids + turn.token_ids, logprobs=req.logprobs + turn.logprobs,
                               token_versions=req.token_versions + turn.versions,
                               loss_mask=trained_mask(req.loss_mask, len(req.output_ids)) + [True] * len(turn.token_ids))
        self.stats.turns += 1

    def add_observation(self, token_ids: list[int]) -> None:
        """Append observation tokens, not trained, carrying the version of the model token before them (they
        count for no staleness: staleness reads trained tokens only)."""
        req = self.request
        version = req.token_versions[-1] if req.token_versions else 0
        self.request = replace(req, output_ids=req.output_ids + token_ids, logprobs=req.logprobs + [0.0] * len(token_ids),
                               token_versions=req.token_versions + [version] * len(token_ids),
                               loss_mask=trained_mask(req.loss_mask, len(req.output_ids)) + [False] * len(token_ids))

    def saved(self, state: PlainData) -> SavedTrajectory:
        """This trajectory as it stands, with `state`, for a checkpoint (copied: it goes on changing)."""
        return SavedTrajectory(self.request, self.reward, self.stats.copy(), copy.deepcopy(state))

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.reward, self.stats)

    def finish(self, reason: FinishReason) -> Generation:
        """The request, finished: what the group scores and trains on."""
        self.request = replace(self.request, finish_reason=reason)
        return self.request


def turn_end_id(tokenizer) -> int:
    """The stop token the chat template closes an assistant turn with (`<|end|>`, Qwen's `<|im_end|>`): what the
    multi-turn loop appends, not trained, to a turn cut at its token budget before the next observation."""
    rendered = tokenizer.render_chat(_PROBE, add_generation_prompt=False)
    stops = set(tokenizer.stop_token_ids)
    return next((token for token in reversed(rendered) if token in stops), tokenizer.stop_token_ids[0])


def observation_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The tokens that follow an assistant turn's end token to add `messages` and open the next assistant turn.

    The chat template renders a conversation ending with an assistant turn, then the same with `messages` and the
    generation prompt; the new tokens start after the assistant turn's last stop token (whatever the template puts
    after it, such as Qwen's newline, belongs to the observation, since generation stopped at that token)."""
    before = tokenizer.render_chat(_PROBE, add_generation_prompt=False)
    after = tokenizer.render_chat(_PROBE + messages, add_generation_prompt=True)
    if after[:len(before)] != before:
        raise ValueError("the chat template renders earlier turns differently once more messages follow; "
                         "observations cannot be appended as tokens")
    stops = set(tokenizer.stop_token_ids)
    end = max((i for i, token in enumerate(before) if token in stops), default=len(before) - 1)
    return after[end + 1:]
