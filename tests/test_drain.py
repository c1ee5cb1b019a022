"""Draining a node (`ectable node drain NAME`, `LocalCluster.drain`): its position handed to a spare with no
failure to detect, while training goes on; every row checked bit for bit against the reference model, parity
against zfec; the drained node stops. The decisions' rules are in test_plans."""
import subprocess
import sys
import time
import zlib

import pytest

import ectable
from ectable import config as cluster_config
from ectable.errors import Error
from ectable.testing import check_parity
from ectable.testing.trainer import Trainer

pytestmark = pytest.mark.timeout(240)

CODES = {"xor": (4, 1), "rs": (4, 2)}


@pytest.mark.parametrize("code", sorted(CODES))
def test_in_process_drain_mid_window(code):
    """Nodes in this process: a node holding writes no parity has yet (mid-window) is drained; its spare takes
    the position; nothing acknowledged is lost, and the drained node is gone."""
    k, r = CODES[code]
    with ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, spares=1, processes=False) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=zlib.crc32(code.encode()))
        trainer.train(rounds=2)
        trainer.train(rounds=1, step=False)
        leaving = cluster.endpoints[2]
        cluster.drain(2)
        assert cluster.endpoints[2] != leaving and not cluster._hosts[leaving].alive
        trainer.check("right after the drain")
        trainer.train(rounds=2)
        trainer.client.wait_recovered(timeout=60)
        assert all(cluster.state(p) == "up" for p in range(k + r)) and cluster.spares_left() == 0
        trainer.client.flush()
        check_parity(cluster, trainer.client)
        trainer.check("recovered")


def drain_command(cluster, tmp_path, name, *extra):
    """`ectable node drain NAME` on this cluster's file, started (not waited for)."""
    toml = tmp_path / "cluster.toml"
    if not toml.exists():
        cluster_config.write_private(str(toml), cluster.describe())
    return subprocess.Popen([sys.executable, "-m", "ectable", "node", "drain", name, "--config", str(toml), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def train_while(trainer, proc, timeout=120.0) -> tuple[str, str]:
    """Train until `proc` exits; its output."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the drain did not finish"
        trainer.train(rounds=1)
    return proc.communicate(timeout=10)


@pytest.mark.parametrize("code", sorted(CODES))
def test_drain_from_the_shell_while_training(code, tmp_path):
    """Node processes: `ectable node drain node-2` while a trainer writes on; the command reports each stage
    and exits 0 once the spare is up and the node stopped; every row equals the reference, parity is exact."""
    k, r = CODES[code]
    with ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, spares=1) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=zlib.crc32(f"shell{code}".encode()))
        trainer.train(rounds=2)
        leaving = cluster.endpoints[2]
        out, err = train_while(trainer, drain_command(cluster, tmp_path, "node-2"))
        lines = out.splitlines()
        assert lines[0] == f"asked node-2 ({leaving}) to leave position 2", (out, err)
        assert lines[-1].endswith("holds position 2, up; the node stopped"), (out, err)
        assert cluster._procs[leaving].wait(10) == 0  # it stopped when told: no kill
        assert cluster.endpoints[2] != leaving and cluster.state(2) == "up" and not cluster.store.drains()
        trainer.check("drained")
        trainer.train(rounds=2)
        trainer.client.flush()
        check_parity(cluster, trainer.client)
        trainer.check("after training on")


def test_a_drain_without_a_spare_waits_and_changes_nothing(tmp_path):
    """No free spare: `drain` gives up after its timeout with the reason, withdraws its request and leaves the
    cluster as it was; the shell command says the same in one line and keeps its request, which is carried out
    once a spare is added (or withdrawn with --cancel)."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, spares=0) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=2000, dim=8, seed=5)
        trainer.train(rounds=2)
        before = (cluster.epoch, cluster.endpoints)
        with pytest.raises(Error, match="not drained within 1 s: no free spare"):
            cluster.drain(1, timeout=1)
        assert not cluster.store.drains() and (cluster.epoch, cluster.endpoints) == before
        proc = drain_command(cluster, tmp_path, "node-1", "--timeout", "1")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1 and err.count("\n") == 1 and "no free spare" in err and "--cancel" in err, err
        assert cluster.store.drains() == {cluster.endpoints[1]} and (cluster.epoch, cluster.endpoints) == before
        leaving = cluster.endpoints[1]
        cluster.add_spare()
        deadline = time.monotonic() + 60
        while cluster.endpoints[1] == leaving or cluster.state(1) != "up":
            assert time.monotonic() < deadline, "the standing drain was not carried out"
            trainer.train(rounds=1)
            cluster.refresh()
        trainer.check("drained once a spare came")
        for args in (["nonesuch"], ["node-0", "--cancel"]):
            done = subprocess.run([sys.executable, "-m", "ectable", "node", "drain", *args, "--config",
                                   str(tmp_path / "cluster.toml")], capture_output=True, text=True, timeout=60)
            assert done.returncode == (1 if args == ["nonesuch"] else 0), done.stderr
            assert "Traceback" not in done.stderr
        deadline = time.monotonic() + 30
        while cluster.store.drains():  # the request is done once the drained node's presence is gone
            assert time.monotonic() < deadline, f"drain requests left: {cluster.store.drains()}"
            time.sleep(0.1)


def test_a_node_killed_while_the_drained_position_rebuilds():
    """rs(4,2), two spares, a slow rebuild: position 1 is drained; while its spare still lacks rows another
    node is SIGKILLed; training goes on; after recovery every record equals the reference and parity is
    exact."""
    with ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=2, rebuild_batch=64,
                              rebuild_share=0.1) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=20_000, dim=8, seed=21)
        client = trainer.client
        trainer.train(rounds=3, batch=2000)
        cluster.drain(1)
        trainer.train(rounds=1, batch=2000)
        assert cluster.state(1) == "rebuilding", "the spare rebuilt too fast for the test"
        client.flush()  # the kill of a node whose window reached only some holders: see test_kills
        cluster.kill(4)
        trainer.train(rounds=2, batch=2000)
        trainer.check("degraded, rebuilding")
        client.wait_recovered(timeout=180)
        assert all(cluster.state(p) == "up" for p in range(6)) and cluster.spares_left() == 0
        trainer.train(rounds=2, batch=2000)
        client.flush()
        check_parity(cluster, client)
        trainer.check("recovered")
