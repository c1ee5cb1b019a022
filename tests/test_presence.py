"""A node process's presence thread on a real etcd: it keeps its lease, and reads the map and the live
writers when a watch says they changed, not at every beat."""
import time
import uuid

import pytest

from ectable.cluster.map import Map
from ectable.cluster.store import open_store
from ectable.config import ClusterConfig
from ectable.process import node_server
from ectable.process.node_server import _Presence

pytestmark = pytest.mark.timeout(120)


class _Node:
    """What the presence reads of a node: whether it waits for writers to replay."""

    def __init__(self):
        self.replay_from, self.late = None, {}


class _Server:
    """What the presence reads of its node process."""

    def __init__(self, membership: dict):
        self.membership, self.endpoint, self.node = membership, "tcp://127.0.0.1:1", _Node()

    def beat(self) -> dict:
        return {"endpoint": self.endpoint, "source": None, "position": None, "rebuilding": False, "generation": 0}


@pytest.fixture
def presence(etcd_server, monkeypatch):
    """A presence thread of its own cluster prefix, which resyncs only every 60 s, and a store of that prefix;
    its reads of the map are counted."""
    monkeypatch.setattr(node_server, "RESYNC", 60.0)
    section = {"endpoints": etcd_server.endpoints, "prefix": f"/presence-{uuid.uuid4().hex[:8]}"}
    thread = _Presence(_Server(section))
    reads, read_map = [], thread.store.read_map

    def counted():
        reads.append(time.monotonic())
        return read_map()

    thread.store.read_map = counted
    store = open_store(section)
    thread.start()
    try:
        yield thread, store, reads
    finally:
        thread.stop.set()
        thread.changed.set()
        thread.join(10)
        store.membership.close()
        assert not thread.is_alive()


def _until(what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.02)


def test_an_unchanged_store_is_not_read_again_at_every_beat(presence):
    thread, store, reads = presence
    _until(lambda: thread.writers is not None)  # the first read
    _until(lambda: thread.store.membership.get(store.alive_prefix + thread.server.endpoint) is not None)
    first, taken, since = len(reads), thread.writers_read, thread.writers_since
    time.sleep(4 * node_server.HEARTBEAT)  # four beats: the lease kept alive, nothing changed
    assert len(reads) == first
    assert store.presence()[thread.server.endpoint]["endpoint"] == thread.server.endpoint
    # the writers last read are taken as alive at every beat (the watch saw none go): a node counts a writer's
    # absence from when it went, not from a read up to RESYNC s before
    assert thread.writers_read >= taken + 2 and thread.writers_since > since


def test_a_new_map_and_a_new_writer_are_read_once_the_watch_sees_them(presence):
    thread, store, reads = presence
    _until(lambda: thread.writers is not None)
    assert thread.map is None
    config = ClusterConfig(nodes=3, code="xor", k=2, r=1).get_config()
    written = store.swap_map(None, Map.initial(config, ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002",
                                                        "tcp://127.0.0.1:7003"]))
    _until(lambda: thread.map is not None and thread.map.epoch == written.epoch)
    lease = store.membership.grant(10)
    store.register_writer("writer/a", lease)
    _until(lambda: thread.writers == {"writer/a"})
    store.membership.revoke(lease)  # the writer's key goes with its lease: a delete the watch sees too
    _until(lambda: thread.writers == set())


def test_a_node_waiting_for_replays_reads_the_writers_at_every_beat(presence):
    thread, store, reads = presence
    _until(lambda: thread.writers is not None)
    thread.server.node.replay_from = {"writer/a"}
    counted = len(reads)
    _until(lambda: len(reads) >= counted + 3)  # with no change in the store
    thread.server.node.replay_from = None
    time.sleep(node_server.HEARTBEAT)  # the beat under way, if any, ends
    settled = len(reads)
    time.sleep(3 * node_server.HEARTBEAT)
    assert len(reads) <= settled + 1  # at most a beat that was under way
