"""Real failures of node processes: leases, fencing, deciders, injected faults, and the Redis-style kill loop."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import ectable
from ectable.testing import check_parity, read_records
from ectable.testing.kill_loop import run as kill_loop

pytestmark = pytest.mark.timeout(300)


def make(code="xor", spares=1, **kwargs):
    k, r = (4, 1) if code == "xor" else (3, 2)
    cluster = ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, spares=spares, **kwargs)
    reference = ectable.LocalCluster(nodes=1, code="none", k=1, r=0, processes=False)
    clients = cluster.connect(), reference.connect()
    for c in clients:
        c.create_table("t", num_rows=3000, dim=8, optimizer="adagrad", lr=0.1, init="normal", seed=3)
    return cluster, reference, clients


def same(client, reference):
    ids = np.arange(3000)
    return np.array_equal(read_records(client, "t", ids), read_records(reference, "t", ids))


def recovered_and_exact(cluster, client, ref):
    """Wait for every rebuild, then check parity against a fresh encode and every record against ref."""
    client.wait_recovered(timeout=60)
    client.flush()
    check_parity(cluster, client)
    assert same(client, ref)


def add_spare_to(cluster, *dead) -> int:
    """Add a spare; the position of `dead` it rebuilds, once it does."""
    cluster.add_spare()
    deadline = time.monotonic() + 30
    while not any(cluster.state(p) == "rebuilding" for p in dead) and time.monotonic() < deadline:
        time.sleep(0.05)
        cluster.refresh()
    return next(p for p in dead if cluster.state(p) == "rebuilding")


def write_held(cluster, clients, node: int, row: int) -> tuple:
    """Add ones to `row` of node `node` through `clients` (the cluster's first, then the reference), its delta
    held back from the second parity holder of its stripe (`hold_deltas_to`) and acknowledged by the first:
    (the reference's record before, after)."""
    client, ref = clients
    layout = client._table("t")[1]
    before = read_records(ref, "t", np.array([row]))
    cluster.inject(node, "hold_deltas_to", int(layout.parity_node(layout.stripe(np.array([row])), 1)[0]))
    for c in clients:
        c.apply_gradient("t", np.array([row]), np.ones((1, 8), dtype=np.float32))
    client.step()
    deadline = time.monotonic() + 10
    while client.status()["nodes"][node]["unacked_deltas"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.status()["nodes"][node]["unacked_deltas"] == 1
    return before, read_records(ref, "t", np.array([row]))


def write(clients, rng, rounds=3, step=True):
    for _ in range(rounds):
        ids = rng.integers(0, 3000, 500)
        grads = rng.standard_normal((500, 8)).astype(np.float32)
        for c in clients:
            c.apply_gradient("t", ids, grads)
            if step:
                c.step()


def test_kill_loop_with_writers_at_once_loses_nothing():
    """Three clients, each through a cluster map of its own, write rows of the same stripes at once; every round
    kills a second node while the first one's spare rebuilds."""
    lines = []
    result = kill_loop(rounds=3, code="rs", seed=5, log=lines.append, double=1.0, writers=3)
    rounds = [line for line in lines if line.startswith("round ")]
    assert len(rounds) == 3 and all(line.count("SIGKILLed node ") == 2 for line in rounds), rounds
    assert all(": 0 lost;" in line and "read again: 0 lost" in line for line in rounds), rounds
    assert result == {"rounds": 3, "kills": 6, "drains": 0, "adds": 0, "lost": 0}


@pytest.mark.parametrize("code", ["xor", "rs"])
def test_kill_loop_loses_nothing(code):
    """Five rounds, some of which drain their first node instead of killing it, some of which add a node first
    (mid-window) and then kill or drain one of the new layout."""
    lines = []
    result = kill_loop(rounds=5, code=code, seed=7, log=lines.append, drains=0.4, adds=0.4)
    rounds = [line for line in lines if line.startswith("round ")]
    killed = sum(line.count("SIGKILLed node ") for line in rounds)  # each node is named with how it went
    drained = sum(line.count("drained node ") for line in rounds)
    added = sum(line.count("added node ") for line in rounds)
    assert len(rounds) == 5 and killed + drained >= 5 and killed and drained and added
    assert all(": 0 lost;" in line and "read again: 0 lost" in line for line in rounds), rounds
    assert result == {"rounds": 5, "kills": killed, "drains": drained, "adds": added, "lost": 0}
    assert lines[-1].startswith(f"kill loop ({code}): 5 rounds, {killed} kills (SIGKILL), {drained} drains, "
                                f"{added} adds, 0 lost,")


def test_a_silent_node_is_declared_dead_replaced_and_fenced_when_it_returns():
    cluster, reference, (client, ref) = make()
    with cluster, reference:
        rng = np.random.default_rng(1)
        write((client, ref), rng)
        pid = cluster.node_pids()[1]
        os.kill(pid, signal.SIGSTOP)  # alive but silent: no client touches it, only its lease tells
        try:
            deadline = time.monotonic() + 15
            while cluster.state(1) != "rebuilding" and time.monotonic() < deadline:  # dead, then a spare there
                time.sleep(0.1)
                cluster.refresh()
            assert cluster.state(1) == "rebuilding" and cluster.node_pids()[1] != pid and cluster.spares_left() == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while cluster.spares_left() == 0 and time.monotonic() < deadline:  # told it is fenced: a spare again
            time.sleep(0.1)
            cluster.refresh()
        assert cluster.spares_left() == 1
        write((client, ref), rng)
        recovered_and_exact(cluster, client, ref)
        cluster.kill(3)  # the returned node now serves as the spare
        write((client, ref), rng)
        client.wait_recovered(timeout=60)
        assert cluster.node_pids()[3] == pid and same(client, ref)


@pytest.mark.parametrize("fault", ["die_before_deltas", "die_after_write"])
@pytest.mark.parametrize("code", ["xor", "rs"])
def test_a_node_dying_between_its_write_and_its_delta_loses_nothing(fault, code):
    cluster, reference, (client, ref) = make(code)
    with cluster, reference:
        rng = np.random.default_rng(2)
        write((client, ref), rng)
        pid = cluster.node_pids()[2]
        cluster.inject(2, fault)
        write((client, ref), rng, rounds=4)  # node 2 SIGKILLs itself at the armed point
        assert cluster.node_pids()[2] != pid and cluster.state(2) != "dead"  # a spare took its place
        assert same(client, ref)
        recovered_and_exact(cluster, client, ref)


def test_a_node_that_dies_before_it_answers_its_armed_fault_is_not_waited_for():
    """A node armed to die may die in the same pass that answered `fault`, before the answer left it (CI once
    saw `inject` wait 10 s for it, then fail): `inject` returns once the process is gone."""
    cluster, reference, (client, ref) = make()
    with cluster, reference:
        rng = np.random.default_rng(8)
        write((client, ref), rng)
        pid = cluster.node_pids()[2]
        os.kill(pid, signal.SIGSTOP)  # the fault waits in its socket, never answered
        killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
        killer.start()
        try:
            cluster.inject(2, "die_before_deltas")
        finally:
            killer.join()
        write((client, ref), rng)
        assert cluster.node_pids()[2] != pid and same(client, ref)
        recovered_and_exact(cluster, client, ref)


@pytest.mark.parametrize("op", ["write", "flush", "wait_recovered", "status"])
def test_a_node_process_that_exits_just_after_the_client_caught_up_is_failed_over(op):
    """A client fails over what moved, then plans its request from every position's state; a `LocalCluster`
    declares a node dead as soon as it sees its process gone. A node SIGKILLed right between the two is
    failed over on the way, and the call goes on as if it had died a moment later."""
    cluster, reference, (client, ref) = make("xor")
    with cluster, reference:
        rng = np.random.default_rng(6)
        write((client, ref), rng)
        caught_up, armed = client._catch_up, [True]

        def catch_up_then_kill():
            out = caught_up()
            if armed:
                armed.clear()
                cluster.kill(0 if op == "status" else 2)  # status asks position after position
            return out

        ids = rng.integers(0, 3000, 500)
        grads = rng.standard_normal((500, 8)).astype(np.float32)
        ref.apply_gradient("t", ids, grads)
        if op != "write":
            client.apply_gradient("t", ids, grads)
        client.flush()  # no step due: the kill comes in `op`'s own planning
        client._catch_up = catch_up_then_kill
        if op == "write":
            client.apply_gradient("t", ids, grads)
        else:
            getattr(client, op)()
        assert not armed
        recovered_and_exact(cluster, client, ref)


@pytest.mark.parametrize("fault", ["duplicate_deltas", "reorder_deltas", "delay_deltas"])
def test_duplicated_reordered_and_delayed_deltas_apply_exactly_once(fault):
    cluster, reference, (client, ref) = make("rs", spares=0)
    with cluster, reference:
        for p in range(cluster.config.nodes):
            cluster.inject(p, fault, 0.3)
        rng = np.random.default_rng(3)
        write((client, ref), rng, rounds=6)
        client.flush()
        check_parity(cluster, client)
        assert same(client, ref)
        assert all(n["fault_hits"] > 0 for n in client.status()["nodes"])
        cluster.kill(0)  # and a failure while deltas are delayed, duplicated or reordered
        write((client, ref), rng, rounds=3)
        assert same(client, ref)


def test_beyond_r_failures_only_the_lost_stripes_are_unavailable():
    cluster, reference, (client, ref) = make("xor", spares=0)
    with cluster, reference:
        write((client, ref), np.random.default_rng(4))
        cluster.kill(0)
        cluster.kill(1)
        layout = client._table("t")[1]
        ids = np.arange(3000)
        nodes = layout.slot_node(layout.stripe(ids)[:, None], np.arange(layout.width))
        lost = ((nodes == 0) | (nodes == 1)).sum(axis=1) > layout.r
        lost &= np.isin(layout.data_node(ids), [0, 1])  # rows on a live node are served as they are
        with pytest.raises(ectable.Unavailable):
            client.get("t", ids[lost][:5])
        np.testing.assert_array_equal(client.get("t", ids[~lost]), ref.get("t", ids[~lost]))
        assert client.status()["degraded"] == [0, 1]


@pytest.mark.parametrize("code,spares", [("rs", 1), ("rs", 0), ("xor", 1), ("xor", 0)])
def test_a_window_that_reached_some_parity_holders_and_not_others(code, spares):
    """Node 2's last window reaches every node but one, then node 2 dies. With rs the coordinator
    makes each stripe's holders agree before the spare (or a degraded read) decodes; with xor each
    stripe has one holder, whose rows are replayed where it lacks them."""
    cluster, reference, (client, ref) = make(code, spares=spares)
    with cluster, reference:
        rng = np.random.default_rng(5)
        write((client, ref), rng)
        client.flush()
        layout = client._table("t")[1]
        ids = np.flatnonzero(layout.data_node(np.arange(3000)) == 2)[:200]
        holders = layout.parity_node(layout.stripe(ids), 0)
        lagging = int(np.bincount(holders).argmax())
        cluster.inject(2, "hold_deltas_to", lagging)
        for c in (client, ref):
            c.apply_gradient("t", ids, np.ones((ids.size, 8), dtype=np.float32))
        client.step()
        time.sleep(0.5)  # the window closed; its deltas reached every holder but `lagging`
        cluster.kill(2)
        assert same(client, ref)
        if spares:
            recovered_and_exact(cluster, client, ref)


@pytest.mark.parametrize("first", [False, True], ids=["last-window", "first-window"])
def test_a_partial_last_window_then_a_second_kill_loses_nothing(first):
    """rs(3,2), no spare: node 2's last window reaches every parity holder but one; node 2 and another
    node are SIGKILLed back to back. The survivors are rolled back to the window all of them hold, so no
    parity row is forgotten and every stripe keeps k slots: every record reads exact, none `Unavailable`.
    Before, the lagging holder forgot its parity rows of node 2's stripes, which nothing could rebuild.
    `first`: that window is node 2's first, so the lagging holder took none of its deltas; its parity
    rows hold node 2's window 0 (before, its level was unknown, and it forgot its rows all the same:
    simulation seeds rs 488 and rs 684)."""
    cluster, reference, (client, ref) = make("rs", spares=0)
    with cluster, reference:
        rng = np.random.default_rng(15)
        if not first:
            write((client, ref), rng)
        client.flush()
        layout = client._table("t")[1]
        ids = np.flatnonzero(layout.data_node(np.arange(3000)) == 2)
        lagging = int(np.bincount(layout.parity_node(layout.stripe(ids), 0)).argmax())
        cluster.inject(2, "hold_deltas_to", lagging)
        for c in (client, ref):
            c.apply_gradient("t", ids, np.ones((ids.size, 8), dtype=np.float32))
        client.step()
        deadline = time.monotonic() + 10  # the window closed; its deltas reached every holder but `lagging`
        while client.status()["nodes"][2]["unacked_deltas"] > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.status()["nodes"][2]["unacked_deltas"] == 1  # only `lagging` lacks the last window
        cluster.kill(2)
        cluster.kill(next(q for q in range(5) if q not in (2, lagging)))
        assert same(client, ref)
        assert all(cluster.state(q) == "up" for q in range(5) if cluster.state(q) != "dead")  # nothing forgotten


def test_a_spare_added_after_a_failure_takes_the_dead_position():
    cluster, reference, (client, ref) = make("xor", spares=0)
    with cluster, reference:
        write((client, ref), np.random.default_rng(6))
        cluster.kill(1)
        assert same(client, ref) and client.status()["degraded"] == [1]
        cluster.add_spare()
        recovered_and_exact(cluster, client, ref)
        assert client.status()["degraded"] == []


@pytest.mark.parametrize("code", ["xor", "rs"])
def test_training_goes_on_when_the_acting_decider_is_killed(code):
    """SIGKILL the decider that acts: reads and writes go on (they never ask it); the other decider
    takes over, so a node killed afterwards is still failed over onto the spare, with nothing lost."""
    cluster, reference, (client, ref) = make(code, spares=1)
    with cluster, reference:
        rng = np.random.default_rng(8)
        write((client, ref), rng)
        acting = cluster.acting_decider()
        assert acting is not None
        cluster.kill_decider(acting)
        write((client, ref), rng)
        assert same(client, ref)
        cluster.kill(3)
        write((client, ref), rng)
        recovered_and_exact(cluster, client, ref)
        assert cluster.acting_decider() not in (None, acting)


def test_a_node_killed_during_create_table():
    """The table is created on every node that lives, and on the spare that takes the dead node's place;
    no misleading timeout, and every row is its initial value afterwards."""
    import threading
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1) as cluster:
        client = cluster.connect()
        killer = threading.Timer(0.3, cluster.kill, args=(2,))
        killer.start()
        client.create_table("big", num_rows=600_000, dim=16, optimizer="adagrad", init="uniform", seed=4)
        killer.join()
        client.wait_recovered(timeout=120)
        with ectable.LocalCluster(nodes=1, code="none", k=1, r=0, processes=False) as reference:
            ref = reference.connect()
            ref.create_table("big", num_rows=600_000, dim=16, optimizer="adagrad", init="uniform", seed=4)
            ids = np.random.default_rng(0).integers(0, 600_000, 5000)
            np.testing.assert_array_equal(read_records(client, "big", ids), read_records(ref, "big", ids))
        client.flush()
        check_parity(cluster, client)


@pytest.mark.parametrize("processes", [True, False])
def test_a_rebuilt_spare_is_a_full_member(processes):
    """rs(4,2): a node killed and rebuilt, then two more killed with no write in between: the rebuilt
    spare's parity rows (and its record of which writes they hold) count like any other node's, so
    nothing is lost and nothing is Unavailable (its marks of the writes its rebuilt rows hold were
    missing, and reconcile dropped its rows as lagging)."""
    cluster = ectable.LocalCluster(nodes=6, code="rs", k=4, r=2, spares=1, processes=processes)
    reference = ectable.LocalCluster(nodes=1, code="none", k=1, r=0, processes=False)
    clients = cluster.connect(), reference.connect()
    with cluster, reference:
        for c in clients:
            c.create_table("t", num_rows=3000, dim=8, optimizer="adagrad", lr=0.1, init="normal", seed=3)
        rng = np.random.default_rng(9)
        write(clients, rng)
        cluster.kill(1)
        clients[0].wait_recovered(timeout=60)
        assert all(cluster.state(p) == "up" for p in range(6))
        cluster.kill(2)
        clients[0].step()
        cluster.kill(3)
        assert same(*clients)


@pytest.mark.parametrize("processes", [True, False])
def test_wait_recovered_names_the_lost_stripes_when_more_than_r_die(processes):
    """Two of five xor nodes die with two spares: the stripes that lost both slots cannot come back;
    wait_recovered says so at once with the stripe numbers, never a generic error after its timeout."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=2, processes=processes) as cluster:
        client = cluster.connect()
        client.create_table("t", num_rows=3000, dim=4, optimizer="sgd")
        client.apply_gradient("t", np.arange(3000), np.ones((3000, 4)))
        client.flush()
        cluster.kill(0)
        cluster.kill(1)
        with pytest.raises(ectable.Unavailable, match=r"stripe"):  # not the Error of a timeout
            client.wait_recovered(timeout=120)


def test_a_traced_kill_loop_stops_at_a_row_read_wrong_and_tells_its_history(tmp_path, monkeypatch):
    """With a trace directory, the loop stops at the first round that reads a row wrong and tells what touched
    it. Made wrong here by a put that the cluster alone takes, in the last batch of the first round (seed 7: six
    batches): the history shows that row's writes as its node applied them, the earlier ones as the reference
    after their batch, the last one as no reference value."""
    from ectable.testing import kill_loop as loop
    applied, calls = loop._apply, []

    def apply(client, batch):
        applied(client, batch)
        calls.append(client)
        if len(calls) == 11:  # the cluster's sixth batch
            client.put("users", np.array([0]), np.full((1, 16), 3.0, np.float32))
    monkeypatch.setattr(loop, "_apply", apply)
    monkeypatch.setenv("ECTABLE_TRACE", str(tmp_path))  # run() sets it; this takes it away afterwards
    lines = []
    with pytest.raises(AssertionError, match="round 1: 1 rows read wrong"):
        loop.run(rounds=3, code="xor", seed=7, log=lines.append, trace=str(tmp_path))
    row = next(n for n, line in enumerate(lines) if line.startswith("  users row 0: "))
    assert lines[row].endswith("read as the reference after batch none")
    assert [line.split()[3] for line in lines[1:row]] == ["batch"] * 4 + ["kill"] + ["batch"] * 2
    writes = [line for line in lines[row + 1:] if line.split()[3] == "apply"]
    assert len(writes) >= 2 and writes[-1].endswith("the reference after batch none")
    assert any(line.endswith("]") and "the reference after batch [" in line for line in writes[:-1])


def test_a_client_whose_map_missed_a_replacement_counts_its_deltas_in_a_decode():
    """rs(3,2), no spare: positions p and q die, and a second client reads the map then (both dead) and stays
    idle. A spare takes q, rebuilds, takes a write of row y and sends its delta to one holder of y's stripe
    only (the other's is held back). The idle client then reads row x, p's row of that stripe: decoded from the
    third data node and both holders, which disagree on the new node's delta. Its map did not know that node,
    so the cut did not count what the node had sent, and x came back wrong (the kill loop's rebuilder installed
    such rows: `--double 1 --seed 44`, round 59). A holder that applied deltas of a node the client's map does
    not know now makes the client read the map again and count that node."""
    from ectable.client import Client
    from ectable.cluster.maps import RemoteCluster
    cluster, reference, (client, ref) = make("rs", spares=0)
    with cluster, reference:
        write((client, ref), np.random.default_rng(21))
        client.flush()
        layout = client._table("t")[1]
        p, q = 0, 1
        cluster.kill(p)
        cluster.kill(q)
        assert same(client, ref)  # both failed over: read through the parity
        view = RemoteCluster(cluster.membership)
        try:
            idle = Client(view)
            assert view.state(p) == view.state(q) == "dead"
            q = add_spare_to(cluster, p, q)  # the names follow the spare
            p = 1 - q
            stripes = layout.stripe(np.arange(3000))
            ours = np.flatnonzero(layout.data_node(np.arange(3000)) == q)
            both = ours[np.isin(stripes[ours], stripes[layout.data_node(np.arange(3000)) == p])]
            y = int(both[0])
            x = int(np.flatnonzero((stripes == stripes[y]) & (layout.data_node(np.arange(3000)) == p))[0])
            write_held(cluster, (client, ref), q, y)
            assert view.state(q) == "dead"  # the idle client's map: from before the spare
            np.testing.assert_array_equal(read_records(idle, "t", np.array([x])), read_records(ref, "t", np.array([x])))
        finally:
            view.close()


def test_a_client_that_meets_a_death_before_its_reconcile_waits_for_it_to_decode():
    """rs(3,2), no spare: q died and was failed over. p applies a write and sends its window's delta to one
    holder of that row's stripe only, then is SIGKILLed and declared dead while the deciders are stopped, so
    it is not reconciled yet. A client that connects then reads a row of p's in a stripe with q's slot lost
    too: decoded from the third data node and both holders, which disagree on p's last delta. The client
    never knew p, so it had no failover to wait in, and it decoded garbage (neither the row before the write
    nor after). A decode through a position the map lists as failing now waits (bounded) for its reconcile."""
    from ectable.client import Client
    from ectable.cluster import plans
    from ectable.cluster.maps import RemoteCluster
    cluster, reference, (client, ref) = make("rs", spares=0)
    deciders = [cluster._procs[name] for name in cluster._deciders]
    with cluster, reference:
        write((client, ref), np.random.default_rng(22))
        client.flush()
        layout = client._table("t")[1]
        rows, p, q = np.arange(3000), 0, 1
        cluster.kill(q)
        assert same(client, ref)  # q failed over and reconciled: read through the parity
        stripes, owner = layout.stripe(rows), layout.data_node(rows)
        x = int(rows[(owner == p) & np.isin(stripes, stripes[owner == q])][0])
        lost = rows[(stripes == stripes[x]) & (owner == q)]  # decoded with x
        before, after = write_held(cluster, (client, ref), p, x)
        view, resume = None, threading.Timer(1.0, lambda: [os.kill(proc.pid, signal.SIGCONT) for proc in deciders])
        for proc in deciders:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            cluster.kill(p)
            m = cluster.store.read_map()
            assert cluster.store.swap_map(m, plans.declare_dead(m, [p])) is not None  # as the decider's first step
            view = RemoteCluster(cluster.membership)
            idle = Client(view)
            assert view.state(p) == "dead" and view.failing() == ((p, m.sources[p]),)
            resume.start()  # while the read waits
            got = read_records(idle, "t", np.array([x]))
            assert np.array_equal(got, before) or np.array_equal(got, after), (got, before, after)
            np.testing.assert_array_equal(read_records(idle, "t", lost), read_records(ref, "t", lost))
        finally:
            resume.cancel()
            if resume.ident is not None:
                resume.join()
            for proc in deciders:
                os.kill(proc.pid, signal.SIGCONT)
            if view is not None:
                view.close()
        assert same(client, ref)  # the writer replays its write through the parity


def test_a_decode_for_a_rebuild_counts_the_deltas_of_the_rebuilding_node():
    """rs(3,2): q died with no spare; p died and a spare S rebuilds it slowly. One client rebuilds row y of S
    on demand (S lacked it), writes it, and S sends that write's delta to one holder of y's stripe only. A
    second client, told earlier that S lacked y, decodes y for its own rebuild (`read_many` skipping S): from
    the third data node and both holders, as q's slot is lost too, which disagree on S's delta. The cut
    counted what every data node had sent but S, so the decode was garbage (neither y before the write nor
    after). S is now a marker of such a cut: holders that lag behind what S sent are read again."""
    cluster = ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, spares=0, rebuild_batch=8, rebuild_share=0.01)
    reference = ectable.LocalCluster(nodes=1, code="none", k=1, r=0, processes=False)
    with cluster, reference:
        writer, ref, other = cluster.connect(), reference.connect(), cluster.connect()
        for c in (writer, ref):
            c.create_table("t", num_rows=3000, dim=8, optimizer="adagrad", lr=0.1, init="normal", seed=3)
        write((writer, ref), np.random.default_rng(23))
        writer.flush()
        layout = writer._table("t")[1]
        rows, p, q = np.arange(3000), 0, 1
        for dead in (q, p):
            cluster.kill(dead)
            assert same(writer, ref)  # failed over: read through the parity
        p = add_spare_to(cluster, p, q)  # the names follow the spare
        q = 1 - p
        stripes, owner = layout.stripe(rows), layout.data_node(rows)
        y = int(rows[(owner == p) & np.isin(stripes, stripes[owner == q])][-1])  # the last the rebuild reaches
        other.get("t", rows[(owner == p) & (stripes != stripes[y])][:1])  # it meets S
        for c in (writer, ref):
            c.get("t", np.array([y]))  # S lacks y: rebuilt on demand
        before, after = write_held(cluster, (writer, ref), p, y)
        release = threading.Timer(1.0, cluster.inject, (p, "hold_deltas_to", -1))  # sent at the next resend
        release.start()
        try:
            got = other.repair.read_many({"t": np.array([y])}, skip=p)["t"]
        finally:
            release.join()
        assert np.array_equal(got, before) or np.array_equal(got, after), (got, before, after)
        writer.flush()
        assert same(writer, ref)
