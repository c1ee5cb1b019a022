"""What only one membership backend has: the memory store's speed and lock discipline; the etcd
client's endpoint failover and watch resumption; `EtcdServer`'s process handling."""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest

from ectable.membership import Compare, EtcdMembership, EtcdServer, Event, MemoryMembership
from ectable.testing.membership import Collector


# --- memory backend only ---
def test_memory_callbacks_run_outside_the_lock():
    m, seen = MemoryMembership(), []
    m.watch("", lambda events: seen.append(m.get(events[0].key)))  # reading back is tolerated in memory
    done = threading.Thread(target=m.put, args=("k", b"v"), daemon=True)
    done.start()
    done.join(5)
    assert not done.is_alive() and seen[0].value == b"v"


def test_memory_is_fast():
    m = MemoryMembership()
    for i in range(5):
        m.watch(f"w{i}/", lambda events: None)
    lease = m.grant(60)
    start = time.perf_counter()
    for i in range(5000):
        rev = m.put(f"w{i % 7}/k{i % 50}", b"v", lease if i % 3 == 0 else 0)
        m.txn([Compare.unchanged("w0/k0", 0)], [], [])
    assert rev == 5001
    assert time.perf_counter() - start < 5.0


# --- etcd backend only ---
def test_etcd_watch_resumes_after_restart(own_etcd):
    m, c = EtcdMembership(own_etcd.endpoints, timeout=2.0), Collector()
    try:
        watch = m.watch("w/", c)
        r1 = m.put("w/a", b"1")
        assert len(c.wait(1)) == 1
        own_etcd.restart()
        r2 = m.put("w/b", b"2")
        r3 = m.delete("w/a")
        assert c.wait(3, timeout=15) == [Event("put", "w/a", b"1", r1), Event("put", "w/b", b"2", r2),
                                         Event("delete", "w/a", b"", r3)]
        assert watch.error is None
    finally:
        m.close()


def test_etcd_moves_on_from_an_endpoint_that_refuses(etcd_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    m, c = EtcdMembership([dead, *etcd_server.endpoints], timeout=2.0), Collector()
    prefix = f"t/{uuid.uuid4().hex[:8]}/"
    try:
        m.watch(prefix, c)
        rev = m.put(prefix + "a", b"1")  # a txn too: a refused connection surely sent nothing
        assert m.get(prefix + "a").mod_revision == rev
        assert c.wait(1) == [Event("put", prefix + "a", b"1", rev)]
        m.delete(prefix, prefix=True)
    finally:
        m.close()


def test_etcd_server_stops_its_process_and_its_min_ttl_is_learnt():
    server = EtcdServer(heartbeat_ms=100, election_ms=1000)  # etcd's own defaults: leases of 2 s at least
    try:
        server.start()
        pid, endpoints, data = server.pid, server.endpoints, server.data_dir
        assert endpoints[0].startswith("http://127.0.0.1:") and server.min_ttl == 2 and os.path.isdir(data)
        m = EtcdMembership(endpoints)
        assert m.min_ttl == 1
        lease = m.grant(1)
        assert m.min_ttl == 2 and m.keepalive(lease)
        m.close()
    finally:
        server.stop()
    assert server.pid is None and not os.path.exists(data)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
