"""The recovery benchmark's phases: each iteration counted in one phase only."""
import numpy as np

from bench.recovery import phases


def test_the_failover_iteration_is_not_also_counted_as_rebuilding():
    times = np.array([1.0] * 10 + [5.0] + [2.0] * 3 + [1.0] * 4)
    rebuilding = np.array([False] * 10 + [True] * 4 + [False] * 4)  # the failover iteration finds the node rebuilding
    before, first, during, after = phases(times, rebuilding, kill_at=10)
    assert before.tolist() == [1.0] * 5 and first == 5.0
    assert during.tolist() == [2.0] * 3 and after.tolist() == [1.0] * 4
