"""miles (radixark/miles): slime's flags, and a fully async rollout with a staleness bound."""

from __future__ import annotations

from fasync.frameworks import slime
from fasync.frameworks.common import CONVERTED, SAME, Expressed, Framework

ROWS = slime.ROWS + [
    ("fully_async", "mode", CONVERTED, "miles's fully async rollout is `mode: fully_async`."),
    ("max_weight_staleness", "async.max_weight_staleness", SAME,
     "both count weight versions from the oldest version of a group; miles recycles stale groups, fasync drops "
     "them (or regenerates them: async.stale_policy)."),
    ("async_max_concurrent_samples", "async.max_concurrent_samples", SAME),
    ("async_data_buffer_capacity_factor", "async.max_queue_size", CONVERTED,
     "a multiple of rollout_batch_size; fasync counts groups: floor(factor × rollout_batch_size)."),
    ("async_unused_samples_handler", "async.stale_policy", CONVERTED, "retry is regenerate, drop is drop."),
]


def express(cfg, derived) -> Expressed:
    out = slime.express_flags(FRAMEWORK, cfg, derived)
    if cfg.mode == "fully_async":
        bound = cfg.async_.max_weight_staleness
        out.put("fully-async", True, "mode fully_async")
        if bound is None:
            out.missing.append("no staleness bound: miles's max_weight_staleness is always a number")
        else:
            out.put("max-weight-staleness", bound, "async.max_weight_staleness")
        if not cfg.async_.partial_rollout:
            out.missing.append("fully_async without partial rollout: miles' pause modes (retract, in_place) both "
                               "continue requests in flight across a weight update")
    return out


FRAMEWORK = Framework("miles", "miles", ROWS, slime.import_into, express, rollout_checkpoint_keys=("save_interval",),
                      data_keys=slime.FRAMEWORK.data_keys, reward_keys=slime.FRAMEWORK.reward_keys,
                      rewards=slime.REWARDS, modes=slime.MODES, defaults=slime.DEFAULTS + (
                          " miles: `--pause-generation-mode` retract (the default) and in_place both continue "
                          "requests in flight across a weight update, so a fully-async miles run has "
                          "`async.partial_rollout: true`; without `--max-weight-staleness` its staleness is "
                          "unbounded."))
