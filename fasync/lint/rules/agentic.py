"""T: agentic rollouts — trajectories of several turns, environments and tools (docs/agentic.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fasync.data.shape import builtin_task_shape
from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.memory import model_dims


def trajectory_budget(rollout) -> int:
    """Tokens after the prompt one trajectory may take: `rollout.max_trajectory_tokens`, or every turn's completion
    and observation budgets."""
    return rollout.max_trajectory_tokens or rollout.max_turns * (rollout.max_new_tokens + rollout.max_observation_tokens)


@rule(
    "T001", "trajectory-exceeds-context", Severity.WARNING,
    summary="A trajectory's turns do not fit the model's context.",
    what="Reports, with `rollout.env`, a prompt (a built-in task's, as the embedded tokenizer feeds it; 0 when it "
    "cannot be known before the run) plus the trajectory budget above the model's context. The budget is "
    "`rollout.max_trajectory_tokens`, or `rollout.max_turns` × (`rollout.max_new_tokens` + "
    "`rollout.max_observation_tokens`).",
    why="The multi-turn loop never passes the model's context: a trajectory that reaches it ends truncated, so the "
    "later turns `max_turns` allows never happen, and a task that needs them cannot be solved. The budget in "
    "effect is the context, not the keys.",
)
def trajectory_exceeds_context(cfg, derived):
    rollout = cfg.rollout
    dims = model_dims(cfg) if rollout.env is not None else None
    if dims is None or dims.max_context is None:
        return
    shape = builtin_task_shape(cfg)
    prompt = shape.prompt_tokens if shape is not None else 0
    budget = trajectory_budget(rollout)
    if prompt + budget <= dims.max_context:
        return
    source = ("`rollout.max_trajectory_tokens` " f"{budget}" if rollout.max_trajectory_tokens else
              f"{rollout.max_turns} turns × ({rollout.max_new_tokens} + {rollout.max_observation_tokens}) tokens")
    key = "model.max_seq_len" if cfg.model.path is None else "rollout.max_turns"
    yield Finding(
        key,
        f"a trajectory may take {prompt} prompt tokens and {source}, {prompt + budget} in all, but the model's "
        f"context is {dims.max_context}: trajectories end truncated before their last turns",
        f"set `rollout.max_trajectory_tokens` to {dims.max_context - prompt}, lower `rollout.max_turns` or the "
        "per-turn budgets" + (f", or set `model.max_seq_len` to {prompt + budget}" if cfg.model.path is None else ""),
    )


@rule(
    "T002", "tool-turns-span-versions", Severity.INFO,
    summary="Without partial rollout, a trajectory's turns still come from several weight versions.",
    what="Reports `mode: fully_async` with `rollout.env` or `rollout.function` and `async.partial_rollout: false`.",
    why="`partial_rollout: false` lets each engine call finish under the weights it started with, but a "
    "trajectory makes one call per turn: a weight sync between two turns (while it waits on a tool or its "
    "environment, which never holds a sync up) gives its next turn the new weights. Its tokens then span "
    "versions as with partial rollout, and its staleness counts from its first trained token, so long "
    "trajectories under a tight `async.max_weight_staleness` are dropped as stale more often.",
)
def tool_turns_span_versions(cfg, derived):
    if cfg.mode == "fully_async" and cfg.rollout.agentic and not cfg.async_.partial_rollout:
        yield Finding(
            "async.partial_rollout",
            "trajectories of several turns span weight versions even with `async.partial_rollout: false`: a sync "
            "between two turns gives the next turn the new weights",
            "nothing to change if that is intended; watch `agent/version_span_max` and `dropped_stale`, and keep "
            "`async.max_weight_staleness` above the versions a trajectory spans (docs/agentic.md)",
        )


TOOL_CALL_MARKERS = {"hermes": "<tool_call>"}
"""`rollout.tool_parser` → what a chat template that writes calls in that format holds."""
_TOOL_ROLE = re.compile(r"""["']tool["']""")


def chat_template(model_path: str) -> str | None:
    """The chat template `model_path` ships, as text: tokenizer_config.json's `chat_template` (a string, or named
    templates: `tool_use`, else `default`, else the first) or chat_template.jinja; None when there is none or it
    cannot be read. Read without transformers: the check path imports no heavy package."""
    directory = Path(model_path)
    try:
        template = json.loads((directory / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        template = None
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("tool_use") or named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template
    try:
        return (directory / "chat_template.jinja").read_text()
    except OSError:
        return None


@rule(
    "T003", "chat-template-cannot-express-tools", Severity.WARNING,
    summary="The model's chat template cannot express the multi-turn loop's tool calls or results.",
    what="Reports, with `rollout.env` and `model.path`, a chat template (tokenizer_config.json's `chat_template` "
    "or chat_template.jinja, read as text) that has no `tool` role, so tool results have no place in it; or "
    "one that renders tools but writes their calls in another format than `rollout.tool_parser` reads "
    "(`hermes`: `<tool_call>`).",
    why="The multi-turn loop answers a turn's tool calls with `tool` messages rendered through the chat template. "
    "A template without the role raises on them, and the trajectory's run stops, or renders nothing for them, "
    "and the model never reads a tool's answer. A template that writes calls another way (Llama 3's JSON "
    "after `<|python_tag|>`, Mistral's `[TOOL_CALLS]`) belongs to a model tuned to emit that format, which "
    "the parser does not read: its calls stay plain text and no tool runs.",
)
def chat_template_cannot_express_tools(cfg, derived):
    rollout = cfg.rollout
    if rollout.env is None or cfg.model.path is None:
        return
    template = chat_template(cfg.model.path)
    if template is None:
        return
    if not _TOOL_ROLE.search(template):
        yield Finding(
            "model.path",
            "the model's chat template has no `tool` role: the multi-turn loop's tool results cannot be rendered "
            "for the model to read",
            "use a model whose chat template renders `tool` messages (Qwen2.5, Llama 3.1, Hermes), or add the role "
            "to the template in the model's tokenizer_config.json",
        )
    elif TOOL_CALL_MARKERS[rollout.tool_parser] not in template:
        yield Finding(
            "rollout.tool_parser",
            f"the model's chat template writes tool calls without `{TOOL_CALL_MARKERS[rollout.tool_parser]}`, the "
            f"format `rollout.tool_parser: {rollout.tool_parser}` reads: the model's own calls would stay plain text",
            "use a model tuned for the parser's format, or a rollout function (`rollout.function`) that reads the "
            "model's format itself",
        )
