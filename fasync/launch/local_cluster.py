"""How `fasync train` starts a local Ray cluster of its own: `ray.init` in the context `as_a_run_needs`.

Ray starts the cluster's processes through its private start-up code; these contexts adjust two things there.
Where Ray's code has moved (another Ray release), each leaves the start-up as Ray does it rather than fail.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def as_a_run_needs() -> Iterator[None]:
    """Both adjustments below, for the `ray.init` that starts a run's local cluster."""
    with ray_processes_in_their_own_session(), without_unused_head_processes():
        yield


@contextmanager
def ray_processes_in_their_own_session() -> Iterator[None]:
    """While in effect, the processes Ray starts for a local cluster (`ray.init` starts each of them through
    `ray._private.services.ConsolePopen`) start in a new session, out of the driver's process group, so that a
    scheduler's SIGTERM to the group reaches the driver alone (fasync.launch.signals). Ray's workers are the
    raylet's children, so they are out of it too. Where Ray starts them otherwise (Windows, or a Ray without that
    class), they start as Ray starts them."""
    from ray._private import services

    popen = getattr(services, "ConsolePopen", None)
    if popen is None or sys.platform == "win32":
        yield
        return

    class InOwnSession(popen):
        def __init__(self, *args, **kwargs):
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = InOwnSession
    try:
        yield
    finally:
        services.ConsolePopen = popen


@contextmanager
def without_unused_head_processes() -> Iterator[None]:
    """While in effect, a local cluster leaves out two head processes that a run never uses: the dashboard's
    server, which `include_dashboard=False` still starts (to report usage statistics) and which `ray.init` waits
    for, and the autoscaler's monitor, which has nothing to scale on a cluster of fixed nodes. Together they cost
    about 1 s of `ray.init` and 1.5 s of CPU at every start (docs/benchmarks.md#start-up-and-footprint). On a
    run's own cluster, Ray's state API (`ray list`, `ray.util.state`) then fails to connect and `ray status`
    reports no cluster status; a cluster the run joins (`resources.ray_address`) keeps all of its processes."""
    from ray._private.node import Node

    unused = {name: getattr(Node, name, None) for name in ("start_api_server", "start_monitor")}
    if None in unused.values():
        yield
        return
    for name in unused:
        setattr(Node, name, _not_started)
    try:
        yield
    finally:
        for name, method in unused.items():
            setattr(Node, name, method)


def _not_started(node, **_options) -> None:
    """In place of a head process `without_unused_head_processes` leaves out."""
