"""Failover decisions as pure functions of the map and the nodes' presence (no I/O)."""
import numpy as np

from ectable.cluster import plans
from ectable.cluster.map import Map
from ectable.config import ClusterConfig
from ectable.storage.table import TableSpec

CONFIG = ClusterConfig(nodes=6, code="rs", k=4, r=2)


def cluster_map(n=6):
    m = Map.initial(CONFIG.get_config(), [f"tcp://127.0.0.1:{7000 + p}" for p in range(n)])
    for p in range(n):
        m = m.with_position(p, source=f"node/{p}/a")
    return m.replace(epoch=5)


def presence(m, **changes):
    out = {e: {"endpoint": e, "source": s, "position": p, "rebuilding": False, "generation": 0}
           for p, (e, s) in enumerate(zip(m.endpoints, m.sources))}
    for endpoint, info in changes.items():
        if info is None:
            del out[endpoint]
        else:
            out[endpoint] = info
    return out


def test_the_map_round_trips_and_changes_by_copy():
    m = cluster_map()
    again = Map.decode(m.encode(), 9)
    assert again.replace(epoch=5) == m and again.epoch == 9
    moved = m.with_position(2, state="rebuilding", generation=3)
    assert moved.states[2] == "rebuilding" and moved.generations[2] == 3 and m.states[2] == "up"


def test_a_node_whose_presence_is_gone_or_replaced_is_silent():
    m = cluster_map()
    assert plans.silent(m, presence(m)) == []
    e1, e4 = m.endpoints[1], m.endpoints[4]
    restarted = {"endpoint": e4, "source": None, "position": None, "rebuilding": False, "generation": 0}
    assert plans.silent(m, presence(m, **{e1: None, e4: restarted})) == [1, 4]
    assert plans.silent(m.with_position(1, state="dead"), presence(m, **{e1: None})) == []  # already dead
    assert plans.silent(m.with_position(1, source=None), presence(m, **{e1: None})) == []  # not started yet


def test_declaring_dead_fences_the_identity_and_marks_it_for_reconciling():
    m = plans.declare_dead(cluster_map(), [1, 3])
    assert m.dead() == [1, 3]
    assert m.fenced == ("node/1/a", "node/3/a") and m.failing == ((1, "node/1/a"), (3, "node/3/a"))


def test_states_follow_reports_but_never_an_older_generation():
    m = cluster_map().with_position(2, state="rebuilding", generation=2)
    e2 = m.endpoints[2]
    old = {"endpoint": e2, "source": "node/2/a", "position": 2, "rebuilding": False, "generation": 1}
    assert plans.rebuild_states(m, presence(m, **{e2: old})) == m  # a report from before it was told to rebuild
    done = dict(old, generation=2)
    assert plans.rebuild_states(m, presence(m, **{e2: done})).states[2] == "up"
    told = dict(old, rebuilding=True, generation=3)
    after = plans.rebuild_states(cluster_map(), presence(m, **{e2: told}))
    assert after.states[2] == "rebuilding" and after.generations[2] == 3


def test_a_position_is_given_only_to_a_node_that_announced_itself():
    # a node started by hand after the decider answered its map before its presence (with its CURVE key) was
    # read: it went in the map without a key, and every peer refused its deltas for good (found on namespaces)
    m = Map.initial(CONFIG.get_config(), [f"tcp://198.18.0.{p}:7000" for p in range(1, 7)]).with_position(0, source="node/0/a")
    seen = {e: {"endpoint": e, "source": None, "position": None, "key": "K"} for e in m.endpoints[2:5]}
    assert plans.unassigned(m, seen) == [2, 3, 4]
    assert plans.unassigned(m.with_position(3, state="dead"), seen) == [2, 4]


def test_spares_and_strays():
    m = plans.declare_dead(cluster_map(), [1])
    spare = {"endpoint": "tcp://127.0.0.1:9000", "source": None, "position": None}
    stray = {"endpoint": "tcp://127.0.0.1:9001", "source": "node/1/b", "position": 1}
    fenced = {"endpoint": m.endpoints[1], "source": "node/1/a", "position": 1}
    seen = presence(m, **{spare["endpoint"]: spare, stray["endpoint"]: stray, m.endpoints[1]: fenced})
    assert plans.free_spares(m, seen) == [spare["endpoint"]]
    assert plans.strays(m, seen) == ["node/1/b"]  # it holds position 1 but the map does not give it


def test_a_handover_in_flight_is_no_stray_and_a_node_it_left_frozen_is_thawed():
    m = cluster_map()
    taking = {"endpoint": "tcp://127.0.0.1:9000", "source": "node/2/a", "position": 2}  # a spare given position 2
    seen = presence(m, **{taking["endpoint"]: taking})
    assert plans.strays(m, seen) == [] and plans.silent(m, seen) == []  # the map's identity: the old node still
    moved = m.with_position(2, endpoint=taking["endpoint"])  # serves it, or the new one does
    assert plans.strays(moved, seen) == [] and plans.silent(moved, seen) == []
    assert plans.strays(m, presence(m, **{taking["endpoint"]: {**taking, "source": "node/2/b"}})) == ["node/2/b"]
    assert plans.frozen(m, seen) == []
    frozen = presence(m, **{m.endpoints[3]: {**seen[m.endpoints[3]], "frozen": True}})
    assert plans.frozen(m, frozen) == [m.endpoints[3]]
    assert plans.frozen(plans.declare_dead(m, [3]), frozen) == []
    spare = "tcp://127.0.0.1:9001"  # a spare given a node whose map change never came
    given = presence(m, **{spare: {"endpoint": spare, "source": None, "position": None, "pending": "node/2/c"}})
    assert plans.given(m, given) == [spare] and plans.given(m, seen) == []
    assert plans.given(m.with_position(2, endpoint=spare), given) == []  # the map gives it: taken, or about to be


def test_no_grow_while_a_writer_may_still_replay_late_into_a_replacement():
    """A writer awaited past a replacement's deadline replays at once when it next calls: a grow that laid the
    cluster out meanwhile would leave nowhere for those writes to go."""
    m, spare = cluster_map(), "tcp://127.0.0.1:9001"
    seen = presence(m, **{spare: {"endpoint": spare, "source": None, "position": None}})
    assert plans.growable(m, seen, {spare: 1}) == spare
    late = {**seen, m.endpoints[4]: {**seen[m.endpoints[4]], "late": 1}}
    assert plans.late_replays(m, late) == 1 and plans.growable(m, late, {spare: 1}) is None
    assert plans.grow_waits(m, late).startswith("1 writer(s) may still replay") and plans.grow_waits(m, seen) is None
    late[m.endpoints[4]]["late"] = "many"  # a presence not of our making counts for nothing
    assert plans.growable(m, late, {spare: 1}) == spare
    assert plans.growable(plans.declare_dead(m, [4]), seen, {spare: 1}) is None  # and none with a position down
    assert plans.grow_waits(plans.declare_dead(m, [4]), seen) == "position 4 is dead: a grow waits until every " \
                                                                 "position is up"


def test_only_holders_behind_a_stripes_most_advanced_forget_their_parity():
    layout = CONFIG.layout(TableSpec.from_config({"name": "t", "num_rows": 4000, "dim": 4, "seed": 0}))
    stripes, holders = plans.reconcile_stripes(layout, 2)
    assert (holders != 2).all() and holders.shape == (stripes.size, 2)
    score = np.array([7, 7, -1, 7, 7, 7])
    assert plans.stale_parity(stripes, holders, score, {}) == {}  # every survivor holds the same
    score[4] = 6  # node 4 missed the dead node's last window
    stale = plans.stale_parity(stripes, holders, score, {})
    assert list(stale) == [4]
    np.testing.assert_array_equal(stale[4], stripes[(holders == 4).any(axis=1)])
    rows = (holders == 5).any(axis=1)  # node 5 rebuilds, and lacks its first parity row: it counts for nothing
    has = np.ones(rows.sum(), dtype=bool)
    has[0] = False
    stale = plans.stale_parity(stripes, holders, score, {5: has})
    assert 5 not in stale  # a holder that lacks the row is never told to forget more
    first = stripes[rows][0]
    other = holders[stripes == first][0]
    assert first not in stale.get(int(other[other != 5][0]), [])  # its stripe's other holder is now the most advanced


def test_a_reconciled_nodes_marks_are_kept_in_the_map():
    m = plans.declare_dead(cluster_map(), [2])
    settled = m.settle(2, "node/2/a", {0: {"c1": 4}, 1: {"c1": 3, "c2": 1}}, [[1, "t", [5, 7]]])
    assert settled.failing == () and settled.settled_marks("node/2/b") is None
    again = Map.decode(settled.encode(), 9)
    assert again.settled_marks("node/2/a") == ({0: {"c1": 4}, 1: {"c1": 3, "c2": 1}}, [(1, "t", [5, 7])])
    for n in range(80):  # only the last ones are kept
        again = again.settle(0, f"node/0/{n}", {}, [])
    assert again.settled_marks("node/2/a") is None and again.settled_marks("node/0/79") == ({}, [])


def test_a_reconcile_too_large_to_record_only_leaves_failing():
    m = plans.declare_dead(cluster_map(), [2]).settle(2, "node/2/a", {0: {"c1": 4}}, None)
    assert m.failing == () and m.settled == () and m.settled_marks("node/2/a") is None


def test_a_dead_nodes_holders_roll_back_to_the_lowest_window_any_holds():
    assert plans.rollback_level({0: 5, 1: 4, 3: 5}, {0: 3, 1: 4, 3: 4}) == 4
    assert plans.rollback_level({0: 5, 1: 4, 3: 5}, {0: 3, 1: 4, 3: 5}) is None  # node 3 no longer keeps window 5
    # node 1's level is unknown (a spare rebuilding that took none of the dead node's deltas): its parity rows
    # were rebuilt from its data at various moments, and may be its stripes' only holder (xor): the decider
    # falls back to forgetting only rows behind
    assert plans.rollback_level({0: 5, 1: None, 3: 4}, {0: 4, 1: None, 3: 4}) is None
    assert plans.rollback_level({0: 2, 1: 2}, {0: 2, 1: 2}) == 2


def test_a_rebuilding_holder_with_none_of_the_rows_has_no_say():
    """Simulation seed rs 1388: a spare rebuilding position 3 had none of the dead node's stripes' parity rows
    and no known level; it stopped the rollback, and the fallback left stripes short of k slots."""
    none, some = np.zeros(3, bool), np.array([False, True, False])
    assert plans.holding_none([{3: none}, {}]) == {3}  # its level is moot: its rows are rebuilt afterwards
    assert plans.holding_none([{3: none}, {3: some}]) == set()  # a row of another table: its level counts
    assert plans.holding_none([{3: None, 5: none}]) == {5}  # 3 did not answer: it keeps its say
    assert plans.holding_none([]) == set()


def test_only_the_holders_of_a_dead_nodes_stripes_decide_how_far_back_to_roll():
    """A survivor holding no parity of the dead position's stripes has no say (found by simulation seed xor 299:
    a spare that held none reported window 0, and the holders took out a window every target had acknowledged,
    whose writes no client kept any more)."""
    spec = TableSpec.from_config({"name": "t", "num_rows": 12, "dim": 2, "seed": 0,
                                  "optimizer": {"name": "sgd", "lr": 0.1, "eps": 1e-8}, "init": {"kind": "zeros"}})
    layout = ClusterConfig(nodes=6, code="xor", k=4, r=1).layout(spec)
    rows = np.arange(spec.num_rows)
    mine = np.unique(layout.stripe(rows[layout.data_node(rows) == 4]))  # stripes position 4 holds data in
    expect = set(layout.parity_node(mine, 0).tolist())
    assert plans.parity_holders([layout], 4) == expect
    assert expect < {0, 1, 2, 3, 5}  # a small table: some survivors hold no parity of position 4's stripes
    assert plans.parity_holders([], 4) == set()


class _Clock:
    def __init__(self):
        from ectable.testing.membership import FakeClock
        self.now = FakeClock()

    def monotonic(self):
        return self.now()

    def sleep(self, seconds):
        self.now.advance(seconds)

    def token_hex(self, n):
        import secrets
        return secrets.token_hex(n)


def in_process_world(fake):
    """Six in-process nodes given their positions by a decider on etcd's grace, on a fake clock."""
    from ectable.cluster.decider import STORE_GRACE, Decider
    from ectable.cluster.store import ClusterStore
    from ectable.membership import MemoryMembership
    from ectable.process.local import InProcessHost, _HostControl
    store = ClusterStore(MemoryMembership(clock=fake.now), "/t")
    endpoints = [f"inproc://ectable-node-{p}" for p in range(6)]
    hosts = [InProcessHost(e, "token", store) for e in endpoints]
    store.swap_map(None, Map.initial(CONFIG.get_config(), endpoints))
    decider = Decider(store, _HostControl(dict(zip(endpoints, hosts))), "decider/t", "token", grace=STORE_GRACE)
    for host in hosts:
        host.announce()
    while decider.step():
        pass
    assert all(store.read_map().sources)
    return store, hosts, decider


def test_a_decider_back_from_a_store_that_was_away_waits_for_nodes_to_announce_again():
    # one etcd member cut off for 8 s: every lease ran out on it, and when it was back the decider declared all
    # eight nodes dead before they announced themselves again (found on namespaces: the whole cluster was lost)
    from ectable import clock
    from ectable.cluster.decider import STORE_GRACE
    fake = _Clock()
    with clock.use(fake):
        store, hosts, decider = in_process_world(fake)
        epoch = store.read_map().epoch
        for lease in [h.lease for h in hosts] + [decider.lease]:  # the store was away: every lease ran out
            store.membership.revoke(lease)
        fake.sleep(1.0)
        assert not decider.step() and store.read_map().epoch == epoch  # leads again, but waits
        for host in hosts:  # each node's next keep-alive finds its lease gone: it announces itself again
            host.lease, host.announced = store.membership.grant(3600.0), None
            host.announce()
        for _ in range(4):  # (a step a second keeps the decider's lease alive)
            fake.sleep(STORE_GRACE / 4)
            assert not decider.step() and store.read_map().epoch == epoch  # nothing was failed over
        store.membership.revoke(hosts[2].lease)  # a node that is really gone still is
        assert decider.step() and store.read_map().dead() == [2]


def test_a_new_decider_fails_a_silent_node_over_at_once_unless_more_than_r_are_silent():
    from ectable import clock
    fake = _Clock()
    with clock.use(fake):
        store, hosts, decider = in_process_world(fake)
        for p in (0, 1, 3):  # more than r=2 at once: the store more likely than the nodes
            store.membership.revoke(hosts[p].lease)
        assert not decider.step() and store.read_map().dead() == []
    fake = _Clock()
    with clock.use(fake):
        store, hosts, decider = in_process_world(fake)
        store.membership.revoke(hosts[4].lease)  # one: failed over at once, as ever
        assert decider.step() and store.read_map().dead() == [4]


def test_a_drain_starts_only_with_every_position_up_and_a_spare_free():
    m = cluster_map()
    spare = "tcp://127.0.0.1:9000"
    seen = presence(m, **{spare: {"endpoint": spare, "source": None, "position": None}})
    leaving = {m.endpoints[2]}
    assert plans.free_spares(m, seen, {spare}) == []  # a spare asked to leave is no spare
    assert plans.drain_waits(m, []).startswith("no free spare")
    assert plans.drainable(m, leaving, []) is None
    spares = plans.free_spares(m, seen, leaving)
    assert spares == [spare] and plans.drain_waits(m, spares) is None
    assert plans.drainable(m, leaving, spares) == 2
    assert plans.drainable(m, {spare}, spares) is None  # a spare holds no position to hand over
    rebuilding = m.with_position(4, state="rebuilding")
    assert "position 4 is rebuilding" in plans.drain_waits(rebuilding, spares)
    assert plans.drainable(rebuilding, leaving, spares) is None
    dead = plans.declare_dead(m, [5])
    assert "position 5 is dead" in plans.drain_waits(dead, spares)
    reconciling = m.replace(failing=((3, "node/3/old"),))
    assert "reconciled" in plans.drain_waits(reconciling, spares)
    assert plans.drainable(m.with_position(2, source=None), leaving, spares) is None  # not started: nothing to hand
    bare = m.replace(config={**m.config, "code": "none", "r": 0})  # a handover needs no parity
    assert plans.drain_waits(bare, spares) is None and plans.drainable(bare, leaving, spares) == 2


def test_drain_progress_from_request_to_the_spare_up():
    m = cluster_map()
    leaving, spare = m.endpoints[2], "tcp://127.0.0.1:9000"
    seen = presence(m, **{spare: {"endpoint": spare, "source": None, "position": None}})
    asked = {leaving: 40}
    assert plans.drain_progress(m, seen, asked, leaving, 2) == ("waiting", "waiting: the decider acts next")
    state, now = plans.drain_progress(m, presence(m), asked, leaving, 2)
    assert state == "waiting" and now.startswith("waiting: no free spare")
    assert plans.drain_progress(m, seen, {}, leaving, 2)[0] == "withdrawn"
    fenced = plans.declare_dead(m, [2])
    assert plans.drain_progress(fenced, seen, asked, leaving, 2) == (
        "waiting", "fenced; waiting for a spare to take position 2")
    taken = fenced.replace(failing=()).with_position(2, endpoint=spare, source="node/2/b", state="rebuilding")
    assert plans.drain_progress(taken, seen, asked, leaving, 2) == ("waiting", f"{spare} took position 2: rebuilding")
    up = taken.with_position(2, state="up")
    assert plans.drain_progress(up, seen, asked, leaving, 2) == ("waiting", "waiting for the node to stop")
    gone = {e: info for e, info in seen.items() if e != leaving}
    assert plans.drain_progress(up, gone, asked, leaving, 2) == ("waiting", "waiting for the node to stop")
    assert plans.drain_progress(up, gone, {}, leaving, 2) == ("done", f"{spare} holds position 2, up; the node stopped")
    assert plans.drain_progress(m, seen, {spare: 41}, spare, None) == ("waiting", "waiting for the node to stop")
    assert plans.drain_progress(m, seen, {}, spare, None)[0] == "withdrawn"
    assert plans.drain_progress(m, presence(m), {}, spare, None) == ("done", "the node stopped")


def test_a_decider_reconciling_a_dead_node_counts_as_busy_so_its_lease_is_kept_alive():
    """A reconcile asks every survivor, then each holder per table, in turn: on a loaded machine, of 26 tables, it
    outlasted the 2 s election lease, the map change it ended with was refused, and the other decider began it
    again (36 s of failover in `bench.recovery --parts during` at full size). While it runs the decider is
    `busy_since` (as during a handover), so its process keeps the lease alive (`keep_lease_while_busy`)."""
    from ectable import clock
    fake = _Clock()
    with clock.use(fake):
        store, hosts, decider = in_process_world(fake)
        seen, control = [], decider.control
        asks = control.call_all

        def call_all(requests, timeout):
            seen.append((sorted({header["op"] for header, _ in requests.values()}), decider.busy_since))
            return asks(requests, timeout)

        control.call_all = call_all
        store.membership.revoke(hosts[4].lease)
        while decider.step():
            pass
        assert store.read_map().dead() == [4] and not store.read_map().failing  # declared dead, then reconciled
        reconcile = [busy for ops, busy in seen if "applied" in ops or "tables" in ops or "holds" in ops]
        assert reconcile and all(busy is not None for busy in reconcile)
        assert decider.busy_since is None
