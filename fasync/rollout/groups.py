"""Prompt groups: the unit every driver admits, generates, scores and trains on."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fasync.config.schema import FasyncConfig
from fasync.data.rewards import score
from fasync.rollout.types import Generation, GroupId, Sample, SamplingParams


@dataclass
class PromptGroup:
    group_id: GroupId
    prompt: str
    label: str
    requests: list[Generation]
    """n_samples_per_prompt completions of the same prompt, filled in by the engines."""
    samples: list[Sample] = field(default_factory=list)
    prompt_index: int = 0
    """The prompt's index in the dataset (`PromptDataset.location` names its file and line)."""

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def finished(self) -> bool:
        return all(req.finished for req in self.requests)

    @property
    def oldest_version(self) -> int:
        return min(s.oldest_version for s in self.samples)

    @property
    def response_length(self) -> float:
        """Mean completion tokens generated so far (what the ledger buckets drops by)."""
        return sum(len(req.output_ids) for req in self.requests) / max(len(self.requests), 1)

    @property
    def oldest_token_version(self) -> int | None:
        """The oldest weight version behind any token generated so far; None before the first token."""
        return min((v for req in self.requests for v in req.token_versions), default=None)


def sampling_params(cfg: FasyncConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    rollout = cfg.rollout
    return SamplingParams(
        max_new_tokens=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop_token_ids=stop_token_ids,
    )


class GroupFactory:
    """Draws prompts, turns them into generation requests and scores what comes back."""

    def __init__(self, cfg: FasyncConfig, tokenizer, dataset, reward_fn):
        self.n = cfg.rollout.n_samples_per_prompt
        self.tokenizer = tokenizer
        self.dataset = dataset
        self.reward_fn = reward_fn
        self.reward_name = cfg.reward.function
        self.rng = random.Random(cfg.data.seed)
        self._next_draw = 0
        self._next_request = 0
        self.params = sampling_params(cfg, tuple(tokenizer.stop_token_ids))

    @property
    def cursor(self) -> int:
        """Prompts drawn so far: the data cursor."""
        return self._next_draw

    def state_dict(self) -> dict:
        """The data cursor and the sampling order: the draw stream's state and the id counters."""
        return {"rng": self.rng.getstate(), "draws": self._next_draw, "request_ids": self._next_request}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self._next_draw, self._next_request = state["draws"], state["request_ids"]

    def new_groups(self, count: int) -> list[PromptGroup]:
        """The next `count` prompts drawn, as groups of requests."""
        groups = [self._group(GroupId(self._next_draw + i), index)
                  for i, index in enumerate(self.dataset.sample_indices(count, self.rng))]
        self._next_draw += len(groups)
        return groups

    def again(self, group: PromptGroup) -> PromptGroup:
        """A fresh group for the same prompt (regenerating one that became too stale): the next attempt."""
        return self._group(GroupId(group.group_id.draw, group.group_id.attempt + 1), group.prompt_index)

    def _group(self, group_id: GroupId, index: int) -> PromptGroup:
        problem = self.dataset.problems[index]
        prompt_ids = list(self.tokenizer.format_prompt(problem.prompt))
        requests = [Generation(request_id=self._next_request + i, prompt_ids=prompt_ids) for i in range(self.n)]
        self._next_request += self.n
        return PromptGroup(group_id, problem.prompt, problem.label, requests, prompt_index=index)

    def score(self, group: PromptGroup) -> PromptGroup:
        stops = set(self.tokenizer.stop_token_ids)
        group.samples = []
        for gen in group.requests:
            completion_ids = [t for t in gen.output_ids if t not in stops]
            completion = self.tokenizer.decode(completion_ids)
            group.samples.append(
                Sample(
                    group_id=group.group_id,
                    prompt_ids=gen.prompt_ids,
                    output_ids=gen.output_ids,
                    behaviour_logprobs=gen.logprobs,
                    token_versions=gen.token_versions,
                    reward=self._reward(completion, group),
                    label=group.label,
                    completion=completion,
                    finish_reason=gen.finish_reason,
                )
            )
        return group

    def _reward(self, completion: str, group: PromptGroup) -> float:
        where = f"prompt {group.prompt_index} ({self.dataset.location(group.prompt_index)})"
        return score(self.reward_fn, self.reward_name, completion, group.label, where)


def build_factory(resolved) -> GroupFactory:
    """The prompts, tokenizer and reward of a run, each checked here in the driver (the dataset against the
    tokenizer and the model's context, the weight files against config.json) so that bad input stops the run
    before Ray starts; raises ConfigurationError. `resolved`: the config with the model's dimensions
    (`fasync.launch.plan.Resolved`)."""
    from fasync.data import build_dataset
    from fasync.data.datasets import check_prompts
    from fasync.data.rewards import build_reward
    from fasync.model import build_tokenizer

    cfg, dims = resolved.config, resolved.model_dims
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    dataset = build_dataset(cfg.data)
    check_prompts(dataset, tokenizer, dims.max_context if dims is not None else None)
    if cfg.model.path is not None:
        from fasync.model.weights import check_weights

        check_weights(cfg.model.path)
    return GroupFactory(cfg, tokenizer, dataset, build_reward(cfg.reward))


def zero_variance(group: PromptGroup) -> bool:
    rewards = [s.reward for s in group.samples]
    return max(rewards) - min(rewards) < 1e-9
