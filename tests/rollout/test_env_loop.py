"""The built-in multi-turn loop over the example environments, without Ray: a scripted 'model' reads the
conversation so far and answers, so that the loop's turns, tool calls, rewards, masks and truncation show."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import yaml
from local_actors import LocalMethod
from paths import REPO
from sections import tiny_config

from fasync.launch.plan import resolve
from fasync.rollout.groups import build_factory
from fasync.rollout.tools import ToolCall, parse_hermes, run_tool_calls
from fasync.rollout.trajectory import TrajectoryStats
from fasync.wire import pack, unpack

pytestmark = pytest.mark.usefixtures("agentic_examples")


class ScriptedModel:
    """An engine whose every turn is `policy(conversation so far as text)`, then the turn's end; cut at the
    call's token budget like a real engine."""

    def __init__(self, tokenizer, policy):
        self.tokenizer, self.policy = tokenizer, policy
        self.end = tokenizer.stop_token_ids[-1]
        self.generate = LocalMethod(self._generate)

    def _generate(self, packed, params, token_budget=None):
        out = []
        for req in unpack(packed):
            text = self.tokenizer.decode(req.prompt_ids + req.output_ids)
            tokens = (self.tokenizer.encode(self.policy(text)) + [self.end])[:params.max_new_tokens]
            out.append(replace(req, output_ids=tokens, logprobs=[-1.0] * len(tokens), token_versions=[0] * len(tokens),
                               finish_reason="stop" if tokens[-1] == self.end else "length"))
        return pack(out)


def bisect(conversation: str) -> str:
    """Halve the range the feedback so far leaves."""
    low, high = 0, 9
    guesses = conversation.split("<|assistant|>")[1:]
    for turn in guesses:
        guess, _, feedback = turn.partition("<|user|>")
        if "more" in feedback:
            low = int(guess) + 1
        elif "less" in feedback:
            high = int(guess) - 1
    return str((low + high) // 2)


def play(env: str, policy, model=None, **rollout):
    cfg = tiny_config(model=model or {"max_seq_len": 64}, data={"task": "reverse", "length": 1},
                      rollout={"batch_size": 4, "n_samples_per_prompt": 2, "env": env, "max_observation_tokens": 8,
                               **rollout})
    factory = build_factory(resolve(cfg))
    groups = factory.agent.generate([ScriptedModel(factory.tokenizer, policy)], factory.new_groups(4), factory.params)
    for group in groups:
        factory.score(group)
    return factory, [sample for group in groups for sample in group.samples], \
        [outcome for group in groups for outcome in group.outcomes]


def test_a_player_that_bisects_always_finds_the_number():
    factory, samples, outcomes = play("guess_number:GuessNumber", bisect, max_turns=4, max_new_tokens=2,
                                        max_observation_tokens=11)
    assert all(sample.reward == 1.0 for sample in samples)
    assert all(sample.finish_reason == "stop" and not outcome.stats.truncated for sample, outcome in
               zip(samples, outcomes))
    for sample, outcome in zip(samples, outcomes):
        model = factory.tokenizer.decode([t for t, keep in zip(sample.output_ids, sample.trained) if keep])
        observations = factory.tokenizer.decode([t for t, keep in zip(sample.output_ids, sample.trained) if not keep])
        assert len(model) == outcome.stats.turns <= 4  # one digit a turn (the turn's end reads as nothing)
        assert observations.count("<|user|>") == outcome.stats.turns - 1


def test_a_player_that_ignores_the_feedback_runs_out_of_turns():
    factory, samples, outcomes = play("guess_number:GuessNumber", lambda text: "5", max_turns=3, max_new_tokens=2)
    for sample, outcome in zip(samples, outcomes):
        won = sample.reward == 1.0
        assert outcome.stats.truncated is not won and sample.finish_reason == ("stop" if won else "length")
        assert outcome.stats.turns == (1 if won else 3)


def middle_of_the_last_range(conversation: str) -> str:
    """Read only the last message: the middle of the range it names (`pick 0-9`, `more 5-9`)."""
    low, high = conversation.rsplit("<|user|>", 1)[1].split("<|")[0].split()[-1].split("-")
    return str((int(low) + int(high)) // 2)


def test_the_last_message_names_the_range_left_so_its_middle_always_wins():
    _, samples, outcomes = play("guess_number:GuessNumber", middle_of_the_last_range, max_turns=4, max_new_tokens=2,
                                max_observation_tokens=11)
    assert all(sample.reward == 1.0 for sample in samples)
    assert all(outcome.stats.turns <= 4 for outcome in outcomes)


def call_then_answer(conversation: str) -> str:
    """Call the tool, then answer with what it returned (the digit, written three times)."""
    from lookup import CALL

    if "<|tool|>" not in conversation:
        return CALL
    return conversation.rsplit("<|tool|>", 1)[1].split("<|")[0]


def call_then_miss(conversation: str) -> str:
    """Call the tool, then answer with another digit than it returned."""
    if "<|tool|>" not in conversation:
        return call_then_answer(conversation)
    return str((int(call_then_answer(conversation)[0]) + 1) % 10)


def play_lookup(policy, added_tokens: bool = True):
    """The lookup example as examples/agentic/lookup.yaml sets it up: its turn budgets, and its added tokens unless
    `added_tokens` is False (the vocabulary as built in, where the call is 17 tokens)."""
    example = yaml.safe_load((REPO / "examples" / "agentic" / "lookup.yaml").read_text())
    rollout = {key: example["rollout"][key] for key in ("max_turns", "max_new_tokens", "max_observation_tokens")}
    if not added_tokens:
        rollout["max_new_tokens"] = 32
    return play("lookup:Lookup", policy, model={"max_seq_len": 64,
                                                "added_tokens": example["model"]["added_tokens"] if added_tokens else []},
                **rollout)


def test_the_lookup_task_is_solved_through_its_tool_only():
    _, samples, outcomes = play_lookup(call_then_answer)
    assert all(sample.reward == 1.0 for sample in samples)
    assert all(outcome.stats.tool_calls == 1 and outcome.stats.turns == 2 for outcome in outcomes)
    _, samples, outcomes = play_lookup(lambda text: "1")
    assert all(outcome.stats.tool_calls == 0 and outcome.stats.turns == 1 for outcome in outcomes)
    assert all(sample.reward == 0.0 for sample in samples)


def test_the_lookup_value_sits_at_one_place_before_the_answer():
    # The call fills its turn's budget exactly and the tool answers one digit three times, so every trajectory has
    # one layout: the digit is at the same places before the answer in each.
    from lookup import COPIES

    factory, samples, _ = play_lookup(call_then_answer)
    tokenizer = factory.tokenizer
    assert len({len(sample.output_ids) for sample in samples}) == 1
    for sample in samples:
        answer = sample.trained.index(True, sample.trained.index(False))  # the first trained token after the call
        # then `<|end|><|assistant|>` open the answer's turn
        copies = sample.output_ids[answer - 2 - COPIES:answer - 2]
        assert tokenizer.decode(copies) == tokenizer.decode(copies[:1]) * COPIES
        assert tokenizer.decode(copies[:1]).isdigit() and sample.output_ids[answer] == copies[0]


@pytest.mark.parametrize("added_tokens", [True, False], ids=["example-vocabulary", "built-in-vocabulary"])
def test_the_lookup_reward_credits_the_call_s_format_and_the_exact_digit_as_documented(added_tokens):
    from lookup import CALL

    factory, _, _ = play_lookup(call_then_answer, added_tokens)
    call_tokens = len(factory.tokenizer.encode(CALL))
    assert call_tokens == (1 if added_tokens else 17)
    # A first turn that is no readable call: 0.2 × the share of the call's tokens it begins with (none of the
    # example's one token, 16 of the built-in vocabulary's 17), and the end.
    _, samples, outcomes = play_lookup(lambda text: CALL[:-len("</tool_call>")], added_tokens)
    # approx: the environment multiplies in another order, which may round the last bit differently.
    assert all(sample.reward == pytest.approx(0.0 if added_tokens else 0.2 * 16 / 17) for sample in samples)
    assert all(outcome.stats.turns == 1 and outcome.stats.tool_calls == 0 for outcome in outcomes)
    # The call, then another digit: 0.2 for the call alone.
    _, samples, _ = play_lookup(call_then_miss, added_tokens)
    assert all(sample.reward == pytest.approx(0.2) for sample in samples)
    # The call, then the digit with something after it (the tool's three copies, and more): the answer is the
    # turn's first character, so 1.
    _, samples, _ = play_lookup(lambda text: CALL if "<|tool|>" not in text else call_then_answer(text) + "!",
                                added_tokens)
    assert all(sample.reward == 1.0 for sample in samples)


def test_the_token_budget_truncates_a_trajectory():
    _, samples, outcomes = play("guess_number:GuessNumber", lambda text: "5", max_turns=8, max_new_tokens=2,
                                max_trajectory_tokens=12)
    for sample, outcome in zip(samples, outcomes):
        assert len(sample.output_ids) <= 12
        assert outcome.stats.truncated or sample.reward == 1.0


def test_hermes_tool_calls_are_read_in_order_and_a_bad_one_is_named():
    calls = parse_hermes('a<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
                         '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call><tool_call>{oops</tool_call>')
    assert [(c.name, c.arguments) for c in calls[:2]] == [("f", {"x": 1}), ("g", {"y": 2})]
    assert calls[2].error.startswith("cannot read the tool call '{oops'")
    assert parse_hermes("no calls here") == []


def test_every_tool_failure_is_one_counted_error_the_model_reads():
    async def slow():
        await asyncio.sleep(10)

    async def broken():
        raise RuntimeError("boom")

    async def echo(text):
        return text

    stats = TrajectoryStats()
    calls = [ToolCall("slow", {}), ToolCall("broken", {}), ToolCall("nope", {}), ToolCall("echo", {"wrong": 1}),
             ToolCall("", {}, "cannot read"), ToolCall("echo", {"text": "hi"})]
    messages = asyncio.run(run_tool_calls(calls, {"slow": slow, "broken": broken, "echo": echo}, 0.2, stats))
    assert [m["content"].split(":")[0] for m in messages] == ["error"] * 5 + ["hi"]
    assert stats.tool_errors == {"timeout": 1, "exception": 1, "unknown_tool": 1, "bad_call": 2}
    assert stats.tool_calls == 6


@pytest.mark.parametrize("spec, message", [
    ("guess_number:Step", "needs an `async def reset` method"),
    ("guess_number:nothing", "has no attribute 'nothing'"),
])
def test_an_environment_that_is_not_one_is_a_configuration_error(spec, message):
    from fasync.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=message):
        build_factory(resolve(tiny_config(rollout={"env": spec})))


def test_a_turn_cut_at_its_budget_is_closed_untrained_and_still_counts_as_the_model_s_turn():
    factory, samples, outcomes = play("guess_number:GuessNumber", lambda text: "55555", max_turns=2, max_new_tokens=2)
    end = factory.tokenizer.stop_token_ids[-1]
    for sample, outcome in zip(samples, outcomes):
        first_turn = sample.output_ids[:3]
        assert factory.tokenizer.decode(first_turn[:2]) == "55" and first_turn[2] == end
        assert sample.trained[:3] == [True, True, False]
        # The environment read the cut turn: its first character is the guess.
        assert sample.reward == float(outcome.stats.turns == 1)
