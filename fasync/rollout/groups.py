"""Prompt groups: the unit every driver admits, generates, scores and trains on."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fasync.config.schema import FasyncConfig
from fasync.data.rewards import RewardInput
from fasync.data.scoring import RewardFailed, RewardRunner
from fasync.rollout.trajectory import Outcome, SavedTrajectory
from fasync.rollout.types import Generation, GroupId, Sample, SamplingParams, trained_mask, trained_versions


@dataclass
class PromptGroup:
    group_id: GroupId
    prompt: str | list[dict[str, str]]
    """Text, or chat messages (`fasync.data.tasks.Problem.prompt`)."""
    label: str
    requests: list[Generation]
    """n_samples_per_prompt completions of the same prompt, filled in by the engines."""
    samples: list[Sample] = field(default_factory=list)
    prompt_index: int = 0
    """The prompt's index in the dataset (`PromptDataset.location` names its file and line)."""
    outcomes: list[Outcome] = field(default_factory=list)
    """Agentic rollouts (`fasync.rollout.agent`): each finished trajectory's reward and stats, as `requests`."""
    in_progress: dict[int, SavedTrajectory] = field(default_factory=dict)
    """Agentic rollouts in flight: each trajectory's last point to go on from (`fasync.rollout.agent.Task.save`), by
    its request's id; a checkpoint keeps them and a resumed run's trajectories go on from them."""
    reward_failure: str | None = None
    """Why the reward could not score one of its completions (`reward.on_error: drop`): the group is dropped."""
    admitted_version: int | None = None
    """fully_async: the engines' version when the rollouter admitted the group; no token of it is older."""

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
        """The oldest weight version behind any trained token generated so far (a trajectory in flight: as far as
        its last saved point); None before the first token."""
        requests = [self.in_progress[req.request_id].request if req.request_id in self.in_progress else req
                    for req in self.requests]
        return min((v for req in requests if req.token_versions
                    for v in trained_versions(req.token_versions, req.loss_mask)), default=None)

    def oldest_possible_version(self, current: int) -> int:
        """In flight: the oldest version that produced, or may yet produce, one of its trained tokens: the version
        it was admitted under, else (a group from an older checkpoint) its oldest token so far, else `current` (the
        engines' versions only grow)."""
        return next((v for v in (self.admitted_version, self.oldest_token_version) if v is not None), current)


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

    def __init__(self, cfg: FasyncConfig, tokenizer, dataset, rewards: RewardRunner, agent=None):
        self.agent = agent
        """Agentic rollouts: the `fasync.rollout.agent.AgentRunner` that builds each group's trajectories."""
        self.n = cfg.rollout.n_samples_per_prompt
        self.tokenizer = tokenizer
        self.dataset = dataset
        self.rewards = rewards
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
                  for i, index in enumerate(self.dataset.draw(self._next_draw, count, self.rng))]
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
        self.score_all([group])
        return group

    def score_all(self, groups: list[PromptGroup]) -> None:
        """The groups' samples. A trajectory's reward is its rollout function's or environment's where it gave
        one, else the reward's score of the model's text (its trained tokens, stop tokens left out); every
        completion to score is scored together (`reward.concurrency` at a time). A group with a completion the
        reward could not score gets its `reward_failure` (`reward.on_error: drop`)."""
        stops = set(self.tokenizer.stop_token_ids)
        items, wheres, given = [], [], []
        for group in groups:
            problem = self.dataset.problems[group.prompt_index]
            where = f"prompt {group.prompt_index} ({self.dataset.location(group.prompt_index)})"
            for gen, reward in zip(group.requests, [outcome.reward for outcome in group.outcomes] or
                                   [None] * group.size):
                trained = [t for t, kept in zip(gen.output_ids, trained_mask(gen.loss_mask, len(gen.output_ids)))
                           if kept]
                completion = self.tokenizer.decode([t for t in trained if t not in stops])
                given.append((RewardInput(completion, problem, len(trained), gen.finish_reason), reward))
                if reward is None:
                    items.append(given[-1][0])
                    wheres.append(where)
        scored = iter(self.rewards.score(items, wheres) if items else [])
        outcomes = iter(given)
        for group in groups:
            group.samples, group.reward_failure = [], None
            for gen in group.requests:
                item, reward = next(outcomes)
                if reward is None:
                    reward = next(scored)
                if isinstance(reward, RewardFailed):
                    group.reward_failure = group.reward_failure or str(reward)
                    reward = 0.0
                group.samples.append(Sample(
                    group_id=group.group_id,
                    prompt_ids=gen.prompt_ids,
                    output_ids=gen.output_ids,
                    behaviour_logprobs=gen.logprobs,
                    token_versions=gen.token_versions,
                    reward=reward,
                    label=group.label,
                    completion=item.completion,
                    finish_reason=gen.finish_reason,
                    loss_mask=gen.loss_mask,
                ))


def build_factory(resolved, reward_search_path: tuple[str, ...] = ()) -> GroupFactory:
    """The prompts, tokenizer and reward of a run, each checked here in the driver (the dataset against the
    tokenizer and the model's context, the weight files against config.json) so that bad input stops the run
    before Ray starts; raises ConfigurationError. `resolved`: the config with the model's dimensions
    (`fasync.launch.plan.Resolved`); a `module:function` reward is also looked for in `reward_search_path`
    (`fasync.data.rewards.reward_search_path`)."""
    from fasync.data import build_dataset
    from fasync.data.datasets import check_prompts
    from fasync.data.held_out import training_part
    from fasync.model import build_tokenizer

    cfg, dims = resolved.config, resolved.model_dims
    tokenizer = build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)
    dataset = check_prompts(training_part(build_dataset(cfg.data), cfg), tokenizer,
                            dims.max_context if dims is not None else None, cfg.data)
    if cfg.model.path is not None:
        from fasync.model.weights import check_weights

        check_weights(cfg.model.path)
    agent = None
    if cfg.rollout.agentic:
        from fasync.data.rewards import make_importable
        from fasync.rollout.agent import AgentRunner, import_rollout_function
        from fasync.rollout.env_loop import EnvironmentRollout

        make_importable(reward_search_path)  # the function or environment beside the config, as a reward
        function = import_rollout_function(cfg.rollout.function) if cfg.rollout.function is not None else \
            EnvironmentRollout(cfg, dims.max_context if dims is not None else None)
        agent = AgentRunner(cfg, tokenizer, function)
    return GroupFactory(cfg, tokenizer, dataset, RewardRunner(cfg.reward, reward_search_path), agent)


def zero_variance(group: PromptGroup) -> bool:
    rewards = [s.reward for s in group.samples]
    return max(rewards) - min(rewards) < 1e-9
