"""Which path a weight sync takes in the drivers (`fasync.drivers.weight_sync.WeightSync`, fully_async's `sync`), by
placement: the `cpu` path hands the trainer's state dict to every engine's `load_weights`; the `ipc` and `nccl`
transports (vLLM on GPUs) make every trainer rank send, rank 0 reporting what each engine serves. The real
driver methods and engine actor class, with recording stand-ins for the actors they call (no Ray, no vLLM, no
GPU); the same check of the served version on both."""

import pytest

from fasync.config.schema import FasyncConfig
from fasync.drivers.weight_sync import WeightSync
from fasync.errors import WeightSyncMismatch
from fasync.weights.sender import SentWeights
from fasync.weights.transport import transport_of

GPU = {"num_gpus": 4, "num_rollout_engines": 2, "gpus_per_engine": 1, "trainer_ranks": 2, "gpus_per_trainer_rank": 1}


class Recorder:
    """The engines' and the trainer group's calls, recorded; what they return is what `Watchdog.get` yields."""

    def __init__(self, engines: int, ranks: int, serve_offset: int = 0):
        self.calls: list[tuple] = []
        self.serve_offset = serve_offset
        self.engines = [self._engine(index) for index in range(engines)]
        self.ranks = list(range(ranks))

    def _engine(self, index):
        recorder = self

        class Load:
            def remote(self, weights, version):
                recorder.calls.append(("load_weights", index, weights, version))
                return ("served", version + recorder.serve_offset, "sum")

        return type("Engine", (), {"load_weights": Load()})()

    # -- the trainer group ------------------------------------------------------------------------------------

    def state_dict_ref(self):
        return "state dict"

    def sent_checksum_ref(self):
        return ("checksum",)

    def send_weights(self, version):
        self.calls.append(("send_weights", version))
        return [("rank 0", version)] + [("rank", rank) for rank in self.ranks[1:]]

    # -- the watchdog -----------------------------------------------------------------------------------------

    def get(self, refs, labels):
        assert len(refs) == len(labels)
        self.waited = [*getattr(self, "waited", []), *zip(refs, labels)]
        return [self._value(ref) for ref in refs]

    def _value(self, ref):
        if ref == ("checksum",):
            return "sum"
        if ref[0] == "served":
            return ref[1], ref[2]
        if ref[0] == "rank 0":
            return SentWeights(ref[1], [(ref[1] + self.serve_offset, None) for _ in self.engines])
        return None


class Run:
    """What fully_async's driver reads of its run: the weight sync and the steps taken."""

    def __init__(self, weights: WeightSync):
        self.weights = weights
        self.step = 0


def run_for(resources: dict, serve_offset: int = 0) -> tuple[WeightSync, Recorder]:
    cfg = FasyncConfig.model_validate({"model": {"path": "/nonexistent"}, "rollout": {"engine": "vllm"},
                                       "resources": resources})
    recorder = Recorder(cfg.resources.num_rollout_engines, cfg.resources.trainer_ranks, serve_offset)
    return WeightSync(transport_of(cfg), recorder.engines, recorder, recorder.get), recorder


def test_cpu_engines_load_the_trainers_state_dict():
    sync, recorder = run_for({"num_rollout_engines": 2})
    sync.publish(steps_taken=0)
    assert sync.version == 1
    assert recorder.calls == [("load_weights", 0, "state dict", 1), ("load_weights", 1, "state dict", 1)]


@pytest.mark.parametrize("colocate", [True, False], ids=["ipc", "nccl"])
def test_gpu_engines_get_the_weights_from_every_trainer_rank(colocate):
    sync, recorder = run_for({**GPU, "colocate": colocate})
    assert sync.transport == ("ipc" if colocate else "nccl")
    sync.publish(steps_taken=0)
    sync.publish(steps_taken=0)
    assert recorder.calls == [("send_weights", 1), ("send_weights", 2)]  # no state dict crosses the host


@pytest.mark.parametrize("resources", [{"num_rollout_engines": 2}, GPU], ids=["cpu", "nccl"])
def test_an_engine_serving_another_version_fails_the_sync(resources):
    sync, _ = run_for(resources, serve_offset=-1)
    with pytest.raises(WeightSyncMismatch, match="engine 0 serves version 0 .* trainer sent version 1"):
        sync.publish(steps_taken=0)


class Rollouter:
    def __init__(self):
        self.calls = []

    @property
    def update_weights(self):
        rollouter = self

        class Call:
            def remote(self, weights, version):
                rollouter.calls.append((weights, version))
                return ("rollouter sync", version)

        return Call()


@pytest.mark.parametrize(("resources", "handed"), [({"num_rollout_engines": 2}, "state dict"),
                                                   (GPU, ("rank 0", 1))], ids=["cpu", "nccl"])
def test_fully_asyncs_rollouter_hands_the_engines_what_the_transport_sent(resources, handed):
    from fasync.drivers.fully_async import FullyAsyncDriver

    sync, recorder = run_for(resources)
    driver = FullyAsyncDriver.__new__(FullyAsyncDriver)
    driver.run, driver.rollouter, driver.pending_sync = Run(sync), Rollouter(), None
    driver.sync()
    assert driver.rollouter.calls == [([handed], 1)]
    # The engines load nothing themselves on the GPU transports: the trainer ranks have sent it.
    assert [call[0] for call in recorder.calls] == (["send_weights"] if sync.transport != "cpu" else [])
    # Finishing the sync checks what the engines serve (through the rollouter), and waits on every other rank's
    # send under its own name: a rank whose send failed fails the sync.
    served = (1, "sum" if sync.transport == "cpu" else None)  # vLLM's engines report no checksum
    driver._wait = lambda call, label: [served] * len(recorder.engines)
    driver.finish_sync()
    assert driver.pending_sync is None
    sends = [(ref, label) for ref, label in getattr(recorder, "waited", []) if "send" in label]
    assert sends == ([] if sync.transport == "cpu" else
                     [(("rank", 1), "trainer rank 1's weight send to the engines (nccl, version 1)")])


def test_an_engine_handed_sent_weights_only_reports_what_it_serves():
    from fasync.launch.actors import EngineActor

    class Served:
        def served_weights(self):
            return 3, None

        def load_weights(self, state_dict, version):
            raise AssertionError("the weights already arrived through the transfer")

    actor = EngineActor.__ray_actor_class__.__new__(EngineActor.__ray_actor_class__)
    actor.engine = Served()
    assert actor.load_weights(SentWeights(3, [(3, None)]), 3) == (3, None)
    with pytest.raises(RuntimeError, match="asked to serve version 4, but the trainer sent version 3"):
        actor.load_weights(SentWeights(3, [(3, None)]), 4)
