"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE: `ci` (make test; derandomized, so CI is repeatable),
`dev` (the default: random, explores new cases) and `thorough`; and the etcd servers of the membership tests."""
import os
import sys
import threading
import time
import traceback

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=150, stateful_step_count=50, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=100, stateful_step_count=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, stateful_step_count=80, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# the longest files first: `make test` runs the files on two workers (pytest-xdist, a file at a time), and a long one
# taken last would leave the other worker idle meanwhile
FIRST = ("test_sim.py", "test_statemachine.py", "test_processes.py", "test_netns.py")


def pytest_collection_modifyitems(items):
    rank = {name: n for n, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest keep their order


@pytest.fixture(scope="module", autouse=True)
def no_thread_left():
    """A test module ends every thread it started (a window timer, a map reader, a lease keeper left running
    goes on reading the clock and using the CPU for the rest of the pytest worker)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 10
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive() and not _lives_on(t)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    frames = sys._current_frames()
    assert not left, "threads left running:\n" + "\n".join(
        f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident])[-4:])}" for t in left if t.ident in frames)


def _lives_on(thread: threading.Thread) -> bool:
    """pyzmq's collector of zero-copy frames: one per process, started by the first such send."""
    return type(thread).__module__ == "zmq.utils.garbage"


def _etcd():
    from ectable.membership import EtcdServer
    server = EtcdServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd_server():
    """A one-member etcd shared by a test module (stopped, and its data removed, after the module)."""
    yield from _etcd()


@pytest.fixture
def own_etcd():
    """An etcd of the test's own, for tests that stop, pause or restart it."""
    yield from _etcd()
