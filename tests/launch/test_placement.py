"""Placement groups on a two-node Ray cluster with four fake GPUs each (ray.cluster_utils): colocated and
disaggregated, with engines of tensor-parallel size 2; which bundle (node, GPU) each actor gets, where the
engines' vLLM workers land when placed as vLLM's Ray executor places them from the environment the plan
gives the engine (`Slot.worker_environment`), and the trainer rendezvous on rank 0's node IP. The cluster runs in a subprocess of its own, apart from the
test session's shared local cluster."""

import json
import os
import subprocess
import sys

import pytest
from paths import REPO

LAYOUTS = {
    "colocated": {"colocate": True, "num_gpus": 8, "gpus_per_node": 4, "num_rollout_engines": 4,
                  "gpus_per_engine": 2, "trainer_ranks": 8, "gpus_per_trainer_rank": 1},
    "disaggregated": {"num_gpus": 8, "gpus_per_node": 4, "num_rollout_engines": 2, "gpus_per_engine": 2,
                      "trainer_ranks": 4, "gpus_per_trainer_rank": 1},
}


def _probe() -> dict:
    """Run in the subprocess: place probe actors by each plan and report where they landed."""
    import ray
    from ray.cluster_utils import Cluster

    from fasync.config.schema import FasyncConfig
    from fasync.launch.actors import TrainerActor
    from fasync.launch.placement import Placement
    from fasync.launch.plan import resolve

    cluster = Cluster()
    for _ in range(2):
        cluster.add_node(num_cpus=10, num_gpus=4)
    ray.init(address=cluster.address, logging_level="ERROR")
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    class Probe:
        def where(self):
            return {"node": ray.get_runtime_context().get_node_id(), "gpus": ray.get_gpu_ids()}

    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    report = {}
    for name, resources in LAYOUTS.items():
        resolved = resolve(FasyncConfig.model_validate({"resources": resources}))
        plan = resolved.plan
        placement = Placement(plan, timeout_s=120)
        actors = {}
        for role, options, count in (("trainer", plan.trainer_options, resources["trainer_ranks"]),
                                     ("engine", plan.engine_options, resources["num_rollout_engines"])):
            for index in range(count):
                opts = placement.options(options(index))
                opts["num_cpus"] = 0
                actors[f"{role} {index}"] = Probe.options(**opts).remote()
        for index, slot in enumerate(plan.engine_slots):
            # As vLLM's Ray executor does: one worker per bundle VLLM_RAY_BUNDLE_INDICES names, each taking
            # VLLM_RAY_PER_WORKER_GPUS of it.
            env = slot.worker_environment()
            for worker, bundle in enumerate(map(int, env["VLLM_RAY_BUNDLE_INDICES"].split(","))):
                actors[f"engine {index} worker {worker}"] = Probe.options(
                    num_cpus=0, num_gpus=float(env["VLLM_RAY_PER_WORKER_GPUS"]),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement.groups[slot.group], placement_group_bundle_index=bundle)).remote()
        where = {key: ray.get(actor.where.remote()) for key, actor in actors.items()}
        rank0 = TrainerActor.options(**{**placement.options(plan.trainer_options(0)), "num_cpus": 0,
                                        "num_gpus": 0}).remote(resolved, 0, 2)
        address = ray.get(rank0.rendezvous.remote())
        report[name] = {
            "where": where,
            "slots": {f"trainer {i}": [s.group, list(s.bundles)] for i, s in enumerate(plan.trainer_slots)}
            | {f"engine {i}": [s.group, list(s.bundles)] for i, s in enumerate(plan.engine_slots)},
            "bundle_nodes": {group: placement.bundle_nodes(group) for group in placement.groups},
            "rendezvous": address, "rank0_ip": ips[where["trainer 0"]["node"]],
            "summary": plan.summary(),
        }
        for actor in [*actors.values(), rank0]:
            ray.kill(actor)
        placement.remove()
    ray.shutdown()
    cluster.shutdown()
    return report


@pytest.fixture(scope="module")
def report():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
           "RAY_ADDRESS": ""}
    run = subprocess.run([sys.executable, __file__], cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_actor_lands_on_its_bundle_node(report):
    for name, layout in report.items():
        for key, (group, bundles) in layout["slots"].items():
            assert layout["where"][key]["node"] == layout["bundle_nodes"][group][bundles[0]], (name, key)


def test_colocated_rank_and_engine_share_one_gpu_per_bundle(report):
    layout = report["colocated"]
    assert layout["slots"]["trainer 3"] == ["shared", [3]]
    assert layout["slots"]["engine 1"] == ["shared", [2, 3]]  # TP 2: bundles 2 and 3
    for engine in range(4):
        # The engine's actor holds no GPU (its workers do) and sits on its first bundle's node; worker k of
        # engine e shares its GPU with the trainer rank of bundle 2e + k, which CUDA IPC needs.
        assert layout["where"][f"engine {engine}"]["gpus"] == []
        for worker in range(2):
            rank = 2 * engine + worker
            assert layout["where"][f"engine {engine} worker {worker}"] == layout["where"][f"trainer {rank}"]
    gpus = {(w["node"], tuple(w["gpus"])) for key, w in layout["where"].items() if key.startswith("trainer")}
    assert len(gpus) == 8  # eight ranks on eight different GPUs of the two nodes
    assert len({node for node, _ in gpus}) == 2


def test_disaggregated_engines_and_trainers_take_separate_gpus(report):
    layout = report["disaggregated"]
    assert layout["slots"]["engine 1"] == ["engines", [2, 3]]
    held = [(w["node"], tuple(w["gpus"])) for w in layout["where"].values() if w["gpus"]]
    assert len(held) == len(set(held)) == 8  # 4 ranks + 2 engines × 2 workers, no GPU shared
    assert [layout["where"][f"engine {e}"]["gpus"] for e in range(2)] == [[], []]
    assert ("engine 1: engines bundles 2, 3 (node 0 GPU 2, node 0 GPU 3), 1 GPU for each of its 2 vLLM workers"
            in layout["summary"])
    assert "trainer rank 0: trainers bundle 0 (node 1 GPU 0)" in layout["summary"]


def test_trainer_rendezvous_is_rank_zero_node_ip(report):
    for layout in report.values():
        host, port = layout["rendezvous"].removeprefix("tcp://").rsplit(":", 1)
        assert host == layout["rank0_ip"]
        assert 0 < int(port) < 65536


if __name__ == "__main__":
    print(json.dumps(_probe()))
