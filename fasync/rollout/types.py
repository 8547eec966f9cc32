"""What flows between the rollout engines, the drivers and the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from fasync import staleness

FinishReason = Literal["stop", "length", "abort"]


def trained_mask(loss_mask: list[bool], length: int) -> list[bool]:
    """Whether the loss trains on each of `length` output tokens. `loss_mask` covers the first tokens and a
    token past its end is a model token (trained): an engine appends what it samples without touching the mask,
    and a single-turn completion has an empty one. A multi-turn trajectory's observation tokens (tool results,
    environment messages, the chat template's turn markers) are False."""
    return loss_mask[:length] + [True] * (length - len(loss_mask))


def trained_versions(token_versions: list[int], loss_mask: list[bool]) -> list[int]:
    """The weight versions of the tokens the loss trains on (all of them where none is trained)."""
    if not loss_mask:  # a single-turn completion: every token is trained
        return token_versions
    trained = [v for v, keep in zip(token_versions, trained_mask(loss_mask, len(token_versions))) if keep]
    return trained or token_versions


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

    A multi-turn trajectory is one Generation too: its output holds the model's turns and, between them, the
    observation tokens (`loss_mask` False, behaviour logprob 0, the version of the model token before them).
    """

    request_id: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    finish_reason: Optional[FinishReason] = None
    loss_mask: list[bool] = field(default_factory=list)
    """See `trained_mask`: empty for a single-turn completion."""

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
    loss_mask: list[bool] = field(default_factory=list)
    """See `trained_mask`: empty for a single-turn completion."""

    @property
    def trained(self) -> list[bool]:
        """Per output token, whether the loss trains on it."""
        return trained_mask(self.loss_mask, len(self.output_ids))

    @property
    def version_span(self) -> staleness.VersionSpan:
        """The oldest and newest weight versions behind its trained tokens: a batch's statistics take each
        sample's once."""
        versions = trained_versions(self.token_versions, self.loss_mask)
        return staleness.VersionSpan(min(versions), max(versions))

    @property
    def oldest_version(self) -> int:
        """The oldest weight version behind a trained token: what staleness and the policy lag count from."""
        return self.version_span.oldest

    @property
    def newest_version(self) -> int:
        return self.version_span.newest

    def staleness(self, current_version: int) -> int:
        """Versions between the trainer's weights and the oldest weights that produced any trained token."""
        return staleness.staleness(current_version, self.oldest_version)
