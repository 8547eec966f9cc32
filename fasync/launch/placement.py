"""The plan's placement groups on the live Ray cluster, each actor's scheduling options, and the trainer
ranks' rendezvous address (fasync/launch/plan.py says what goes where)."""

from __future__ import annotations

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fasync.errors import ConfigurationError
from fasync.launch.plan import ResourcePlan

READY_TIMEOUT_S = 60.0


class Placement:
    """The plan's placement groups, reserved together before any actor starts."""

    def __init__(self, plan: ResourcePlan, timeout_s: float = READY_TIMEOUT_S):
        self.plan = plan
        self.groups = {spec.name: placement_group(list(spec.bundles), strategy=spec.strategy, name="")
                       for spec in plan.groups}
        try:
            ray.get([group.ready() for group in self.groups.values()], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.remove()
            wanted = ", ".join(f"{spec.name}: {len(spec.bundles)} × {spec.bundles[0]}" for spec in plan.groups)
            raise ConfigurationError(
                f"resources: the cluster cannot hold the plan's placement groups ({wanted}) within "
                f"{timeout_s:g} s; it has {ray.cluster_resources().get('GPU', 0):g} GPUs (`fasync check --preflight` "
                "compares them with the plan)") from None

    def options(self, plan_options: dict) -> dict:
        """Ray `.options(...)` for an actor from the plan's `engine_options`/`trainer_options`."""
        options = dict(plan_options)
        slot = options.pop("slot", None)
        if slot is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.groups[slot.group], placement_group_bundle_index=slot.bundles[0],
                placement_group_capture_child_tasks=True)
        return options

    def bundle_nodes(self, group: str) -> list[str]:
        """The node id each bundle of `group` was reserved on."""
        table = placement_group_table(self.groups[group])["bundles_to_node_id"]
        return [table[index] for index in sorted(table)]

    def remove(self) -> None:
        for group in self.groups.values():
            remove_placement_group(group)
        self.groups = {}


def rendezvous_address(port: int) -> str:
    """`tcp://` this node's IP and `port`: run on rank 0's node, so that ranks on other nodes dial it there."""
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"
