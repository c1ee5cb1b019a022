"""A checkpoint's rows are frozen at the cut without being copied then: whatever interleaving of writes
and of the writer's reads follows, the writer reads every row as it was at the cut."""
import numpy as np
from hypothesis import given, settings, strategies as st

from ectable.checkpoint import pieces
from ectable.codes import get_code
from ectable.layout import Layout
from ectable.storage import snapshots
from ectable.storage.shard import Shard, commit_many, updated_many
from ectable.storage.table import TableSpec

ROWS, DIM = 400, 4


def shard() -> Shard:
    spec = TableSpec.from_config({"name": "t", "num_rows": ROWS, "dim": DIM, "optimizer": {"name": "adagrad", "lr": 0.1}, "seed": 7})
    return Shard(spec, Layout(nodes=3, k=2, r=1, num_rows=ROWS), 0, get_code("xor", 2, 1))


def write(s: Shard, ids: np.ndarray, seed: int) -> None:
    ids = np.unique(ids)
    grads = np.random.default_rng(seed).normal(size=(ids.size, DIM)).astype(np.float32)
    (update,), scatters, logs = updated_many([(s, "apply_gradient", ids, grads)])
    commit_many([(s, *update)], scatters, logs)


def owned(s: Shard) -> np.ndarray:
    return s.layout.rows_on(0)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_writer_reads_every_row_as_it_was_at_the_cut_whatever_is_written_meanwhile(data):
    s = shard()
    mine = owned(s)
    write(s, mine[data.draw(st.lists(st.integers(0, mine.size - 1), min_size=1, max_size=60))], 0)
    ids, frozen = snapshots.take(s, "incremental", "chain", 1)
    frozen.chunk = data.draw(st.sampled_from([1, 3, 1 << 14]))
    want = s.records[frozen.local].copy()
    read, seed = 0, 1
    while read < ids.size:
        if data.draw(st.booleans()):  # a write to any rows, frozen or not, copied yet or not
            write(s, mine[data.draw(st.lists(st.integers(0, mine.size - 1), min_size=1, max_size=30))], seed)
            seed += 1
        else:
            step = data.draw(st.integers(1, ids.size))
            got = frozen[read:read + step]
            assert got.tobytes() == want[read:read + step].tobytes()
            read += step
    assert s.frozen == ()  # every row copied: writes stop saving into it
    assert frozen[:].tobytes() == want.tobytes()


def test_a_checkpoint_still_copying_a_dropped_table_keeps_its_rows_as_they_were():
    """The table is dropped while its checkpoint copies rows: they are copied before their memory goes."""
    s = shard()
    mine = owned(s)
    write(s, mine, 0)
    ids, frozen = snapshots.take(s, "full", "chain", 1)
    want = s.records[frozen.local].copy()
    assert want.any() and frozen.copied.sum() == 0
    s.free()
    assert frozen[:].tobytes() == want.tobytes() and s.frozen == ()


def test_a_writer_writes_the_cut_and_a_cancelled_one_stops_taking_rows(tmp_path):
    s = shard()
    mine = owned(s)
    write(s, mine[:50], 0)
    ids, frozen = snapshots.take(s, "full", "chain", 1)
    want = s.records[frozen.local].copy()
    writer = snapshots.Writer(1, str(tmp_path), "n0", [("t", DIM, ids, frozen)], None, False, start=False)
    write(s, mine[:80], 1)  # before the writer begins: 50 rows saved as they were
    writer.start()
    writer._thread.join(30)
    assert writer.done and writer.error is None and s.frozen == ()
    fs, root = pieces.location(str(tmp_path))
    got = [pieces.read_piece(fs, root, entry) for entry in writer.progress()["pieces"]]
    order = np.argsort(ids)  # pieces hold rows in id order
    np.testing.assert_array_equal(np.concatenate([g["ids"] for g in got]), ids[order])
    assert np.concatenate([g["weights"] for g in got]).tobytes() == np.ascontiguousarray(want[order, :DIM]).tobytes()
    _, frozen = snapshots.take(s, "incremental", "chain", 2)
    assert s.frozen == (frozen,)
    snapshots.Writer(2, str(tmp_path), "n0", [("t", DIM, ids, frozen)], None, False, start=False).cancel()
    assert s.frozen == ()
