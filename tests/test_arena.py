"""The arenas: a node's tables of one row size keep their parity rows, and their records, in shared blocks;
a delta message naming many tables folds into them at once, a write of many tables gathers and scatters
their records at once, and a dropped table's rows are given back."""
import mmap
import os

import numpy as np
import pytest

import ectable
from ectable.storage.arena import HUGE_BYTES, Arena
from ectable.testing import check_parity, read_records


def test_ranges_of_one_row_size_share_a_block_until_it_is_full_and_an_empty_block_goes():
    page = mmap.PAGESIZE  # rows of a page each: a range's pages are whole
    arena = Arena(block_bytes=100 * page)
    a, at_a = arena.take(40, page)
    b, at_b = arena.take(60, page)
    c, at_c = arena.take(10, page)  # no room left in the first block
    d, _ = arena.take(10, 64)  # another row size: another block
    assert (a, at_a) == (b, 0) and at_b == 40 and c is not a and at_c == 0 and d not in (a, c)
    assert a.rows.shape == (100, page) and not a.rows.any()
    a.rows[:] = 7
    arena.give(b, at_b, 60)
    assert not a.rows[at_b:].any() and (a.rows[:at_b] == 7).all()  # its pages given back: zeros again
    arena.give(a, at_a, 40)
    assert arena.blocks[page] == [c]  # the first block's last range is gone: the block with it
    arena.give(c, at_c, 10)
    assert page not in arena.blocks and 64 in arena.blocks
    empty, _ = arena.take(0, 32)  # a table without parity rows takes no block of the arena's
    assert empty.rows.shape == (0, 32) and 32 not in arena.blocks


def _asks_for_huge_pages(block) -> bool:
    """Does the kernel hold `block`'s mapping as advised for transparent huge pages ("hg" in its VmFlags)?"""
    start = f"{block.rows.__array_interface__['data'][0]:x}-"
    with open("/proc/self/smaps") as f:
        lines = iter(f)
        for line in lines:
            if line.startswith(start):
                return next("hg" in flags.split() for flags in lines if flags.startswith("VmFlags:"))
    raise AssertionError("the block's mapping is not in /proc/self/smaps")


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"),
                    reason="transparent huge pages are Linux's")
def test_a_block_asks_for_huge_pages_only_once_its_ranges_span_huge_bytes():
    """A block of a few small tables keeps 4 KiB pages (a huge page is zeroed whole at its first write: every block
    asking for them made each block of a small cluster cost 2 MiB); once its ranges span HUGE_BYTES it asks."""
    arena = Arena()
    small, _ = arena.take(100, 64)
    assert not _asks_for_huge_pages(small)
    more, _ = arena.take(HUGE_BYTES // 64, 64)  # the same block, now spanning more than HUGE_BYTES
    assert more is small and _asks_for_huge_pages(small)
    big, _ = arena.take(HUGE_BYTES // 32, 32)  # a first range that large: at once
    assert _asks_for_huge_pages(big)


@pytest.mark.parametrize("code,k,r", [("xor", 3, 1), ("rs", 3, 2)])
def test_tables_sharing_a_block_fold_one_message_into_the_right_rows(code, k, r):
    with ectable.LocalCluster(nodes=k + r, code=code, k=k, r=r, processes=False, window_rows=1 << 20) as cluster:
        client = cluster.connect()
        for t in range(4):
            client.create_table(f"t{t}", num_rows=2000 + 100 * t, dim=8, optimizer="adagrad", lr=0.1,
                                init="normal", seed=t)
        client.create_table("wide", num_rows=500, dim=24, init="zeros")  # rows of another size
        node = cluster.node(0)
        blocks = {name: shard.block for name, shard in node.shards.items()}
        assert len({id(blocks[f"t{t}"]) for t in range(4)}) == 1 and blocks["wide"] is not blocks["t0"]
        rng = np.random.default_rng(3)
        for step in range(6):
            for t in range(4):  # every table written in each window: one delta message names all of them
                ids = rng.choice(2000, 300, replace=False)
                client.apply_gradient(f"t{t}", ids, rng.normal(size=(300, 8)).astype(np.float32))
            client.put("wide", [step], np.full((1, 24), step, np.float32))
            client.step()
        client.flush()
        check_parity(cluster, client)  # every parity row against zfec's encoding of the data
        client.drop_table("t1")
        expected = {t: read_records(client, f"t{t}", np.arange(2000 + 100 * t)) for t in (0, 3)}  # not written again
        client.apply_gradient("t2", np.arange(50), np.ones((50, 8), np.float32))
        client.step()
        client.flush()
        check_parity(cluster, client)
        for t in (0, 3):
            np.testing.assert_array_equal(read_records(client, f"t{t}", np.arange(2000 + 100 * t)), expected[t])


def test_a_many_table_write_to_tables_sharing_a_records_block_or_not_lands_as_table_by_table_writes():
    """Tables of one record size share a block of the node's records arena; one handed over keeps its own
    array. A write naming all of them (a gather and a scatter per block) leaves every record as writing
    the tables one at a time does, and a dropped table's records are given back."""
    rng = np.random.default_rng(11)
    names = [f"t{t}" for t in range(4)]
    writes = [{name: (rng.choice(900, 120, replace=False), rng.normal(size=(120, 8)).astype(np.float32))
               for name in names} for _ in range(3)]
    got = {}
    for together in (True, False):
        with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, processes=False) as cluster:
            client = cluster.connect()
            for t, name in enumerate(names):
                client.create_table(name, num_rows=900, dim=8, optimizer="adagrad", lr=0.1, init="normal", seed=t)
            node = cluster.node(0)
            if together:
                shard = node.shards["t2"]
                shard.adopt(shard.records.copy())  # as a handover installs an array it was sent
                blocks = {name: node.shards[name].rblock for name in names}
                assert blocks["t0"] is blocks["t1"] is blocks["t3"] is not None and blocks["t2"] is None
            for batch in writes:
                if together:
                    client.apply_gradient_many(batch)
                else:
                    for name, value in batch.items():
                        client.apply_gradient(name, *value)
                client.step()
            client.flush()
            check_parity(cluster, client)
            got[together] = {name: read_records(client, name, np.arange(900)) for name in names}
            if together:
                shard = node.shards["t1"]
                block, base, rows = shard.rblock, shard.rbase, shard.records.shape[0]
                assert block.rows[base: base + rows].any()
                client.drop_table("t1")
                page = mmap.PAGESIZE  # the range's whole pages are zeros again
                start, end = -(-base * block.rows.shape[1] // page) * page, (base + rows) * block.rows.shape[1] // page * page
                assert end > start and not block.rows.reshape(-1)[start:end].any()
    for name in names:
        np.testing.assert_array_equal(got[True][name], got[False][name])


def test_a_many_table_read_of_tables_sharing_a_records_block_or_not_reads_every_row_as_its_shard_holds_it():
    """One read naming tables that share a records block (of one dim, and of two dims with records of one
    size) and a table with records of its own gets each row as its shard's own array holds it."""
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, processes=False) as cluster:
        client = cluster.connect()
        for t in range(3):
            client.create_table(f"d8-{t}", num_rows=700, dim=8, init="normal", seed=t)  # records of 8 floats
        client.create_table("d4", num_rows=700, dim=4, optimizer="adagrad", lr=0.1, init="normal", seed=9)  # 4 + 4
        rng = np.random.default_rng(2)
        names = ["d8-0", "d8-1", "d4", "d8-2"]
        client.apply_gradient_many({name: (np.arange(0, 700, 3), rng.normal(size=(234, 8 if name != "d4" else 4))
                                           .astype(np.float32)) for name in names})
        client.step()
        client.get_many({name: np.arange(700) for name in names})  # every row's initial value computed
        node = cluster.node(1)
        shard = node.shards["d8-1"]
        shard.adopt(shard.records.copy())  # as a handover installs an array it was sent
        assert node.shards["d8-0"].rblock is node.shards["d4"].rblock is node.shards["d8-2"].rblock is not None
        batch = {name: rng.integers(0, 700, 300) for name in names}
        for records in (False, True):
            got = client.get_many(batch, records=records)
            for name, ids in batch.items():
                layout = node.shards[name].layout
                want = np.empty_like(got[name])
                for p in range(4):  # each row from its node's shard, as its array holds it
                    mine = layout.data_node(ids) == p
                    held = cluster.node(p).shards[name].records[layout.data_offset(ids[mine])]
                    want[mine] = held if records else held[:, : node.shards[name].dim]
                np.testing.assert_array_equal(got[name], want)
