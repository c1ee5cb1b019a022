"""The recovery benchmark's phases: each iteration counted in one phase only, each process's CPU in its role."""
import os
import subprocess
import sys

import numpy as np

from bench.common import descendants
from bench.recovery import cpu_phases, phases


def test_the_failover_iteration_is_not_also_counted_as_rebuilding():
    times = np.array([1.0] * 10 + [5.0] + [2.0] * 3 + [1.0] * 4)
    rebuilding = np.array([False] * 10 + [True] * 4 + [False] * 4)  # the failover iteration finds the node rebuilding
    before, first, during, after = phases(times, rebuilding, kill_at=10)
    assert before.tolist() == [1.0] * 5 and first == 5.0
    assert during.tolist() == [2.0] * 3 and after.tolist() == [1.0] * 4


def test_cpu_phases_counts_each_process_in_its_role():
    me, survivors, victim, spare, etcd = os.getpid(), (10, 11), 12, 13, 20

    def cpu(trainer, a, b, killed, replacement, store):
        out = {me: ("trainer", trainer), survivors[0]: ("node", a), survivors[1]: ("node", b),
               replacement[0]: ("node", replacement[1]), etcd: ("etcd", store)}
        if killed is not None:
            out[victim] = ("node", killed)
        return out

    marks = [(5, 0.0, cpu(0.0, 0.0, 0.0, 0.0, (spare, 0.0), 0.0)),
             (15, 1.0, cpu(0.5, 0.2, 0.4, 0.6, (spare, 0.01), 0.1)),  # the kill: the victim is still there
             (16, 1.5, cpu(0.6, 0.25, 0.45, None, (spare, 0.02), 0.12)),  # the failover iteration done
             (26, 3.5, cpu(1.6, 0.65, 0.85, None, (spare, 1.02), 0.32)),  # the rebuild ended
             (36, 4.5, cpu(2.1, 0.85, 1.05, None, (spare, 1.22), 0.42))]
    before, rebuilding, after = cpu_phases(marks, victim, spare)
    assert before == ["before", 10, 100.0, 50.0, 30.0, 60.0, 10.0, 181.0, 1.81]  # the idle spare: in "all" only
    assert rebuilding == ["rebuilding", 10, 200.0, 100.0, 40.0, 100.0, 20.0, 300.0, 1.5]
    assert after == ["after", 10, 100.0, 50.0, 20.0, 20.0, 10.0, 120.0, 1.2]


def test_descendants_of_a_process_gone_meanwhile_are_none():
    """A node killed while the benchmark walks the process tree: it is listed by its parent, then gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc entry is gone
    assert descendants(child.pid) == []
    assert child.pid not in descendants(os.getpid())
