"""Adding a node (`ectable node add NAME`, `LocalCluster.add_node`): the cluster is laid out again over one
more position while a trainer writes on; every row checked bit for bit against the reference model, parity
against zfec, a node killed right after is survived, and checkpoint chains go on across it."""
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import ectable
from ectable import config as cluster_config
from ectable.cluster import plans
from ectable.config import ClusterConfig
from ectable.errors import InvalidRequest
from ectable.protocol.messages import ErrorCode, Freeze, HandOver, TakeOver, Write
from ectable.storage import relayout
from ectable.testing import check_parity
from ectable.testing.reference_trainer import Trainer

pytestmark = pytest.mark.timeout(240)

CODES = {"xor": (4, 1), "rs": (4, 2)}


@pytest.mark.parametrize("processes", [False, True])
@pytest.mark.parametrize("code", sorted(CODES))
def test_a_node_added_mid_window_keeps_every_row_and_every_failure_survivable(code, processes):
    """A node is added while writes no parity has yet sit in the nodes' windows; right after, every record equals
    the reference, the parity of the new layout is exact, and the cluster then survives r nodes SIGKILLed (or
    dropped) at once, rebuilt by spares under the new layout."""
    k, r = CODES[code]
    with ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, spares=0, processes=processes) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=5000, dim=8, seed=zlib.crc32(f"grow{code}".encode()))
        trainer.train(rounds=2)
        trainer.train(rounds=1, step=False)
        old = list(cluster.endpoints)
        assert cluster.add_node() == k + r
        assert cluster.config.nodes == k + r + 1 and list(cluster.endpoints[: k + r]) == old
        assert all(cluster.state(p) == "up" for p in range(k + r + 1))
        trainer.check("right after the node was added")
        trainer.train(rounds=2)
        trainer.client.flush()
        check_parity(cluster, trainer.client)
        for _ in range(r):
            cluster.add_spare()
        for p in range(1, 1 + r):
            cluster.kill(p)
        trainer.train(rounds=1)
        trainer.check("after r failures in the new layout")
        trainer.recovered(cluster)


def add_command(cluster, toml, name) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ectable", "node", "add", name, "--config", str(toml)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_node_add_from_the_shell_while_training(tmp_path):
    """Node processes with CURVE keys: a spare is started and listed (`ectable spare add`), then `ectable node add`
    runs while a trainer writes on, so writes meet frozen nodes and are planned again by the new layout; the
    command exits 0 once the spare holds the new position and lists it as a node in the file; nothing is lost,
    parity is exact, and a node started from that file by name finds its place."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=0, keys=True) as cluster:
        toml = tmp_path / "cluster.toml"
        cluster_config.write_private(str(toml), cluster.describe())
        trainer = Trainer(cluster.connect(), "t", rows=20_000, dim=8, seed=3)
        trainer.train(rounds=2, batch=2000)
        endpoint = cluster.add_spare()
        listed = subprocess.run([sys.executable, "-m", "ectable", "spare", "add", "extra", endpoint, "--config",
                                 str(toml)], capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        stale = tmp_path / "stale.toml"  # a copy whose `node add` timed out before the grow ended
        stale.write_text(toml.read_text())
        proc = add_command(cluster, toml, "extra")
        deadline = time.monotonic() + 120
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the node was not added"
            trainer.train(rounds=1, batch=2000, step=False)
            trainer.client.step()
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, (out, err)
        assert out.splitlines()[0].startswith("asked to add extra") and "holds position 5, up" in out, out
        data = cluster_config.load(str(toml))
        assert data["cluster"]["nodes"] == 6 and data["nodes"]["endpoints"][5] == endpoint
        assert cluster_config.find_node(data, "extra") == (5, endpoint) and not data["nodes"]["spares"]
        assert cluster.endpoints[5] == endpoint and not cluster.store.grows()
        trainer.check("added while training")
        trainer.train(rounds=2, batch=2000)
        trainer.client.flush()
        check_parity(cluster, trainer.client)
        again = subprocess.run([sys.executable, "-m", "ectable", "node", "add", "extra", "--config", str(toml)],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and again.stderr.count("\n") == 1 and "listed as a node" in again.stderr
        late = subprocess.run([sys.executable, "-m", "ectable", "node", "add", "extra", "--config", str(stale)],
                              capture_output=True, text=True, timeout=60)  # run again once added: it says so
        assert late.returncode == 0 and "holds position 5, up" in late.stdout, (late.stdout, late.stderr)
        assert cluster_config.find_node(cluster_config.load(str(stale)), "extra") == (5, endpoint)


def test_checkpoint_chains_go_on_across_a_grow(tmp_path):
    """An incremental chain taken before a grow goes on after it (pieces name rows by global id): the checkpoint
    after the grow restores, into another cluster, exactly the rows the cluster held then."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=4000, dim=8, seed=4)
        client = trainer.client
        trainer.train(rounds=2)
        path = str(tmp_path / "chain")
        client.checkpoint(path, policy="full")
        client.checkpoint_wait()
        trainer.train(rounds=1)
        cluster.add_node()
        trainer.train(rounds=1)
        number = client.checkpoint(path, policy="incremental")
        manifest = client.checkpoint_wait()
        assert manifest["kind"] == "incremental"
        held = client.get("t", np.arange(4000))
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as other:
        fresh = other.connect()
        assert fresh.restore(path, number).number == number
        assert np.array_equal(fresh.get("t", np.arange(4000)), held)


def test_a_grow_that_fails_changes_nothing_and_is_tried_again():
    """Nodes in this process: the map change that ends a grow fails once (as when another change comes first):
    every node is thawed and keeps its identity and layout, the spare drops the node it was given and is free
    again, nothing is lost, and a drain asked too waits for the next step (the thaw changed the map); the next
    steps add the spare and drain the node to the other spare. A node that is not frozen takes no new node."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=2, processes=False) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=9)
        trainer.train(rounds=2)
        decider, sources = cluster.decider, [cluster.source(p) for p in range(5)]
        swap, failed = decider._swap, []

        def swap_fails_once(old, new, guard=()):
            if not failed and new.nodes != old.nodes:
                failed.append(new)
                return None
            return swap(old, new, guard)
        decider._swap = swap_fails_once
        spare, other = sorted(e for e, h in cluster._hosts.items() if h.node is None)
        leaving = cluster.endpoints[2]
        cluster.store.request_grow(spare)
        cluster.store.request_drain(leaving)
        assert decider.step() and failed  # tried, and failed at the map change: the thaw wrote the map
        assert not decider.handovers_failed  # no drain begun on the map from before the thaw
        hosts = [cluster._hosts[e] for e in cluster.endpoints]
        assert not any(h.frozen or h.pending for h in hosts) and cluster._hosts[spare].pending is None
        assert [h.node.source for h in hosts] == sources and cluster.store.read_map().nodes == 5
        trainer.train(rounds=1)
        trainer.check("after a grow that failed")
        refused = hosts[0].handle(TakeOver(state={}, config={}, token=decider.token).header(), [])[0]
        assert "not frozen" in refused["message"]
        cluster.decide()  # tried again
        assert cluster.config.nodes == 6 and cluster.endpoints[5] == spare and not cluster.store.grows()
        assert not set(sources) & {cluster.source(p) for p in range(6)}  # every position under a new identity
        assert cluster.endpoints[2] == other and not cluster.store.drains()  # the spare not asked to be added
        trainer.train(rounds=1)
        trainer.check("after the grow and the drain")


def test_a_spare_left_holding_a_node_by_a_decider_that_died_drops_it():
    """Nodes in this process: a decider dies between giving every node and the spare their new nodes and the
    map change (its thaw never comes). The next step thaws the nodes and tells the spare the map, and it drops
    what it was given; a node given with an older map's epoch is refused; the grow is then done."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, processes=False) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=9)
        trainer.train(rounds=1)
        decider, swap, thaw = cluster.decider, cluster.decider._swap, cluster.decider._thaw
        decider._swap = lambda old, new, guard=(): None if new.nodes != old.nodes else swap(old, new, guard)
        decider._thaw = lambda *a, **kw: False  # it died before thawing
        spare = next(e for e, h in cluster._hosts.items() if h.node is None)
        cluster.store.request_grow(spare)
        epoch = cluster.store.read_map().epoch
        decider.step()
        host = cluster._hosts[spare]
        assert host.pending is not None and host.given_at == epoch
        assert all(cluster._hosts[e].frozen for e in cluster.endpoints)
        older = host.handle(TakeOver(state={}, config={}, epoch=epoch - 1, token=decider.token).header(), [])[0]
        assert "given or frozen since" in older["message"] and host.pending is not None
        decider._swap, decider._thaw = swap, thaw
        decider.step()  # a decider that comes next
        assert host.pending is None and not any(cluster._hosts[e].frozen for e in cluster.endpoints)
        trainer.train(rounds=1)
        cluster.decide()
        assert cluster.config.nodes == 6 and cluster.endpoints[5] == spare
        trainer.train(rounds=1)
        trainer.check("after the grow")


def test_relayout_refuses_states_that_do_not_fit():
    """The layout is built only into more positions, from every node's state, one identity each, from nodes that
    hold the same tables."""
    config = ClusterConfig(nodes=6, code="xor", k=4, r=1)
    table = {"spec": {"name": "a", "num_rows": 10, "dim": 2, "seed": 0}}
    with pytest.raises(InvalidRequest, match="more positions"):
        relayout.Relayout(config, 6)
    with pytest.raises(InvalidRequest, match="every one of 5"):
        relayout.Relayout(config, 5).finish([({}, [])] * 4, ["s"] * 6)
    with pytest.raises(InvalidRequest, match="different tables"):
        relayout.Relayout(config, 5).finish([({"shards": []}, []), ({"shards": [table]}, [])] * 2
                                            + [({"shards": []}, [])], ["s"] * 6)


def test_a_frozen_node_answers_the_retry_of_a_write_it_applied():
    """A write applied just before a grow froze its node, whose answer was lost: its retry is answered as a
    duplicate (before and after the node's state was taken), never `moved`, which would have the client send it
    again by the new layout, to a node that does not know it (applied twice). A new write is refused."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        host, token = cluster._hosts[cluster.endpoints[0]], cluster.decider.token
        ids = client._table("t")[1].rows_on(0)[:3]

        def write(cseq):
            header = Write(parts=[["t", "apply_gradient"]], cid="w/1", cseq=cseq, node=host.node.source).header()
            return host.handle(header, [ids, np.ones((3, 2), np.float32)])[0]
        first = write(1)
        host.handle(Freeze(epoch=cluster.epoch, deltas=True, token=token).header(), [])
        assert write(1) == {**first, "duplicate": True}
        assert write(2)["error"] == ErrorCode.MOVED
        cluster._deliver()
        assert host.handle(HandOver(token=token).header(), [])[0].get("state")  # handed over
        assert write(1)["duplicate"] and write(2)["error"] == ErrorCode.MOVED
        np.testing.assert_array_equal(host.node.shards["t"].records[:3, :2], np.full((3, 2), np.float32(-0.01)))  # once


def test_a_write_applied_just_before_a_grow_whose_answer_was_lost_is_applied_once():
    """A write is applied by node 1, then the cluster is laid out again before its answer comes (lost), so its
    retry meets the node of the new layout (a new identity: refused). The client tells from the map what the
    retired node applied (`Map.retired`) and does not send it again by the new layout: every row took one step.
    (Before, it was applied twice: simulation seed xor 266.)"""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=100, dim=2, init="zeros")
        host = cluster._hosts[cluster.endpoints[1]]
        handle, applied = host.handle, []

        def answer_lost(header, arrays, key=None):
            reply = handle(header, arrays, key)
            if header.get("op") == "write" and not applied:
                applied.append(reply)
                cluster.add_node()
                return handle(header, arrays, key)  # the retry, its first answer lost
            return reply
        host.handle = answer_lost
        ids = np.arange(100)
        client.apply_gradient("t", ids, np.ones((100, 2), np.float32))
        assert "seq" in applied[0][0] and cluster.config.nodes == 6
        np.testing.assert_array_equal(client.get("t", ids), np.full((100, 2), np.float32(-0.01)))


def test_a_grow_waits_for_a_writer_that_may_still_replay_late(tmp_path):
    """Node processes: a second trainer's put sits in node 1's open window when node 1 is SIGKILLed; that trainer
    stays idle, so the replacement stops waiting for its replay (10 s) and serves. A grow asked for then waits
    (the replacement counts the trainer as `late`); the trainer's next call replays the put, and only then is the
    node added. Without the wait the grow laid the cluster out first, and the put was lost."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=2, window_seconds=3600) as cluster:
        toml = tmp_path / "cluster.toml"
        cluster_config.write_private(str(toml), cluster.describe())
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=5)
        trainer.train(rounds=1)
        idle = ectable.connect(str(toml))  # a trainer of its own: another writer
        idle.create_table("u", num_rows=400, dim=4)
        ids = np.flatnonzero(idle._table("u")[1].data_node(np.arange(400)) == 1)
        values = np.arange(ids.size * 4, dtype=np.float32).reshape(-1, 4)
        idle.put("u", ids, values)  # in node 1's open window only
        killed = cluster.endpoints[1]
        cluster.kill(1)
        deadline = time.monotonic() + 120
        while True:  # node 1 failed over; its replacement waits out the idle writer's replay, then rebuilds
            trainer.train(rounds=1)
            m = cluster.store.read_map()
            if m.endpoints[1] != killed and m.states[1] == "up" and \
                    (cluster.store.presence().get(m.endpoints[1]) or {}).get("late") == 1:
                break
            assert time.monotonic() < deadline, "node 1 was not replaced, or its replacement waits for the writer"
        spare = next(e for e in cluster.store.presence() if e not in m.endpoints)
        cluster.store.request_grow(spare)
        assert "1 writer(s) may still replay" in plans.grow_waits(cluster.store.read_map(), cluster.store.presence())
        time.sleep(2)  # the deciders step several times meanwhile
        assert cluster.store.read_map().nodes == 5 and spare in cluster.store.grows()
        np.testing.assert_array_equal(idle.get("u", ids), values)  # its next call replays the put (within LATE_WAIT)
        deadline = time.monotonic() + 120
        while cluster.store.read_map().nodes == 5:
            assert time.monotonic() < deadline, "the node was not added"
            time.sleep(0.1)
        cluster.refresh()
        assert cluster.endpoints[5] == spare
        np.testing.assert_array_equal(idle.get("u", ids), values)
        trainer.train(rounds=1)
        trainer.check("after the grow")
        idle.close()


def test_a_node_replaced_right_after_a_grow_gets_every_writers_check_in():
    """Nodes in this process: a node added, and one SIGKILLed and replaced before the trainer's next call. The
    trainer follows the new layout and checks in with every node, the replacement too: it waits for no one,
    counts no writer as late, and the next grow is not held up."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=2, processes=False) as cluster:
        trainer = Trainer(cluster.connect(), "t", rows=3000, dim=8, seed=13)
        trainer.train(rounds=1)
        cluster.add_node()
        cluster.kill(2)
        cluster.decide()  # the spare replaces node 2 before the trainer looks
        replacement = cluster._hosts[cluster.store.read_map().endpoints[2]].node
        assert replacement.replay_from == {trainer.client.cluster.writer_id()}
        trainer.train(rounds=1)
        assert replacement.replay_from is None and not replacement.late
        assert trainer.client.cluster.writer_id() in replacement.replayed
        trainer.check("after a grow and a replacement")


@pytest.mark.parametrize("in_parity", [False, True])
def test_a_writer_idle_past_late_wait_is_told_the_grow_lost_its_writes(in_parity):
    """Simulated (real node, client and decider code; 300 s of simulated time): a second writer's put sits in node
    1's open window when node 1 is killed; that writer stays idle, so its replacement serves without its replay
    and, after LATE_WAIT, no longer counts it as late. A grow then lays the cluster out again, and the put is
    gone. The writer's next call raises WritesLost naming the rows (before, it read the old values silently);
    its later calls work, and its rows written again stand. `in_parity`: the trainer's flush closed node 1's
    window before the kill, so the put is in parity and rebuilt: nothing is lost, and nothing is raised."""
    from ectable import clock
    from ectable.client import Client
    from ectable.errors import WritesLost
    from ectable.storage.node import LATE_WAIT
    from ectable.testing.sim.scenario import Simulation

    s = Simulation(2, "xor")
    s.config, s.spares = ClusterConfig(5, "xor", 4, 1, window_seconds=3600.0), 2
    s.faults.drop = s.faults.duplicate = s.faults.spike = s.faults.kill_at_message = 0.0
    world = s.world
    with clock.use(world):
        try:
            with world.acting("client"):
                trainer = Client(s.start())
                trainer.create_table("t", num_rows=400, dim=4, init="uniform", seed=1)
                idle = Client(s.cluster_for("idle"))  # a cluster object of its own: a second process
                idle.create_table("u", num_rows=400, dim=4)
                ids = np.flatnonzero(idle._table("u")[1].data_node(np.arange(400)) == 1)
                values = np.arange(ids.size * 4, dtype=np.float32).reshape(-1, 4) + 1
                before = idle.get("u", ids)
                idle.put("u", ids, values)  # in node 1's open window only
                if in_parity:
                    trainer.flush(timeout=60)  # closes every node's window: the put's delta reaches the parity
                dead = s.store.read_map().endpoints[1]
                s.hosts[dead].kill()
                trainer.get("t", np.arange(400))  # fails node 1 over; a spare replaces it
                began = world.now
                while world.now - began < LATE_WAIT + 30:  # the trainer trains on; the other writer stays idle
                    trainer.apply_gradient("t", np.arange(0, 400, 7), np.ones((58, 4), dtype=np.float32))
                    trainer.step()
                    world.sleep(5.0)
                m = s.store.read_map()
                assert m.endpoints[1] != dead and m.states[1] == "up"
                spare = next(e for e in s.store.presence() if e not in m.endpoints)
                s.store.request_grow(spare)
                while s.store.read_map().nodes == 5:
                    assert world.now - began < LATE_WAIT + 300, "the node was not added"
                    trainer.get("t", np.arange(10))
                    world.sleep(1.0)
                if not in_parity:
                    with pytest.raises(WritesLost, match="1 acknowledged write") as lost:
                        idle.get("u", ids)
                    np.testing.assert_array_equal(lost.value.rows["u"], ids)
                    np.testing.assert_array_equal(idle.get("u", ids), before)  # what they held before the put
                    idle.put("u", ids, values)
                    idle.flush(timeout=60)
                np.testing.assert_array_equal(idle.get("u", ids), values)
        finally:
            world.close()
    assert not world.problems, world.problems
