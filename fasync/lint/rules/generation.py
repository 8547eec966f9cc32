"""G: generation and sampling — what the rollout engines are asked to produce."""

from __future__ import annotations

from fasync.data.shape import builtin_task_shape
from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.lint.rules import facts


@rule(
    "G001", "dynamic-sampling-drops-all", Severity.ERROR,
    summary="Dynamic sampling would drop every group: their rewards always agree.",
    what="Reports `rollout.dynamic_sampling: true` with one sample per prompt, or with greedy decoding "
    "(`rollout.temperature: 0`), where every completion of a prompt is the same.",
    why="Dynamic sampling drops the prompt groups whose rewards all agree (they have no advantage to learn "
    "from). A group of one sample, or of identical greedy completions, always agrees, so every group is "
    "dropped: the first rollout runs all `max_sampling_rounds` rounds (fully_async: drops that many rollouts' "
    "worth of groups) and the run fails with nothing to train on, after the cluster and the actors started.",
)
def dynamic_sampling_drops_all(cfg, derived):
    rollout = cfg.rollout
    if not rollout.dynamic_sampling:
        return
    if rollout.n_samples_per_prompt == 1:
        why = "with 1 sample per prompt every group's rewards agree"
    elif rollout.temperature == 0:
        why = (f"with `rollout.temperature` 0 (greedy) the {rollout.n_samples_per_prompt} completions of a prompt "
               "are identical, so their rewards agree")
    else:
        return
    yield Finding(
        "rollout.dynamic_sampling",
        f"`rollout.dynamic_sampling` drops groups whose rewards all agree, and {why}: every group is dropped",
        "sample several completions per prompt (`rollout.n_samples_per_prompt` ≥ 2) at a temperature above 0, "
        "or set `rollout.dynamic_sampling: false`",
    )


@rule(
    "G002", "completion-budget-below-answer", Severity.ERROR,
    summary="`rollout.max_new_tokens` is shorter than the built-in task's answers.",
    what="Reports, for a built-in task (`data.task`) with the embedded model, a `rollout.max_new_tokens` "
    "below the width of the task's answers: `data.length` digits (`add`: one more).",
    why="No completion can contain a whole answer. Under `exact_match` every reward is 0, so every advantage "
    "is 0 and nothing is learned; under `partial_match` the reward can never reach 1 and a "
    "`train.target_reward` near 1 is never met. A budget of exactly the answer's width is enough (the "
    "completion then ends at the limit, which the built-in rewards accept); a longer one also asks the model to "
    "learn to stop.",
)
def completion_budget_below_answer(cfg, derived):
    shape = builtin_task_shape(cfg)
    budget = cfg.rollout.max_new_tokens
    if shape is None or budget >= shape.answer_tokens:
        return
    yield Finding(
        "rollout.max_new_tokens",
        f"the {shape.task} task's answers are {shape.answer_tokens} tokens long (`data.length` {cfg.data.length}) "
        f"but `rollout.max_new_tokens` is {budget}: no completion can hold a whole answer",
        f"set `rollout.max_new_tokens` to at least {shape.answer_tokens}, the answers' width",
    )


@rule(
    "G003", "vllm-temperature-above-two", Severity.ERROR,
    summary="A sampling temperature vLLM rejects.",
    what=f"Reports `rollout.temperature` above {facts.VLLM_MAX_TEMPERATURE:g} with `rollout.engine: vllm`.",
    why="vLLM refuses sampling parameters with a temperature above 2, so every generate call of the run fails, "
    "after the cluster, the trainer and the engines have started. (The torch engine samples at any temperature.)",
)
def vllm_temperature_above_two(cfg, derived):
    rollout = cfg.rollout
    if rollout.engine == "vllm" and rollout.temperature > facts.VLLM_MAX_TEMPERATURE:
        yield Finding(
            "rollout.temperature",
            f"`rollout.temperature` is {rollout.temperature:g}, but vLLM accepts at most "
            f"{facts.VLLM_MAX_TEMPERATURE:g}",
            f"set `rollout.temperature` to {facts.VLLM_MAX_TEMPERATURE:g} or less, or use `rollout.engine: hf`",
        )


@rule(
    "G004", "overlong-buffer-exceeds-budget", Severity.ERROR,
    summary="An overlong buffer as long as the completion budget: every completion is penalised.",
    what="Reports `reward.overlong_buffer` at or above `rollout.max_new_tokens`.",
    why="DAPO's overlong shaping lowers the reward of a completion that runs into the last `overlong_buffer` "
    "tokens of the budget, linearly down to −`overlong_penalty` at the budget. A buffer as long as the budget "
    "starts the penalty at the first token: every completion, right or wrong, pays in proportion to its length, "
    "so the run learns mostly to be short, and the reward it reports no longer matches what it optimises.",
)
def overlong_buffer_exceeds_budget(cfg, derived):
    buffer, budget = cfg.reward.overlong_buffer, cfg.rollout.max_new_tokens
    if buffer is not None and buffer >= budget:
        yield Finding(
            "reward.overlong_buffer",
            f"`reward.overlong_buffer` {buffer} is not shorter than `rollout.max_new_tokens` {budget}: the penalty "
            "starts at the first token, so every completion is penalised for its length",
            f"set `reward.overlong_buffer` below {budget} (DAPO: 4,096 of 20,480 tokens, a fifth)",
        )
