import numpy as np
import pytest
from hypothesis import given, strategies as st

import ectable
from ectable.storage.window import Windows


@given(st.lists(st.one_of(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 19), unique=True, max_size=8)),
                          st.just("drop")), max_size=12))
def test_tables_sharing_a_window_keep_each_rows_delta_since_it_opened_and_drain_each_row_once(events):
    """Three tables of one width in one window (a node's `Windows`): each write is recorded as one call for
    every table it names; the committed records and the drain are right per table, and a dropped table's rows
    leave the window."""
    windows = Windows(block_rows=64)
    records = [np.arange(20 * 2, dtype=np.float32).reshape(20, 2) + 100 * t for t in range(3)]
    parts = [windows.take(20, 2, owner=t) for t in range(3)]
    assert len({id(p.window) for p in parts}) == 1 and len(list(windows)) == 1
    first: dict = {}  # (table, row) -> its record as the window opened
    live = [0, 1, 2]
    for step, event in enumerate(events):
        if event == "drop":
            if live[-1] == 2:
                windows.give(parts[2])
                live.pop()
                first = {key: v for key, v in first.items() if key[0] != 2}
            continue
        t, local = event
        t = live[t % len(live)]
        local = np.array(local, dtype=np.int64)
        for x in local:
            first.setdefault((t, int(x)), records[t][x].copy())
        new = records[t][local] * 3 + 100 + step
        parts[t].window.record(parts[t].base + local, records[t][local], new)  # as `commit_many` does it
        records[t][local] = new
        for u in live:
            mine = sorted(x for v, x in first if v == u)
            np.testing.assert_array_equal(parts[u].committed(np.arange(20), records[u])[mine],
                                          np.array([first[(u, x)] for x in mine]).reshape(-1, 2))
    window = parts[0].window
    assert len(window) == len(first)
    tables, table, local, delta = window.drain_tables()
    assert sorted(zip([tables[t] for t in table], local.tolist())) == sorted(first)
    for t, x, d in zip(table, local, delta):  # old ^ new record bytes, whatever came between
        t = tables[t]
        np.testing.assert_array_equal(d, first[(t, int(x))].view(np.uint8) ^ records[t][x].view(np.uint8))
    assert len(window) == 0 and not (window.flags & 1).any()  # the window flag (the checkpoint marks stay)


def test_window_cost_follows_the_rows_touched():
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=False) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=200_000, dim=4)
        cl.apply_gradient("t", [3, 3, 17, 150_000], np.ones((4, 4)))
        assert cl.status()["dirty_rows"] == 3
        cl.step()
        assert cl.status()["dirty_rows"] == 0
        node = c.node(int(cl._table("t")[1].data_node(17)))
        assert node.durable_seq == node.write_seq


def test_windows_close_by_size():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False, window_rows=10) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=1000, dim=2)
        cl.put("t", np.arange(200), np.ones((200, 2)))
        assert cl.status()["dirty_rows"] == 0  # each node's 40 rows passed the bound
        from ectable.testing import check_parity
        check_parity(c, cl)


def test_windows_close_by_age():
    now = [0.0]
    with ectable.LocalCluster(nodes=5, code="xor", k=4, r=1, processes=False, window_seconds=2.0) as c:
        for p in range(5):
            c.node(p).clock = lambda: now[0]
        cl = c.connect()
        cl.create_table("t", num_rows=100, dim=2)
        cl.put("t", [1], np.ones((1, 2)))
        assert cl.status()["dirty_rows"] == 1
        now[0] = 3.0
        cl.get("t", [1])
        assert cl.status()["dirty_rows"] == 1  # reads never move the cut a degraded read relies on
        cl.put("t", [1], np.ones((1, 2)))
        assert cl.status()["dirty_rows"] == 0


def test_flush_closes_a_window_whose_step_never_reached_its_node():
    """settle(close=True), flush's second half, closes every node's window itself: a node the step
    missed still gets its writes into parity before flush returns."""
    import time

    from ectable.testing import check_parity
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=False, window_seconds=1e9) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=200, dim=4, optimizer="adagrad")
        cl.apply_gradient("t", np.arange(200), np.ones((200, 4)))  # no step(): every window is open
        cl.settle(time.monotonic() + 10, close=True)
        check_parity(c, cl)


@pytest.mark.parametrize("processes", [False, True])
def test_a_window_closes_every_window_steps_steps(processes):
    """window_steps=3: the first two steps leave the window open (each row's delta is sent once for the three
    iterations), the third closes it; parity is exact after each close."""
    from ectable.testing import check_parity
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=processes, window_steps=3,
                              window_seconds=1e9) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=300, dim=4, optimizer="adagrad")
        for rounds in range(2):
            for step in range(3):
                cl.apply_gradient("t", np.arange(50 * step, 50 * step + 100), np.ones((100, 4)))
                cl.step()
                dirty = cl.status()["dirty_rows"]
                assert dirty == (0 if step == 2 else 100 + 50 * step), (rounds, step, dirty)
            check_parity(c, cl)


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_window_steps_must_be_a_positive_integer(steps):
    with pytest.raises(ValueError, match="window_steps"):
        ectable.LocalCluster(nodes=5, code="xor", k=4, processes=False, window_steps=steps)


def _dirty_seen_by_another_client(cluster, until_clean: bool) -> int:
    """Dirty rows as a second client sees them (its status() sends no step of the first), polled until 0 if
    `until_clean` (at most 10 s: a step sent without waiting reaches a node process a moment later)."""
    import time
    other = cluster.connect()
    deadline = time.monotonic() + 10
    while True:
        dirty = other.status()["dirty_rows"]
        if not until_clean or dirty == 0 or time.monotonic() > deadline:
            return dirty
        time.sleep(0.01)


@pytest.mark.parametrize("processes", [False, True])
def test_a_step_goes_out_as_the_next_read_returns(processes):
    """step() asks nothing of the nodes yet; the next get_many sends it after its reads (so the nodes close
    their windows while the caller's model computes), and parity is exact then."""
    from ectable.testing import check_parity
    with ectable.LocalCluster(nodes=5, code="xor", k=4, processes=processes, window_seconds=1e9) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=300, dim=4, optimizer="adagrad")
        cl.apply_gradient("t", np.arange(100), np.ones((100, 4)))
        cl.step()
        assert _dirty_seen_by_another_client(c, until_clean=False) == 100  # not sent yet
        rows = cl.get_many({"t": np.arange(100)})["t"]
        assert rows.shape == (100, 4)
        assert _dirty_seen_by_another_client(c, until_clean=True) == 0
        check_parity(c, cl)


@pytest.mark.parametrize("call", ["put", "status", "close"])
def test_a_step_goes_out_before_any_other_call(call):
    """A step not sent yet goes out before a write (its window holds only the writes before it), before any
    other call, and when the client closes."""
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=True, window_seconds=1e9) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=300, dim=4)
        cl.put("t", np.arange(60), np.ones((60, 4)))
        cl.step()
        if call == "put":
            cl.put("t", np.arange(200, 230), np.ones((30, 4)))
            cl.status()  # collects the step's replies; the window holds the put after it
            assert _dirty_seen_by_another_client(c, until_clean=False) == 30
            return
        getattr(cl, call)()
        assert _dirty_seen_by_another_client(c, until_clean=True) == 0


@pytest.mark.parametrize("processes", [False, True])
def test_a_client_closed_after_its_cluster_with_a_step_due_closes_quietly(processes):
    with ectable.LocalCluster(nodes=5, code="xor", k=4, processes=processes) as c:
        cl = c.connect()
        cl.create_table("t", num_rows=100, dim=4)
        cl.put("t", np.arange(10), np.ones((10, 4)))
        cl.step()
    cl.close()  # its step cannot go out: the nodes are gone, and so are their windows
    with pytest.raises(ectable.Error, match="client closed"):
        cl.step()


@given(st.lists(st.one_of(st.lists(st.integers(0, 19), unique=True, max_size=8),
                          st.sampled_from(["close", "checkpoint", "full"])), max_size=16), st.booleans())
def test_the_window_flags_also_track_rows_written_since_each_checkpoint(events, replacement):
    """One flag byte per row, two uses: closing a window (parity) leaves the checkpoint marks alone; a
    checkpoint clears its own, a full one both, none clears "written ever"; a replacement's rows all count
    as written."""
    records = np.zeros((20, 2), dtype=np.float32)
    w = Windows().take(20, 2, owner="t", modified=replacement)
    since_ckpt = since_full = ever = set(range(20)) if replacement else set()
    window = set()
    for n, event in enumerate(events):
        if event == "close":
            rows, _ = w.window.drain()
            assert set((rows - w.base).tolist()) == window
            window = set()
        elif event in ("checkpoint", "full"):
            w.checkpointed(full=event == "full")
            since_ckpt = set()
            since_full = set() if event == "full" else since_full
        else:
            local = np.array(event, dtype=np.int64)
            w.window.record(w.base + local, records[local], records[local] + n + 1)
            records[local] += n + 1
            window, since_ckpt, since_full = window | set(event), since_ckpt | set(event), since_full | set(event)
            ever = ever | set(event)
        assert w.modified().tolist() == sorted(since_ckpt)
        assert w.modified("full").tolist() == sorted(since_full)
        assert w.modified("ever").tolist() == sorted(ever) and w.written() == len(ever)
        assert len(w.window) == len(window)


def test_a_write_whose_first_step_group_is_empty_records_the_next_groups_rows_in_their_shared_window():
    """Two tables of one record width share a window but not an optimizer step (their lr differ). A write to a
    node naming the first with no rows and the second with some records the second's changes from its own
    records: the write is applied, and parity is exact."""
    from ectable.protocol.messages import Write
    from ectable.testing import check_parity
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, processes=False) as c:
        cl = c.connect()
        cl.create_table("a", num_rows=100, dim=4, optimizer="adagrad", lr=0.1)
        cl.create_table("b", num_rows=100, dim=4, optimizer="adagrad", lr=0.2)
        layout = cl._table("b")[1]
        ids = np.flatnonzero(layout.data_node(np.arange(100)) == 0)[:5]
        node = c.node(0)
        assert node.shards["a"].window.window is node.shards["b"].window.window
        before = cl.get("b", ids)
        reply, _ = c.channel(0).call(Write(parts=[["a", "apply_gradient"], ["b", "apply_gradient"]]).header(),
                                     [np.empty(0, dtype=np.int64), np.empty((0, 4), dtype=np.float32),
                                      ids, np.ones((ids.size, 4), dtype=np.float32)], 10.0)
        assert "seq" in reply, reply
        assert (cl.get("b", ids) < before).all()  # one step down each
        cl.flush()
        check_parity(c, cl)
