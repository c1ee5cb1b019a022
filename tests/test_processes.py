"""Real node processes over ZeroMQ on loopback: the same behaviour, plus what only processes have."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

import ectable
from ectable.process.local import NODE_NICE
from ectable.protocol import deltas as payload
from ectable.testing import check_parity, read_records
from ectable.testing.statemachine import machine_for
from ectable.transport import ZmqChannel, codec

pytestmark = pytest.mark.timeout(300)

fast = settings(max_examples=8, stateful_step_count=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestProcessXor = fast(machine_for(code="xor", nodes=5, k=4, r=1, spares=1, processes=True)).TestCase
TestProcessRS = fast(machine_for(code="rs", nodes=5, k=3, r=2, spares=1, processes=True)).TestCase


def gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def cluster():
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, spares=0) as c:
        client = c.connect()
        client.create_table("items", num_rows=5000, dim=16, optimizer="adagrad", lr=0.1)
        client.create_table("users", num_rows=700, dim=8, optimizer="rowwise_adagrad", lr=0.1, init="normal")
        yield c, client


def test_nodes_are_processes_on_loopback(cluster):
    c, _ = cluster
    pids = c.node_pids()
    assert len(set(pids)) == 5 and os.getpid() not in pids
    assert all(e.startswith("tcp://127.0.0.1:") for e in c.endpoints)


def thread_priorities(pid: int) -> set:
    return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def test_node_processes_run_below_the_trainers_priority(cluster):
    """Every thread of a node process (numpy's, ZeroMQ's, the presence's) is NODE_NICE below its parent."""
    c, client = cluster
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert all(thread_priorities(pid) == {min(ours + NODE_NICE, 19)} for pid in c.node_pids())
    with ectable.LocalCluster(nodes=3, code="xor", k=2, node_nice=0) as same:
        assert all(thread_priorities(pid) == {ours} for pid in same.node_pids())
    with pytest.raises(ValueError, match="node_nice"):
        ectable.LocalCluster(nodes=3, code="xor", k=2, node_nice=20)


def test_process_cluster_matches_in_process_cluster(cluster):
    c, client = cluster
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=False) as ref:
        rc = ref.connect()
        for t, spec in client.tables().items():
            rc.create_table(t, spec["num_rows"], spec["dim"], optimizer=spec["optimizer"]["name"],
                            lr=spec["optimizer"]["lr"], init=spec["init"]["kind"], seed=spec["seed"])
        rng = np.random.default_rng(5)
        for _ in range(5):
            batch = {"items": (rng.zipf(1.2, 300) % 5000, rng.standard_normal((300, 16))),
                     "users": (rng.integers(0, 700, 50), rng.standard_normal((50, 8)))}
            for cl in (client, rc):
                cl.get_many({t: ids for t, (ids, _) in batch.items()})
                cl.apply_gradient_many(batch)
                cl.step()
        client.flush()
        check_parity(c, client)
        for t in ("items", "users"):
            ids = np.arange(client.tables()[t]["num_rows"])
            np.testing.assert_array_equal(read_records(client, t, ids), read_records(rc, t, ids))


def test_flush_waits_for_every_delta(cluster):
    c, client = cluster
    client.apply_gradient("items", np.arange(0, 5000, 7), np.ones((715, 16)))
    client.flush()
    st = client.status()
    assert st["unacked_deltas"] == 0 and st["dirty_rows"] == 0 and st["parity_lag_writes"] == 0
    check_parity(c, client)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(st.binary(max_size=64), min_size=1, max_size=4), header=st.dictionaries(
    st.sampled_from(["op", "table", "tables", "parts", "arrays", "seq", "source", "id"]),
    st.one_of(st.integers(-3, 3), st.text(max_size=4), st.lists(st.one_of(st.text(max_size=3), st.lists(st.integers(0, 9), max_size=2)), max_size=3))))
def test_garbage_frames_never_hurt_a_node(cluster, frames, header):
    """Each of two garbage messages gets a well-formed reply (the node read it and answered); the node process
    lives on, answers a ping, and its rows are unchanged."""
    import msgpack
    c, client = cluster
    before = read_records(client, "users", np.arange(700))
    pid = c.node_pids()[1]
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(c.endpoints[1])
    try:
        sock.send_multipart(frames)
        sock.send_multipart([msgpack.packb(header), *frames[1:]])
        for _ in range(2):
            assert sock.poll(10000), "the node did not answer a garbage message"
            reply, _ = codec.decode(sock.recv_multipart())
            assert isinstance(reply, dict)
    finally:
        sock.close(0)
    os.kill(pid, 0)  # the process lives (ProcessLookupError otherwise)
    assert open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    ping = ZmqChannel(c.endpoints[1], zmq.Context.instance())
    try:
        assert ping.call({"op": "ping"}, [], 10.0)[0]["position"] == 1
    finally:
        ping.close()
    assert all(c.state(p) == "up" for p in range(5))
    np.testing.assert_array_equal(read_records(client, "users", np.arange(700)), before)


def test_malformed_frames_are_counted(cluster):
    c, client = cluster
    ch = ZmqChannel(c.endpoints[2], zmq.Context.instance())
    sock = ch._socket()
    sock.send_multipart([b"\xc1garbage", b"x"])
    assert sock.poll(5000)
    header, _ = codec.decode(sock.recv_multipart())
    assert header["error"] == "malformed"
    ch.close()
    assert client.status()["nodes"][2]["malformed"] >= 1


def test_deltas_apply_exactly_once_over_the_wire(cluster):
    c, client = cluster
    client.flush()
    layout = client._table("users")[1]
    target = int(layout.parity_node(np.array([3]), 0)[0])
    ids = np.array([9])  # stripe 3, position 0
    delta = np.random.default_rng(0).integers(0, 256, (1, 9 * 4), dtype=np.uint8)
    ch = ZmqChannel(c.endpoints[target], zmq.Context.instance())
    def send(seq):
        return ch.call({"op": "delta", "source": "node/9/exactly-once", "seq": seq, "tables": ["users"]},
                       payload.pack([(ids, delta)]), 10)[0]
    assert send(2)["error"] == "out_of_order"  # seq 1 first: deltas apply in order
    for seq in (1, 1, 1, 2):  # seq 1 three times (applied once), then the same bytes as seq 2: they cancel
        assert send(seq)["ack"] == seq
    ch.close()
    check_parity(c, client)


def test_concurrent_client_processes(tmp_path):
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1) as c:
        client = c.connect()
        client.create_table("t", num_rows=4000, dim=8, optimizer="sgd", lr=0.5, init="zeros")
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(c.describe()))
        script = ("import sys, numpy as np, ectable\n"
                  "cl = ectable.connect(sys.argv[1]); w = int(sys.argv[2])\n"
                  "for s in range(20):\n"
                  "    ids = np.arange(w, 4000, 4)\n"
                  "    cl.apply_gradient('t', ids, np.full((ids.size, 8), 1.0 + s))\n"
                  "    cl.step()\n"
                  "cl.flush()\n"
                  "cl.close()\n")
        procs = [subprocess.Popen([sys.executable, "-c", script, str(toml), str(w)]) for w in range(4)]
        assert [p.wait(120) for p in procs] == [0] * 4
        client.flush()
        expect = np.float32(0)
        for s in range(20):
            expect = expect - np.float32(0.5) * np.float32(1.0 + s)
        np.testing.assert_array_equal(client.get("t", np.arange(4000)), np.full((4000, 8), expect, dtype=np.float32))
        check_parity(c, client)


TRAINER = """
import sys, numpy as np, ectable
client = ectable.connect(sys.argv[1]); w = int(sys.argv[2]); rng = np.random.default_rng(w)
ids = np.arange(64)
for _ in range(12):  # no step(): every write stays in the open windows, so a failover replays them all
    client.apply_gradient("hot", ids, rng.standard_normal((64, 8)).astype(np.float32))
print("WROTE", flush=True)
sys.stdin.readline()  # a node is killed now
client.get("hot", ids)  # fails over: replays this trainer's writes
client.flush()
print("DONE", flush=True)
sys.stdin.readline()
client.close()
"""


def test_trainers_writing_the_same_rows_replay_in_the_order_the_node_applied(tmp_path):
    """Three trainer processes write the same rows (adagrad: the order matters); a node holding some dies
    with all their writes in its open window; once recovered every row equals what it was before."""
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, window_rows=10**9, window_seconds=1e9) as c:
        client = c.connect()
        client.create_table("hot", num_rows=64, dim=8, optimizer="adagrad", lr=0.1)
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(c.describe()))
        trainers = [subprocess.Popen([sys.executable, "-c", TRAINER, str(toml), str(w)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True) for w in range(3)]
        try:
            assert [t.stdout.readline().strip() for t in trainers] == ["WROTE"] * 3
            before = client.get("hot", np.arange(64))
            c.kill(2)
            for t in trainers:
                t.stdin.write("\n")
                t.stdin.flush()
            assert [t.stdout.readline().strip() for t in trainers] == ["DONE"] * 3
            client.wait_recovered(timeout=60)
            np.testing.assert_array_equal(client.get("hot", np.arange(64)), before)
            check_parity(c, client)
        finally:
            for t in trainers:
                t.stdin.close()
                t.wait(30)


def test_close_stops_every_process_and_frees_ports():
    c = ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, spares=1)
    pids, endpoints = c.node_pids(), c.endpoints
    c.close()
    assert all(gone(pid) for pid in pids)
    ctx = zmq.Context.instance()
    for e in endpoints:
        s = ctx.socket(zmq.ROUTER)
        s.bind(e)  # the port is free again
        s.close(0)


def test_nodes_die_with_the_process_that_started_them():
    script = ("import ectable, time\n"
              "c = ectable.LocalCluster(nodes=4, code='xor', k=3, r=1)\n"
              "print(' '.join(map(str, c.node_pids())), flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert len(pids) == 4 and all(gone(pid) for pid in pids)


def test_curve_refuses_unauthenticated_clients(tmp_path):
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "ectable", "keygen", "--out", str(keys), "--nodes", "6"], check=True)
    assert sorted(os.listdir(keys))[:3] == ["client-0.toml", "client-1.toml", "client-2.toml"]
    assert all(os.stat(keys / name).st_mode & 0o077 == 0 for name in os.listdir(keys))  # secrets: owner only
    mine = ectable.config.load(str(keys / "client-1.toml"))["security"]
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, keys=str(keys)) as c:
        client = c.connect()
        client.create_table("t", num_rows=10, dim=2, init="zeros")
        client.put("t", [1], np.ones((1, 2)))
        np.testing.assert_array_equal(client.get("t", [1]), np.ones((1, 2)))
        plain = ZmqChannel(c.endpoints[0], zmq.Context.instance(), connect_timeout=10.0)
        with pytest.raises(ectable.AuthenticationFailed, match="^authentication with .* failed .*: this client has "
                                                               "no CURVE keys"):
            plain.call({"op": "get", "table": "t"}, [np.array([1])], 10.0)
        plain.close()
        other_public, other_secret = zmq.curve_keypair()
        stranger = ZmqChannel(c.endpoints[0], zmq.Context.instance(),
                              {**mine, "public": other_public.decode(), "secret": other_secret.decode()},
                              connect_timeout=10.0)
        with pytest.raises(ectable.AuthenticationFailed, match="CURVE keys the node does not accept"):
            stranger.call({"op": "status"}, [], 10.0)
        stranger.close()
        toml = tmp_path / "cluster.toml"  # the cluster file without its [security] section
        toml.write_text(ectable.config.dumps({k: v for k, v in c.describe().items() if k != "security"}))
        with pytest.raises(ectable.AuthenticationFailed, match="no CURVE keys"):
            ectable.connect(str(toml))
        old = {**c.describe(), "security": {"server_public": mine["server_public"], "client_public": mine["public"],
                                            "client_secret": mine["secret"], "allowed": [mine["public"]]}}
        toml.write_text(ectable.config.dumps(old))  # the single shared client key of before
        with pytest.raises(ectable.Error, match=r"lacks \['public', 'secret', 'nodes'.*ectable keygen"):
            ectable.connect(str(toml))
        assert all(c.state(p) == "up" for p in range(3))  # a refused client fails no node over


def test_each_key_may_send_only_what_its_role_sends(tmp_path):
    """A client's key (or a decider's, or a node's the map does not list) cannot fold a parity delta, and only
    a decider's may invalidate, roll back, push a map or take a node's state (a drain's handover), only a client's
    take a checkpoint: each is refused ("forbidden") and changes nothing.
    Nodes given their own keys still fail over onto a spare, whose key the map then lists."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "ectable", "keygen", "--out", str(keys), "--nodes", "8"], check=True)
    load = lambda name: ectable.config.load(str(keys / f"{name}.toml"))["security"]
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, spares=1, keys=str(keys)) as c:
        client = c.connect()
        client.create_table("t", num_rows=40, dim=2, init="normal", seed=2)
        client.put("t", np.arange(40), np.ones((40, 2)))
        client.flush()
        layout = client._table("t")[1]
        ids = np.flatnonzero(layout.data_node(np.arange(40)) == 0)[:1]
        holder = int(layout.parity_node(layout.stripe(ids), 0)[0])
        forged = {"op": "delta", "source": c.source(0), "seq": 99, "tables": ["t"]}
        promise = {"op": "holds", "table": "t", "source": "repair/forged", "position": 0, "dead": c.source(0)}
        degraded = {**forged, "source": "repair/forged", "seq": 1, "position": 0, "dead": c.source(0)}
        snapshot = {"op": "snapshot", "number": 1, "root": "r", "directory": str(tmp_path / "ck"), "kind": "full"}
        unused = sorted(set(os.listdir(keys)) - {f"node-{i}.toml" for i in range(4)})
        by_key = {load(n[:-5])["public"]: n[:-5] for n in os.listdir(keys) if n.startswith("node-")}
        as_other = by_key[c._map.keys[2]]  # a live node's key, sending as node 0
        senders = {"client-1": [(forged, "forbidden"), ({"op": "invalidate", "table": "t"}, "forbidden"),
                                ({"op": "rollback", "source": c.source(0), "window": 0, "clients": {}}, "forbidden"),
                                (promise, "replaced"), (degraded, "replaced"),  # node 0 is alive: not degraded
                                ({"op": "freeze"}, "forbidden"), ({"op": "hand_over"}, "forbidden")],
                   "decider-1": [(forged, "forbidden"), (snapshot, "forbidden")],
                   next(n[:-5] for n in unused if n.startswith("node-")): [(forged, "forbidden")],
                   as_other: [(forged, "forbidden"), (snapshot, "forbidden"), ({"op": "hand_over"}, "forbidden")]}
        for name, headers in senders.items():
            channel = ZmqChannel(c.endpoints[holder], zmq.Context.instance(), load(name), connect_timeout=10.0)
            try:
                for header, error in headers:
                    arrays = (payload.pack([(ids, np.full((1, 8), 255, np.uint8))]) if header["op"] == "delta"
                              else [] if header["op"] in ("rollback", "snapshot") else [layout.stripe(ids)])
                    reply = channel.call(header, arrays, 10.0)[0]
                    assert reply.get("error") == error, (name, header["op"], reply)
            finally:
                channel.close()
        check_parity(c, client)
        assert not (tmp_path / "ck").exists()
        client.checkpoint(str(tmp_path / "ok"))  # from a client's key
        assert client.checkpoint_wait()["rows"] == 40
        c.kill(1)
        client.wait_recovered(timeout=60)
        assert None not in c._map.keys and len(set(c._map.keys)) == 3
        client.put("t", np.arange(40), np.full((40, 2), 2.0))
        client.flush()
        check_parity(c, client)
        np.testing.assert_array_equal(client.get("t", np.arange(40)), np.full((40, 2), 2.0, np.float32))


def test_up_status_and_down_from_the_shell(tmp_path):
    toml = tmp_path / "c.toml"
    run = [sys.executable, "-m", "ectable"]
    up = subprocess.Popen([*run, "up", "--nodes", "5", "--code", "xor", "-k", "4", "--spares", "1", "--config",
                           str(toml)], stdout=subprocess.PIPE, text=True)
    try:
        line = up.stdout.readline()
        assert "are up" in line and toml.exists()
        again = subprocess.run([*run, "up", "--config", str(toml)], capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and again.stderr.count("\n") == 1 and "running cluster" in again.stderr
        assert f"pid = {up.pid}" in toml.read_text()  # the running cluster's file was left alone
        with ectable.connect(str(toml)) as client:
            client.create_table("items", 1000, 8)
        out = subprocess.run([*run, "status", "--config", str(toml)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.strip().splitlines()
        assert lines[0].startswith("code xor(k=4, r=1)") and " tables 1 " in lines[0]
        nodes = lines[2:7]
        assert all(" active " in l and " up " in l and " MiB " in l for l in nodes)
        assert len({int(l.split()[3]) for l in nodes}) == 5  # five node processes, each its own pid
        assert lines[-1].split()[:4] == ["items", "1,000", "8", "sgd"]
        out = subprocess.run([*run, "status", "--config", str(toml), "--json"], capture_output=True, text=True,
                             timeout=60)
        status = json.loads(out.stdout)
        assert [n["health"] for n in status["nodes"]] == ["up"] * 5 and all(n["pid"] > 0 for n in status["nodes"])
        watch = subprocess.Popen([*run, "status", "--config", str(toml), "--watch", "0.2", "--json"],
                                 stdout=subprocess.PIPE, text=True)
        assert "status" in json.loads(watch.stdout.readline())
        down = subprocess.run([*run, "down", "--config", str(toml)], capture_output=True, text=True, timeout=90)
        assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
        assert up.wait(10) == 0 and not toml.exists()
        frames = [json.loads(line) for line in watch.stdout.read().splitlines()]
        assert watch.wait(30) == 1 and "the cluster was stopped" in frames[-1]["error"]
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(30)
    for args in (["down", "--config", str(toml)], ["status", "--config", str(toml)]):  # one line, status 1
        out = subprocess.run([*run, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_every_option_has_a_help_text():
    from ectable.__main__ import build_parser
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = dict(sub.choices)
    for name, command in sub.choices.items():  # and subcommands of commands (`node drain`)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(choice.help for choice in action._choices_actions)
                commands.update({f"{name} {n}": c for n, c in action.choices.items()})
    missing = [f"{name} {action.dest}" for name, command in commands.items() for action in command._actions
               if not action.help]
    assert not missing and "node drain" in commands
    assert all(choice.help for choice in sub._choices_actions)


def free_ports(n):
    ctx = zmq.Context.instance()
    socks = [ctx.socket(zmq.ROUTER) for _ in range(n)]
    ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in socks]
    for s in socks:
        s.close(0)
    return ports


def test_nodes_started_from_a_config_file(tmp_path):
    """Nodes and two deciders started by hand from one TOML naming an etcd, in any order; a node that
    dies is failed over."""
    from ectable.membership.server import EtcdServer
    toml = tmp_path / "cluster.toml"
    endpoints = [f"tcp://127.0.0.1:{p}" for p in free_ports(4)]
    config = {"nodes": 4, "code": "rs", "k": 2, "r": 2, "window_rows": 1 << 20, "window_seconds": 5.0}
    run = [sys.executable, "-m", "ectable"]
    with EtcdServer() as etcd:
        toml.write_text(ectable.config.dumps({"cluster": config, "nodes": {"endpoints": endpoints},
                                              "membership": {"endpoints": etcd.endpoints, "prefix": "/by-hand"},
                                              "control": {"token": "t0ken"}}))
        where = [["--id", str(i)] if i % 2 else ["--name", f"node-{i}"] for i in range(4)]  # by position, by name
        procs = [subprocess.Popen([*run, "node", "--config", str(toml), *where[i], "--parent", str(os.getpid())],
                                  stdout=subprocess.PIPE, text=True) for i in range(4)]
        procs += [subprocess.Popen([*run, "decider", "--config", str(toml), "--parent", str(os.getpid())],
                                   stdout=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            assert [p.stdout.readline().split()[1] for p in procs[:4]] == endpoints
            assert all(p.stdout.readline().startswith("READY decider/") for p in procs[4:])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    client = ectable.connect(str(toml))
                except ectable.Unavailable:  # no map yet: the deciders write the first one
                    time.sleep(0.05)
                    continue
                if None not in client.cluster._map.sources:
                    break
                client.close()
                time.sleep(0.05)
            client.create_table("t", num_rows=50, dim=3, optimizer="adagrad")
            client.apply_gradient("t", [1, 2, 2, 49], np.ones((4, 3)))
            client.flush()
            check_parity(client.cluster, client)
            assert client.status()["nodes"][3]["endpoint"] == endpoints[3]
            before = client.get("t", np.arange(50))
            procs[1].kill()  # node 1: no spare, so the cluster serves it degraded once its lease ran out
            np.testing.assert_array_equal(client.get("t", np.arange(50)), before)
            assert client.status()["degraded"] == [1]
            # a spare added to the file and started by its name later is put in the dead position
            spare = f"tcp://127.0.0.1:{free_ports(1)[0]}"
            added = subprocess.run([*run, "spare", "add", "late", spare, "--config", str(toml)], capture_output=True,
                                   text=True)
            assert added.returncode == 0 and "--name late" in added.stdout, added.stderr
            again = subprocess.run([*run, "spare", "add", "late", spare, "--config", str(toml)], capture_output=True,
                                   text=True)
            assert again.returncode == 1 and "names a node 'late' already" in again.stderr
            unknown = subprocess.run([*run, "node", "--config", str(toml), "--name", "nobody"], capture_output=True,
                                     text=True)
            assert unknown.returncode == 1 and "node-0, node-1, node-2, node-3; spares: late" in unknown.stderr
            procs.append(subprocess.Popen([*run, "node", "--config", str(toml), "--name", "late", "--parent",
                                           str(os.getpid())], stdout=subprocess.PIPE, text=True))
            assert procs[-1].stdout.readline().split()[1] == spare
            client.wait_recovered(timeout=60)
            assert client.status()["degraded"] == [] and client.cluster.endpoints[1] == spare
            np.testing.assert_array_equal(client.get("t", np.arange(50)), before)
            check_parity(client.cluster, client)
            client.close()
        finally:
            for p in procs:
                p.kill()
                p.wait(10)
                p.stdout.close()


@pytest.mark.parametrize("spares", [0, 1])
def test_a_write_whose_reply_died_with_its_node_applies_once(monkeypatch, spares):
    """The node applied the write and its parity holders hold it, then it was SIGKILLed before the
    client read the reply: the failover must see the write in the parity, not apply it again."""
    from ectable.transport import zeromq
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=spares, window_rows=1) as c:
        client = c.connect()
        client.create_table("t", num_rows=100, dim=4, optimizer="sgd", lr=1.0, init="zeros")
        ids = np.array([5])
        p = int(client._table("t")[1].data_node(ids)[0])
        client.apply_gradient("t", ids, np.ones((1, 4)))
        wait = zeromq._ZmqPending.wait

        def kill_before_reading(self, timeout):
            if self.channel.endpoint == c.endpoints[p] and not c.__dict__.get("killed"):
                c.__dict__["killed"] = True
                time.sleep(0.3)  # applied, window closed by size, delta acknowledged
                c.kill(p)
            return wait(self, timeout)
        monkeypatch.setattr(zeromq._ZmqPending, "wait", kill_before_reading)
        client.apply_gradient("t", ids, np.ones((1, 4)))
        monkeypatch.setattr(zeromq._ZmqPending, "wait", wait)
        np.testing.assert_array_equal(read_records(client, "t", ids)[0], [-2.0] * 4)


def test_only_the_owning_cluster_may_remap_or_stop_a_node(cluster):
    c, client = cluster
    ch = ZmqChannel(c.endpoints[4], zmq.Context.instance())
    for header in ({"op": "map", "endpoints": ["not-an-endpoint"], "dead": []},
                   {"op": "map", "endpoints": c.endpoints, "dead": [0, 1]},
                   {"op": "shutdown"}):
        assert ch.call(header, [], 5.0)[0]["error"] == "invalid"
    ch.close()
    assert all(c.state(p) == "up" for p in range(5))
    client.get("users", np.arange(700))


@pytest.mark.parametrize("bind", ["tcp://0.0.0.0:0", "tcp://198.18.0.1:0", "tcp://*:0"])
def test_a_node_without_keys_refuses_to_listen_beyond_loopback(bind):
    out = subprocess.run([sys.executable, "-m", "ectable", "node", "--bind", bind], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "without CURVE keys" in out.stderr and bind in out.stderr
    assert "READY" not in out.stdout


def test_many_failovers_do_not_exhaust_sockets():
    """Each ZeroMQ channel holds sockets, and a process has a bounded number (1023 per context: one
    rs kill loop ran out after 340 kills, and its decider could then no longer reach a new spare).
    Channels to nodes gone from the map are closed: a decider whose context allows 8 channels keeps
    putting spares in place through 10 failovers, and the client keeps channels only to the map's nodes."""
    from ectable.cluster.decider import Decider
    from ectable.process.control import ZmqControl
    import threading

    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 24)  # a channel holds 3 sockets (its own, and its monitor's pair)
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, spares=1, deciders=1) as cluster:
        cluster.kill_decider(0)  # this one takes over once its election lease ran out
        decider = Decider(cluster.store, ZmqControl(context), "decider/test", cluster._token)
        stop = threading.Event()

        def decide():
            while not stop.is_set():
                if not decider.step():
                    stop.wait(0.05)
        thread = threading.Thread(target=decide, daemon=True)
        thread.start()
        try:
            client = cluster.connect()
            client.create_table("t", num_rows=2000, dim=4, seed=1)
            ids = np.arange(2000)
            before = client.get("t", ids)
            for n in range(10):
                cluster.kill(n % 5)
                cluster.add_spare()
                client.wait_recovered(timeout=60)
                np.testing.assert_array_equal(client.get("t", ids), before)
                assert set(cluster._channels) <= set(cluster.endpoints)
                assert len(decider.control.channels) <= 6
        finally:
            stop.set()
            thread.join(10)
            decider.control.close()
            context.term()


def _scrape(port: int) -> dict:
    """{metric (with labels): value} of a node's /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def free_range(n: int) -> int:
    """The first of `n` consecutive free TCP ports of 127.0.0.1, below the kernel's ephemeral range (so no
    socket another test binds to port 0 meanwhile can take one)."""
    import random
    import socket
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    for _ in range(100):
        base, socks = random.randrange(10000, ephemeral - n), []
        try:
            for port in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def test_nodes_serve_prometheus_metrics():
    base = free_range(4)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, spares=1, processes=True, metrics_port=base,
                              window_seconds=0.05) as c:
        assert sorted(c.metrics.values()) == [base, base + 1, base + 2, base + 3]  # nodes and the spare
        assert c.describe()["metrics"]["ports"] == list(c.metrics.values())
        client = c.connect()
        client.create_table("t", 3000, 4)
        client.put("t", np.arange(3000), np.ones((3000, 4)))
        client.get("t", np.arange(100))
        client.flush()
        forged = ZmqChannel(c._map.endpoints[0], zmq.Context.instance())
        for i in range(3):  # ops no node takes count as one label, however many are sent
            assert forged.call({"op": f"forged-{i}"}, [], 10)[0]["error"] == "invalid"
        forged.close()
        ports = [c.metrics[e] for e in c._map.endpoints]
        assert [n["metrics_port"] for n in client.status()["nodes"]] == ports
        deadline = time.monotonic() + 30
        while True:  # the gauges follow the nodes' status about once a second
            scraped = [_scrape(port) for port in ports]
            if all(m.get("ectable_data_rows") == 1000 and m.get("ectable_parity_rows") == 500 for m in scraped) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for m in scraped:
            assert m["ectable_data_rows"] == 1000 and m["ectable_parity_rows"] == 500 and m["ectable_tables"] == 1
            assert m['ectable_requests_total{op="write"}'] >= 1 and m["ectable_rebuilding"] == 0
            assert m["ectable_resident_bytes"] > 1 << 20 and m["ectable_dirty_rows"] == 0
        assert scraped[0]['ectable_requests_total{op="unknown"}'] == 3 and not any("forged" in k for k in scraped[0])
        assert sum(m["ectable_rows_written_total"] for m in scraped) == 3000
        assert sum(m["ectable_rows_read_total"] for m in scraped) >= 100
        client.close()


FAULTS = """
import resource, sys
import numpy as np
from ectable.process.node_server import keep_freed_buffers
kept = keep_freed_buffers() if sys.argv[1] == "keep" else None
np.zeros(42_000_000, np.uint8)[::4096] = 1  # the first one is mapped either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # a rebuild round's stripe blocks, allocated, touched and freed round after round
    np.zeros(42_000_000, np.uint8)[::4096] = 1
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_node_process_keeps_freed_buffers_instead_of_faulting_them_in_anew():
    """A node process sets malloc to keep large freed buffers for reuse: ten 42 MB arrays, one after another,
    page-fault a fraction of what they do by default (where each is mapped anew and unmapped when freed)."""
    runs = {how: subprocess.run([sys.executable, "-c", FAULTS, how], capture_output=True, text=True, timeout=60,
                                check=True).stdout.split() for how in ("keep", "default")}
    if runs["keep"][0] != "True":
        pytest.skip("no glibc mallopt here")
    kept, default = int(runs["keep"][1]), int(runs["default"][1])
    if default < 1000:
        pytest.skip(f"by default they faulted only {default} times: nothing to compare")
    assert kept < default / 10
