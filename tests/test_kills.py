"""Real SIGKILLs of node processes, checked bit for bit against the plain reference model (SPEC: with up to r
nodes killed at any moment, mid-window and mid-recovery included, every row read afterwards, through degraded
reads and after recovery, equals a failure-free run of the same requests, weights and optimizer state both)."""
import time
import zlib

import pytest

import ectable
from ectable.testing import check_parity
from ectable.testing.reference_trainer import Trainer

pytestmark = pytest.mark.timeout(240)

MOMENTS = ("mid-window", "after-step", "after-flush")


def bring_to(trainer, moment):
    """Acknowledged writes, then the cluster left at `moment`: mid-window (no step since the last writes),
    right after step() (window closing, deltas in flight), or after flush() (parity settled)."""
    trainer.train(rounds=2)
    trainer.train(rounds=1, step=False)
    if moment == "after-step":
        trainer.client.step()
    elif moment == "after-flush":
        trainer.client.step()
        trainer.client.flush()


# which positions die, per code and moment: neighbours and non-neighbours, parity of the same stripes or not
VICTIMS = {("rs", "mid-window"): (1, 2), ("rs", "after-step"): (0, 3), ("rs", "after-flush"): (5, 2),
           ("xor", "mid-window"): (2,), ("xor", "after-step"): (0,), ("xor", "after-flush"): (4,)}


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("code,spares", [("rs", 2), ("rs", 0), ("xor", 1), ("xor", 0)])
def test_r_nodes_sigkilled_back_to_back_lose_nothing(code, spares, moment):
    """rs(4,2) on 6 nodes loses two nodes at once, xor(4,1) on 5 nodes one, at each moment of a window. Every
    row is read (degraded, or from spares still rebuilding) and equals the reference; more writes go through
    the parity (no spare) or to the spares; with spares the cluster recovers, and parity is exact."""
    k, r = (4, 2) if code == "rs" else (4, 1)
    with ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, spares=spares) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=zlib.crc32(f"{code}{spares}{moment}".encode()))
        bring_to(trainer, moment)
        for victim in VICTIMS[code, moment]:
            cluster.kill(victim)
        trainer.check(f"right after killing {VICTIMS[code, moment]} {moment}")
        trainer.train(rounds=2)
        trainer.check("after writing on")
        if spares:
            trainer.client.wait_recovered(timeout=90)
            assert all(cluster.state(p) == "up" for p in range(k + r))
            trainer.train(rounds=2)
            trainer.check("recovered")
        else:
            assert trainer.client.status()["degraded"] == sorted(VICTIMS[code, moment])
        trainer.client.flush()
        check_parity(cluster, trainer.client)
        trainer.check("after flush")


def rebuilding_with_rows_left(client, p, timeout=20.0) -> int:
    """Wait until position p is rebuilding (a spare stands there) and return the rows it still lacks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.status()
        node = status["nodes"][p]
        if node.get("role") == "rebuilding" and p in status["recovery"]["rebuilding"]:
            return node["rebuild_missing"]
        time.sleep(0.05)
    raise AssertionError(f"no spare rebuilding position {p} after {timeout} s")


@pytest.mark.parametrize("second", ["another-position", "the-rebuilding-spare"])
def test_a_node_killed_while_a_spare_rebuilds(second):
    """rs(4,2), two spares, a table whose slow rebuild (64 rows a round, 10% of the time) takes a while: node A
    dies; training goes on while its spare rebuilds; then, while that spare still lacks rows, node B at
    another position dies (or the rebuilding spare itself); training goes on; after recovery every record
    equals the reference and parity is exact. Only the trainer is a writer that replacements wait for."""
    rows = 20_000
    with ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=2, rebuild_batch=64,
                              rebuild_share=0.1) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=rows, dim=8, seed=11 if second == "another-position" else 12)
        client = trainer.client
        trainer.train(rounds=3, batch=2000)
        a, b = 1, 4
        # Every delta acknowledged before each kill: a node killed while its last window had reached only some
        # parity holders gets the laggards' rows invalidated, which can leave stripes it shares with the other
        # lost position short of k slots (docs/design.md, "Known limits, open"; the simulation and the
        # after-step kills of test_r_nodes_sigkilled_back_to_back kill with deltas in flight).
        client.flush()
        cluster.kill(a)
        trainer.train(rounds=2, batch=2000)
        left = rebuilding_with_rows_left(client, a)
        assert left > 500, f"the spare at {a} rebuilt too fast for the test: {left} rows left"
        victim = b if second == "another-position" else a
        spare = cluster.node_pids()[a]
        client.flush()
        cluster.kill(victim)
        trainer.train(rounds=3, batch=2000, step=False)  # three batches in one window, then with steps
        trainer.train(rounds=2, batch=2000)
        if second == "another-position":  # the first spare was still rebuilding, and is still the same process
            assert cluster.node_pids()[a] == spare
        else:
            assert cluster.node_pids()[a] != spare
        trainer.check("degraded, rebuilding")
        # the rebuilders (clients of the cluster in the spares' processes) never wrote: no replacement may
        # wait for them as writers (a killed spare's rebuilder held the next spare's clients until its lease ran out)
        assert cluster.store.writers() == {cluster.writer}
        trainer.recovered(cluster, batch=2000)
