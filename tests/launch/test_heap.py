"""`fasync.heap.settle`, which every actor runs once after its first piece of work: the garbage is collected first,
and what survives is left out of later collections. In a process of its own: freezing pytest's heap would outlive
the test."""

import subprocess
import sys

from paths import REPO

SETTLE = """
import gc, weakref
from fasync import heap

class Node:
    pass

garbage = Node()
garbage.cycle = garbage
collected = weakref.ref(garbage)
del garbage
kept = [Node() for _ in range(1000)]
heap.settle()
assert collected() is None, "the cyclic garbage was frozen instead of collected"
assert gc.get_freeze_count() >= len(kept), gc.get_freeze_count()
"""


def test_settle_collects_the_garbage_then_freezes_what_survived():
    subprocess.run([sys.executable, "-c", SETTLE], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)})
