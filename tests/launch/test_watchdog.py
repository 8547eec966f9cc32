"""The watchdog names the actor that died, on a real Ray cluster: a call to one actor (the rollouter) that
fails because another one it calls (an engine) died names the engine, not the actor called."""

import time

import pytest

from fasync.errors import ActorFailed
from fasync.launch.faults import Watchdog


@pytest.fixture
def actors(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Engine:
        def generate(self) -> str:
            return "tokens"

    @ray.remote(num_cpus=0)
    class Rollouter:
        def __init__(self, engine):
            self.engine = engine

        def snapshot(self) -> str:
            return ray.get(self.engine.generate.remote())

    engine = Engine.remote()
    rollouter = Rollouter.remote(engine)
    assert ray.get(rollouter.snapshot.remote()) == "tokens"
    watchdog = Watchdog(timeout_s=None)
    watchdog.name_actors([engine, rollouter], ["engine 0", "the rollouter"])
    yield ray, watchdog, engine, rollouter
    for handle in (engine, rollouter):
        ray.kill(handle)


@pytest.mark.parametrize("killed", ["engine 0", "the rollouter"])
def test_a_failed_call_names_the_actor_that_died_whether_called_or_called_by_it(actors, killed):
    """The engine killed: the rollouter's call fails through it; the rollouter killed: the call itself fails."""
    ray, watchdog, engine, rollouter = actors
    dead = {"engine 0": engine, "the rollouter": rollouter}[killed]
    ray.kill(dead)
    wait_until_dead(ray, dead)
    with pytest.raises(ActorFailed) as failure:
        watchdog.fetch(rollouter.snapshot.remote(), "the rollouter's snapshot")
    assert str(failure.value).startswith(f"the rollouter's snapshot failed: {killed} died"), failure.value


def wait_until_dead(ray, handle, timeout_s: float = 30) -> None:
    """`ray.kill` only asks: a call made just after it can still reach the actor and succeed (one did in a full
    run of the suite)."""
    deadline = time.monotonic() + timeout_s
    while (left_s := deadline - time.monotonic()) > 0:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=left_s)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:  # neither dead nor answering by the deadline: said below
            break
        time.sleep(0.05)
    raise AssertionError(f"the actor was still alive {timeout_s} s after ray.kill")
