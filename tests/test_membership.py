"""The membership conformance suite: every test runs against `MemoryMembership` (on a fake clock)
and `EtcdMembership` (on a real one-member etcd, one per module, a fresh key prefix per test).
What only one backend has is tested in test_membership_backends.py."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
import requests
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from ectable.errors import InvalidRequest
from ectable.membership import (Compacted, Compare, Delete, Event, EtcdMembership, LeaseNotFound, MembershipUnavailable,
                                MemoryMembership, Put)
from ectable.testing.membership import Collector, FakeClock, Harness, MembershipMachine


@pytest.fixture(params=["memory", "etcd"])
def h(request):
    if request.param == "memory":
        clock = FakeClock()
        harness = Harness("memory", MemoryMembership(clock=clock, min_ttl=1.0), clock)
    else:
        server = request.getfixturevalue("etcd_server")
        harness = Harness("etcd", EtcdMembership(server.endpoints, timeout=5.0), None, server)
    try:
        yield harness
    finally:
        try:
            harness.m.delete(harness.p, prefix=True)  # no key left for a lease to delete later
        finally:
            harness.m.close()
        assert not [t for t in threading.enumerate() if t.name.startswith("etcd-watch")], "close() left threads"


# --- keys and revisions ---
def test_put_get_and_versions(h):
    _, start = h.m.range(h.p)
    assert start >= 1
    k = h.p + "k"
    assert h.m.get(k) is None
    r1 = h.m.put(k, b"one")
    assert r1 == start + 1
    kv = h.m.get(k)
    assert (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.version, kv.lease) == (k, b"one", r1, r1, 1, 0)
    r2 = h.m.put(k, b"two")
    assert r2 == r1 + 1
    kv = h.m.get(k)
    assert (kv.value, kv.mod_revision, kv.create_revision, kv.version) == (b"two", r2, r1, 2)
    assert h.m.delete(k) == r2 + 1
    r4 = h.m.put(k, b"\x00\xff")
    kv = h.m.get(k)
    assert (kv.value, kv.create_revision, kv.version) == (b"\x00\xff", r4, 1)  # created anew after the delete


def test_revision_rules(h):
    a, b, c = h.p + "a", h.p + "b", h.p + "c"
    _, r = h.m.range(h.p)
    assert h.m.txn([], [Put(a, b"1"), Put(b, b"2"), Put(c, b"3")]) == (True, r + 1)  # one revision for all
    assert {kv.mod_revision for kv in h.m.range(h.p)[0]} == {r + 1}
    assert h.m.txn([Compare.absent(a)], [Put(a, b"x")]) == (False, r + 1)  # failed, no failure ops
    assert h.m.delete(h.p + "nothing") == r + 1  # removed nothing
    assert h.m.delete(h.p + "no/", prefix=True) == r + 1
    assert h.m.txn([], [Delete(h.p + "nothing")]) == (True, r + 1)
    assert h.m.txn([], []) == (True, r + 1)
    assert h.m.txn([], [Delete(h.p + "nothing"), Put(a, b"y")]) == (True, r + 2)
    assert h.m.delete(a) == r + 3
    assert h.m.delete(h.p, prefix=True) == r + 4  # b and c at once
    assert h.m.range(h.p) == ([], r + 4)


def test_range_and_prefix_delete(h):
    names = ["a", "a/x", "ab", "b", "é", "\U0001f600", "é/z"]
    for name in names:
        h.m.put(h.p + name, name.encode())
    kvs, rev = h.m.range(h.p)
    assert [kv.key for kv in kvs] == sorted(h.p + n for n in names)
    assert rev == max(kv.mod_revision for kv in kvs)
    assert [kv.key for kv in h.m.range(h.p + "a")[0]] == [h.p + "a", h.p + "a/x", h.p + "ab"]
    assert [kv.value for kv in h.m.range(h.p + "é")[0]] == ["é".encode(), "é/z".encode()]
    assert h.m.get(h.p + "\U0001f600").value == "\U0001f600".encode()
    h.m.delete(h.p + "a", prefix=True)
    assert [kv.key for kv in h.m.range(h.p)[0]] == sorted(h.p + n for n in ["b", "é", "\U0001f600", "é/z"])


def test_invalid_requests_change_nothing(h):
    k = h.p + "k"
    _, r = h.m.range(h.p)
    for success in ([Put(k, b"1"), Put(k, b"2")], [Put(k, b"1"), Delete(k)], [Delete(h.p, prefix=True), Put(k, b"")],
                    [Put("", b"")]):
        with pytest.raises(InvalidRequest):
            h.m.txn([], success)
        with pytest.raises(InvalidRequest):
            h.m.txn([], [], success)
    with pytest.raises(InvalidRequest):
        h.m.txn([Compare(k, "lease", 0)], [])
    with pytest.raises(InvalidRequest):
        h.m.txn([Compare(k, "mod", b"1")], [])
    with pytest.raises(InvalidRequest):
        h.m.get("")
    assert h.m.range(h.p) == ([], r)


# --- transactions ---
@pytest.mark.parametrize("target", ["absent", "unchanged", "version", "value", "create"])
def test_compare_targets(h, target):
    k, won = h.p + "k", h.p + "branch"

    def branch(compare: Compare) -> bool:
        held, _ = h.m.txn([compare], [Put(won, b"success")], [Put(won, b"failure")])
        assert h.m.get(won).value == (b"success" if held else b"failure")
        return held

    if target == "absent":
        assert branch(Compare.absent(k))
        h.m.put(k, b"v")
        assert not branch(Compare.absent(k))
    elif target == "unchanged":
        assert branch(Compare.unchanged(k, 0))
        rev = h.m.put(k, b"v")
        assert branch(Compare.unchanged(k, rev))
        assert not branch(Compare.unchanged(k, rev - 1)) and not branch(Compare.unchanged(k, 0))
        h.m.put(k, b"v")
        assert not branch(Compare.unchanged(k, rev))
    elif target == "version":
        assert branch(Compare(k, "version", 0))
        h.m.put(k, b"v")
        h.m.put(k, b"v")
        assert branch(Compare(k, "version", 2))
        assert not branch(Compare(k, "version", 1))
    elif target == "value":
        assert not branch(Compare(k, "value", b""))  # an absent key has no value
        h.m.put(k, b"v")
        assert branch(Compare(k, "value", b"v"))
        assert not branch(Compare(k, "value", b"w"))
    else:
        rev = h.m.put(k, b"v")
        h.m.put(k, b"w")
        assert branch(Compare(k, "create", rev))
        assert not branch(Compare(k, "create", rev + 1))


def test_compare_and_swap_race(h):
    k = h.p + "k"
    for round_ in range(10 if h.kind == "memory" else 4):
        rev = h.m.put(k, b"start")
        barrier, results = threading.Barrier(2), {}

        def writer(name: str) -> None:
            barrier.wait(5)
            results[name] = h.m.txn([Compare.unchanged(k, rev)], [Put(k, name.encode())])[0]

        threads = [threading.Thread(target=writer, args=(n,)) for n in ("one", "two")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert sorted(results.values()) == [False, True], round_
        winner = [n for n, won in results.items() if won][0]
        assert h.m.get(k).value == winner.encode() and h.m.get(k).mod_revision == rev + 1


def test_no_lost_updates(h):
    k, threads_n, each = h.p + "counter", 3, 20 if h.kind == "memory" else 5
    h.m.put(k, b"0")

    def increment() -> None:
        for _ in range(each):
            while True:
                kv = h.m.get(k)
                if h.m.txn([Compare.unchanged(k, kv.mod_revision)], [Put(k, b"%d" % (int(kv.value) + 1))])[0]:
                    break

    threads = [threading.Thread(target=increment) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert int(h.m.get(k).value) == threads_n * each


# --- leases ---
def test_lease_expiry_deletes_keys_at_one_revision(h):
    a, b = h.p + "a", h.p + "b"
    lease = h.m.grant(h.ttl / 2)  # rounded up to min_ttl
    assert lease != 0
    h.m.put(a, b"1", lease)
    rev = h.m.put(b, b"2", lease)
    assert h.m.get(a).lease == lease
    h.elapse(h.ttl * 0.5)
    assert h.m.get(a) is not None
    h.elapse(h.ttl * 0.6)
    assert h.eventually(lambda: h.m.get(a) is None and h.m.get(b) is None)
    assert h.m.range(h.p) == ([], rev + 1)
    assert h.m.keepalive(lease) is False
    with pytest.raises(LeaseNotFound):
        h.m.put(a, b"again", lease)
    assert h.m.txn([Compare.absent(a)], [Put(b, b"")], [Put(a, b"", lease)]) == (True, rev + 2)  # branch not taken


def test_keepalive_keeps_keys(h):
    k = h.p + "k"
    lease = h.m.grant(h.ttl)
    h.m.put(k, b"alive", lease)
    for _ in range(6):  # twice the ttl
        h.elapse(h.ttl / 3)
        assert h.m.keepalive(lease) is True
        assert h.m.get(k) is not None
    h.elapse(h.ttl * 1.1)
    assert h.eventually(lambda: h.m.get(k) is None)
    assert h.m.keepalive(lease) is False
    h.elapse(0.1)
    assert h.m.keepalive(lease) is False and h.m.get(k) is None  # never revived
    assert h.m.keepalive(7_777_777) is False  # never granted


def test_revoke_deletes_now(h):
    a, b, detached = h.p + "a", h.p + "b", h.p + "detached"
    lease = h.m.grant(30)
    h.m.put(a, b"1", lease)
    h.m.put(b, b"2", lease)
    h.m.put(detached, b"3", lease)
    rev = h.m.put(detached, b"3")  # a put without the lease takes the key off it
    h.m.revoke(lease)
    assert h.m.get(a) is None and h.m.get(b) is None
    assert h.m.range(h.p)[1] == rev + 1
    assert h.m.get(detached).value == b"3"
    h.m.revoke(lease)  # gone already: no error
    h.m.revoke(7_777_777)
    assert h.m.keepalive(lease) is False
    empty = h.m.grant(30)
    h.m.revoke(empty)
    assert h.m.range(h.p)[1] == rev + 1  # a lease without keys ends without a revision


# --- watches ---
def test_watch_sees_every_event_once_in_order(h):
    w, c = h.p + "w/", Collector()
    watch = h.m.watch(w, c)
    r1 = h.m.put(w + "a", b"1")
    r2 = h.m.put(w + "b", b"2")
    h.m.put(h.p + "elsewhere", b"x")
    r3 = h.m.txn([], [Put(w + "c", b"3"), Delete(w + "a")])[1]
    r4 = h.m.delete(w, prefix=True)
    r5 = h.m.put(w + "a", b"4")
    expected = [Event("put", w + "a", b"1", r1), Event("put", w + "b", b"2", r2), Event("put", w + "c", b"3", r3),
                Event("delete", w + "a", b"", r3), Event("delete", w + "b", b"", r4),
                Event("delete", w + "c", b"", r4), Event("put", w + "a", b"4", r5)]
    assert h.settle(w, c, len(expected)) == expected
    watch.cancel()


def test_watch_from_start_revision(h):
    w = h.p + "w/"
    r1 = h.m.put(w + "a", b"1")
    r2 = h.m.put(w + "b", b"2")
    r3 = h.m.delete(w + "a")
    c, later = Collector(), Collector()
    h.m.watch(w, c, start_revision=r1)
    h.m.watch(w, later, start_revision=r2)
    r4 = h.m.put(w + "c", b"3")
    history = [Event("put", w + "a", b"1", r1), Event("put", w + "b", b"2", r2), Event("delete", w + "a", b"", r3),
               Event("put", w + "c", b"3", r4)]
    assert h.settle(w, c, 4) == history
    assert later.wait(4) == history[1:] + [Event("put", w + "~sentinel", b"", r4 + 1)]


def test_cancel_stops_callbacks(h):
    w, cancelled, kept = h.p + "w/", Collector(), Collector()
    first = h.m.watch(w, cancelled)
    h.m.watch(w, kept)
    h.m.put(w + "a", b"1")
    assert len(cancelled.wait(1)) == 1
    first.cancel()
    first.cancel()  # twice: no error
    h.m.put(w + "b", b"2")
    assert len(h.settle(w, kept, 2)) == 2
    assert len(cancelled.events) == 1


def test_watch_sees_lease_expiry(h):
    w, c = h.p + "w/", Collector()
    h.m.watch(w, c)
    lease = h.m.grant(h.ttl)
    rev = h.m.put(w + "a", b"1", lease)
    h.m.put(w + "b", b"2", lease)
    h.elapse(h.ttl * 1.1)
    if h.clock is not None:
        assert h.m.expire() == 1
    events = c.wait(4, timeout=h.ttl + 5)
    assert events == [Event("put", w + "a", b"1", rev), Event("put", w + "b", b"2", rev + 1),
                      Event("delete", w + "a", b"", rev + 2), Event("delete", w + "b", b"", rev + 2)]


def test_watch_of_compacted_revision(h):
    store = MemoryMembership(history=4) if h.kind == "memory" else h.m
    first = store.put(h.p + "a", b"0")
    for i in range(6):
        store.put(h.p + "a", b"%d" % i)
    if h.kind == "etcd":  # etcd keeps every revision until told to compact
        requests.post(h.server.endpoints[0] + "/v3/kv/compaction", json={"revision": first + 3},
                      timeout=5).raise_for_status()
    with pytest.raises(Compacted):
        store.watch(h.p, Collector(), start_revision=first)
    c = Collector()
    watch = store.watch(h.p, c, start_revision=first + 4)
    assert [e.mod_revision for e in c.wait(3)] == [first + 4, first + 5, first + 6]
    watch.cancel()


# --- unavailability ---
def _states(pid: int) -> set[str]:
    """The state letters of the threads of process `pid` ("T": stopped), as /proc says."""
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                out.add(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return out


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of `pid` stopped (one inside a system call, etcd's fsync, stops when it returns)."""
    deadline = time.monotonic() + timeout
    while not _states(pid) <= {"T", "t"}:
        assert time.monotonic() < deadline, f"etcd {pid} did not stop: thread states {_states(pid)}"
        time.sleep(0.01)


def test_unavailable_raises_within_timeout(h, request):
    if h.kind == "memory":
        pytest.skip("the memory backend is always available")
    own_etcd = request.getfixturevalue("own_etcd")
    m = EtcdMembership(own_etcd.endpoints, timeout=1.0)
    try:
        m.put("k", b"v")
        lease = m.grant(30)
        watch = m.watch("", Collector())
        os.kill(own_etcd.pid, signal.SIGSTOP)  # answers nothing, but accepts connections
        try:
            _wait_stopped(own_etcd.pid)
            for name, call in (("get", lambda: m.get("k")), ("put", lambda: m.put("k", b"w")),
                               ("keepalive", lambda: m.keepalive(lease)), ("watch", lambda: m.watch("", Collector()))):
                start = time.monotonic()
                try:
                    call()
                except MembershipUnavailable:
                    pass
                else:
                    pytest.fail(f"{name} was answered by a stopped etcd (thread states {_states(own_etcd.pid)})")
                assert time.monotonic() - start < 2.5
        finally:
            os.kill(own_etcd.pid, signal.SIGCONT)
        own_etcd.stop()
        start = time.monotonic()
        watch.cancel()  # while its thread tries to reconnect
        assert time.monotonic() - start < 2.5
        for call in (lambda: m.range(""), lambda: m.txn([], []), lambda: m.grant(1), lambda: m.revoke(lease),
                     lambda: m.watch("", Collector(), start_revision=1)):
            start = time.monotonic()
            with pytest.raises(MembershipUnavailable):
                call()
            assert time.monotonic() - start < 2.5
    finally:
        m.close()


# --- random operations against a dict model ---
def test_state_machine_memory():
    class Machine(MembershipMachine):
        def make_store(self):
            clock = FakeClock()
            return MemoryMembership(clock=clock), "m/", clock

    run_state_machine_as_test(Machine)


def test_state_machine_etcd(etcd_server):
    class Machine(MembershipMachine):
        def make_store(self):
            return EtcdMembership(etcd_server.endpoints), f"sm/{uuid.uuid4().hex[:8]}/", None

    run_state_machine_as_test(Machine, settings=settings(settings(), max_examples=5, stateful_step_count=20))
