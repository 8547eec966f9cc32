"""What flows between the rollout engines, the drivers and the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from fasync import staleness

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, order=True)
class GroupId:
    """A prompt group's identity for the whole run: the `draw`-th prompt drawn from the dataset (from 0)
    and the `attempt` at generating it (0; a stale group regenerated keeps its draw and takes the next
    attempt). Prompts are drawn from one seeded stream, so the same seed gives the same prompt the same
    id in every run."""

    draw: int
    attempt: int = 0

    def __str__(self) -> str:
        return f"{self.draw}.{self.attempt}"


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class Generation:
    """One completion, possibly unfinished.

    A request is a Generation with `finish_reason=None`; an engine continues it
    from whatever `output_ids` it already holds (a partial rollout resumed after
    a weight sync), appending tokens, their behaviour logprobs and the weight
    version that produced each token.
    """

    request_id: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    finish_reason: Optional[FinishReason] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason in ("stop", "length")


@dataclass
class Sample:
    """A scored completion ready for training."""

    group_id: GroupId
    prompt_ids: list[int]
    output_ids: list[int]
    behaviour_logprobs: list[float]
    token_versions: list[int]
    reward: float
    label: str = ""
    completion: str = ""
    finish_reason: Optional[FinishReason] = None
    advantage: float = 0.0

    @property
    def oldest_version(self) -> int:
        return min(self.token_versions)

    @property
    def newest_version(self) -> int:
        return max(self.token_versions)

    def staleness(self, current_version: int) -> int:
        """Versions between the trainer's weights and the oldest weights that produced any token."""
        return staleness.staleness(current_version, self.oldest_version)
