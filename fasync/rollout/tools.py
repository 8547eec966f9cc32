"""Tool calls: reading them from the model's text (the parser `rollout.tool_parser` names) and running them at once,
each with a timeout, every failure one counted tool error that the model reads as the tool's answer."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fasync.rollout.trajectory import TrajectoryStats


class ToolError(Exception):
    """A tool call that failed in a known way; `kind` is what `agent/tool_errors_<kind>` counts."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    error: str | None = None
    """Why the call could not be read (`bad_call`): the model reads it as the tool's answer."""


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen), in order; `arguments` may
    also be a JSON string of the object."""
    calls = []
    for body in _HERMES.findall(text):
        try:
            call = json.loads(body)
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
                raise ValueError('expected {"name": "...", "arguments": {...}}')
            calls.append(ToolCall(call["name"], arguments))
        except ValueError as error:
            calls.append(ToolCall("", {}, f"cannot read the tool call {body.strip()[:80]!r}: {error}"))
    return calls


TOOL_PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes}
"""`rollout.tool_parser` → the function that reads a model turn's tool calls."""


def is_async(tool) -> bool:
    """Whether calling `tool` gives a coroutine: an `async def` function, or an object with an async `__call__`."""
    return inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(type(tool).__call__)


async def run_tool_calls(calls: list[ToolCall], tools: dict[str, Callable[..., Any]], timeout_s: float,
                         stats: TrajectoryStats) -> list[dict]:
    """Run `calls` at once, each within `timeout_s`; the tool messages answering them, in order. A tool is a
    function of the call's arguments returning text, `async def` or not (a plain one runs in a thread, which a
    timeout cannot stop: code that may hang belongs in the sandboxed `python` tool or an async tool). A failure is
    counted in `stats.tool_errors` by kind (`bad_call`, `unknown_tool`, `timeout`, `exception` or a `ToolError`'s
    own) and answered with an error message, never raised."""
    async def one(call: ToolCall) -> dict:
        started = time.monotonic()
        try:
            if call.error is not None:
                raise ToolError("bad_call", call.error)
            tool = tools.get(call.name)
            if tool is None:
                raise ToolError("unknown_tool", f"no tool named {call.name!r} (tools: {', '.join(tools) or 'none'})")
            try:
                pending = tool(**call.arguments) if is_async(tool) else \
                    asyncio.to_thread(tool, **call.arguments)
            except TypeError as error:
                raise ToolError("bad_call", f"{call.name}: {error}") from error
            content = str(await asyncio.wait_for(pending, timeout_s))
        except ToolError as error:
            stats.tool_errors[error.kind] += 1
            content = f"error: {error}"
        except asyncio.TimeoutError:
            stats.tool_errors["timeout"] += 1
            content = f"error: {call.name} took longer than {timeout_s:g} s and was stopped"
        except Exception as error:  # noqa: BLE001 - a tool's failure is the model's observation, never the run's
            stats.tool_errors["exception"] += 1
            content = f"error: {call.name} raised {type(error).__name__}: {error}"
        finally:
            stats.tool_time_s += time.monotonic() - started
        return {"role": "tool", "content": content}

    stats.tool_calls += len(calls)
    return list(await asyncio.gather(*(one(call) for call in calls)))
