"""A cluster on separate hosts: every etcd member, decider, node, spare and trainer in a network namespace
of its own with its own address (198.18.0.0/24), joined by a bridge, no route out of the machine.
Partitions are links taken down and blackhole routes, not kills. Needs root (skipped without)."""
import itertools
import json
import sys
import time

import pytest

from ectable.testing import netns
from ectable.testing.host_cluster import HostCluster

WHY = netns.available()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"no network namespaces here: {WHY}"),
              pytest.mark.timeout(600)]
TABLES = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with netns.Hosts() as hosts:
        cluster = HostCluster(hosts, str(tmp_path_factory.mktemp("hosts")), nodes=8, spares=1, etcd=3, trainers=2)
        cluster.up()
        yield cluster


@pytest.fixture
def trainers(cluster, request):
    """Two trainers, each on its own host with a table of its own; every one is checked when the test ends."""
    cluster.wait(cluster.whole, 180, "every position served and the spare free")
    name = f"t{next(TABLES)}"  # a table (and files) of its own per test
    started = [cluster.trainer(f"trainer-{i}", f"{name}-{i}", seed=i) for i in range(2)]
    for trainer in started:
        trainer.wait_steps(5, 120)
    yield started
    for trainer in started:
        if trainer.proc.poll() is None:
            trainer.finish()


def checked(trainer, errors_allowed=False) -> dict:
    final = trainer.finish()
    assert final["stale"] == 0 and final["lost"] == 0, (final, trainer.tail())
    assert errors_allowed or final["errors"] == 0, (final, trainer.errors())
    return final


def ask(cluster, host: str, endpoint: str, headers: list[dict]) -> list[dict]:
    """Send requests to one node from `host` (with that host's client key) and return the replies."""
    code = f"""
import json
import zmq
from ectable import config, security
from ectable.protocol import messages
from ectable.transport.zeromq import ZmqChannel
curve = security.checked(config.load({cluster.file(host)!r}).get("security"))
channel = ZmqChannel({endpoint!r}, zmq.Context(), curve, connect_timeout=5)
replies = [channel.call(messages.parse(h).header(), [], 10)[0] for h in {headers!r}]
print(json.dumps(replies, default=str))
channel.close()
"""
    done = cluster.python(host, code)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_eight_nodes_and_two_trainers_each_on_a_host_of_its_own(cluster, trainers):
    status = cluster.status()
    endpoints = [n["endpoint"] for n in status["nodes"]]
    assert endpoints == [cluster.endpoint(f"node-{i}") for i in range(8)]
    assert all(e.startswith("tcp://198.18.0.") for e in endpoints)  # no loopback anywhere
    assert len({n["pid"] for n in status["nodes"]}) == 8 and all(n["role"] == "active" for n in status["nodes"])
    for host in cluster.hosts.addresses:  # a route to the bridge's subnet only: nothing leaves the machine
        main = [r for r in cluster.hosts.routes(host) if " table " not in r and not r.startswith("fe80")]
        assert main == [f"198.18.0.0/24 dev eth0 proto kernel scope link src {cluster.hosts.addresses[host]} "], main
    for trainer in trainers:
        trainer.wait_steps(30, 120)
    finals = [checked(t) for t in trainers]
    assert all(f["steps"] >= 30 for f in finals)


def test_a_node_cut_off_is_failed_over_and_fenced_when_it_returns(cluster, trainers):
    before = cluster.status()
    old = cluster.endpoint("node-3")
    assert before["nodes"][3]["endpoint"] == old
    cluster.hosts.cut("node-3")
    try:
        status = cluster.wait(lambda s: s["nodes"][3].get("endpoint") == cluster.endpoint("spare-0"), 60,
                              "position 3 given to the spare")
        assert status["epoch"] > before["epoch"]
        for trainer in trainers:  # training goes on while the cut-off node is away
            trainer.wait_steps(20, 120)
    finally:
        cluster.hosts.heal("node-3")
    # back on the network, it learns it is fenced: it drops its shards and waits as a spare
    cluster.wait(lambda s: s["spares"] == 1, 60, "the cut-off node back as a spare")
    table = trainers[0].table
    replies = ask(cluster, "ops", old, [{"op": "ping"}, {"op": "get_many", "tables": [table]},
                                        {"op": "write", "parts": [[table, "put"]], "cid": "w/1", "cseq": 1}])
    assert replies[0]["position"] is None  # a spare: it holds no position and no rows
    assert [r.get("error") for r in replies[1:]] == ["not_member", "not_member"], replies  # serves and takes nothing
    for trainer in trainers:
        trainer.wait_steps(20, 120)
    for trainer in trainers:
        checked(trainer)


def test_a_trainer_cut_off_from_one_node_gets_a_clear_error_never_a_stale_row(cluster, trainers):
    before = cluster.status()
    cut, other = trainers
    cluster.hosts.block("trainer-0", "node-5")
    try:
        deadline = time.monotonic() + 120
        while not cut.errors() and time.monotonic() < deadline:
            time.sleep(0.5)
        errors = cut.errors()
        assert errors and errors[0]["error"] == "Unavailable" and "node 5" in errors[0]["message"], (errors, cut.tail())
        other.wait_steps(20, 60)  # the other trainer reaches every node: it goes on
    finally:
        cluster.hosts.unblock("trainer-0", "node-5")
    cut.wait_steps(20, 120)  # and once the partition heals, so does the cut-off one
    after = cluster.status()
    assert [n["endpoint"] for n in after["nodes"]] == [n["endpoint"] for n in before["nodes"]]  # no failover
    checked(cut, errors_allowed=True)
    checked(other)


def etcd_leader(cluster) -> str:
    """The host of the etcd member that leads now."""
    code = f"""
import json, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
out = {{}}
for host, address in {dict((e, cluster.hosts.addresses[e]) for e in cluster.etcd)!r}.items():
    with opener.open(urllib.request.Request(f"http://{{address}}:2379/v3/maintenance/status", data=b"{{}}"), timeout=5) as r:
        status = json.load(r)
    out[host] = (status["header"]["member_id"], status["leader"])
print(json.dumps(out))
"""
    done = cluster.python("ops", code)
    assert done.returncode == 0, done.stderr
    members = json.loads(done.stdout)
    return next(host for host, (me, leader) in members.items() if me == leader)


@pytest.mark.parametrize("members", ["leader", "all"])
def test_etcd_cut_off_stops_no_training(cluster, trainers, members):
    before = cluster.status()
    away = [etcd_leader(cluster)] if members == "leader" else cluster.etcd
    for host in away:
        cluster.hosts.cut(host)
    try:
        began = time.monotonic()
        for trainer in trainers:  # no step needs the store: every trainer goes on while it is away
            trainer.wait_steps(40, 60)
        time.sleep(max(0.0, 8 - (time.monotonic() - began)))  # longer than a node's lease
    finally:
        for host in away:
            cluster.hosts.heal(host)
    time.sleep(3)
    after = cluster.status()
    assert [(n["endpoint"], n["source"]) for n in after["nodes"]] == [(n["endpoint"], n["source"]) for n in before["nodes"]]
    assert after["epoch"] == before["epoch"]  # no map change: nothing was failed over
    for trainer in trainers:
        checked(trainer)


def test_a_lone_etcd_member_cut_off_fails_no_node_over(tmp_path):
    """One etcd member (no quorum elsewhere) runs out every lease while it is cut off. When it is back, nodes
    announce themselves again before the decider, which leads again under a new lease, declares anyone dead;
    writers whose leases ran out are told to connect again, and a new connection trains."""
    with netns.Hosts() as hosts:
        cluster = HostCluster(hosts, str(tmp_path), nodes=6, spares=0, etcd=1, trainers=1)
        cluster.up()
        before = cluster.status()
        trainer = cluster.trainer("trainer-0", "lone", seed=0)
        trainer.wait_steps(5, 120)
        cluster.hosts.cut("etcd-0")
        try:
            trainer.wait_steps(40, 60)  # training goes on while the store is away
            time.sleep(5)  # longer than every lease
        finally:
            cluster.hosts.heal("etcd-0")
        time.sleep(6)
        after = cluster.status()
        assert [n["source"] for n in after["nodes"]] == [n["source"] for n in before["nodes"]]
        assert after["epoch"] == before["epoch"]  # nobody was declared dead
        final = trainer.finish()
        assert final["stale"] == 0 and final["lost"] == 0, final
        assert {e["message"].split(" (")[0] for e in trainer.errors()} <= {"this client's writer lease expired"}
        again = cluster.trainer("trainer-0", "lone", seed=1)  # a new connection, the same table
        again.wait_steps(20, 120)
        assert checked(again)["errors"] == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
