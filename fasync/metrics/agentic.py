"""What a rollout's (drain's) trajectories did, for its rows: turns, tool calls and errors, tool and environment
time, the masked share of their tokens, truncation and the weight versions each spans (`agent/*` in the registry)."""

from __future__ import annotations

from collections.abc import Sequence

from fasync.staleness import VersionSpan

TOOL_ERROR_KINDS = ("bad_call", "unknown_tool", "timeout", "exception", "crash", "output_limit", "forbidden", "other")
"""The kinds `agent/tool_errors_<kind>` counts: the multi-turn loop's and the python sandbox's
(`fasync.rollout.tools`, `fasync.rollout.sandbox`); a `ToolError` of any other kind counts as `other`."""


def agentic_stats(groups, spans: Sequence[VersionSpan]) -> dict:
    """The `agent/*` values of a rollout's groups, given each of their samples' `VersionSpan` in order; none when
    its groups are not agentic (no outcomes)."""
    pairs, spans_of_pairs, offset = [], [], 0
    for group in groups:
        paired = list(zip(group.samples, group.outcomes))
        pairs += paired
        spans_of_pairs += spans[offset:offset + len(paired)]
        offset += len(group.samples)
    if not pairs:
        return {}
    stats = [outcome.stats for _, outcome in pairs]
    errors = dict.fromkeys(TOOL_ERROR_KINDS, 0)
    for trajectory in stats:
        for kind, count in trajectory.tool_errors.items():
            errors[kind if kind in errors else "other"] += count
    tokens = sum(len(sample.output_ids) for sample, _ in pairs)
    masked = sum(not trained for sample, _ in pairs for trained in sample.trained)
    spans = [span.width for span in spans_of_pairs]
    return {
        "agent/turns_mean": sum(s.turns for s in stats) / len(stats),
        "agent/turns_max": max(s.turns for s in stats),
        "agent/tool_calls": sum(s.tool_calls for s in stats),
        "agent/tool_errors": sum(errors.values()),
        **{f"agent/tool_errors_{kind}": count for kind, count in errors.items()},
        "agent/tool_time_s": sum(s.tool_time_s for s in stats),
        "agent/env_time_s": sum(s.env_time_s for s in stats),
        "agent/masked_token_fraction": masked / max(tokens, 1),
        "agent/truncated": sum(s.truncated for s in stats),
        "agent/version_span_mean": sum(spans) / len(spans),
        "agent/version_span_max": max(spans),
        "agent/multi_version_fraction": sum(span > 0 for span in spans) / len(spans),
    }
