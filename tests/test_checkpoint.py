"""The checkpoint tier end to end: checkpoints of a training cluster under every policy, restored into
clusters of other shapes, with nodes dead or killed, and refused when damaged."""
import json
import os
import subprocess
import sys
import threading

import fsspec
import numpy as np
import pytest

import ectable
from ectable.checkpoint.pieces import BadCheckpoint
from ectable.testing import check_parity, read_records

N_A, N_B = 3000, 200


def train(client, rng, iterations, start=0):
    """A few iterations on two tables: adagrad "a" (gradients) and sgd "b" (puts)."""
    for it in range(start, start + iterations):
        ids = rng.choice(N_A, 300, replace=False)
        client.apply_gradient("a", ids, rng.standard_normal((300, 8)).astype(np.float32))
        client.put("b", [it % N_B], np.full((1, 4), it, np.float32))
        client.step()


def take(client, path, **options) -> dict:
    """A checkpoint, taken and waited for: its manifest."""
    client.checkpoint(path, **options)
    return client.checkpoint_wait()


def make_tables(client):
    client.create_table("a", num_rows=N_A, dim=8, optimizer="adagrad", lr=0.1, init="normal", seed=1)
    client.create_table("b", num_rows=N_B, dim=4, init="zeros")


def state(client) -> dict:
    return {t: read_records(client, t, np.arange(n)) for t, n in (("a", N_A), ("b", N_B))}


def assert_restores(path, want, number=None, **shape):
    """Restore checkpoint `number` of `path` into a fresh in-process cluster of `shape`: equal to `want`."""
    with ectable.LocalCluster(processes=False, **(shape or dict(nodes=5, code="rs", k=3, r=2))) as cluster:
        client = cluster.connect()
        restored = client.restore(path, number)
        got = state(client)
        for table in want:
            np.testing.assert_array_equal(got[table], want[table], err_msg=table)
        client.flush()
        check_parity(cluster, client)
        return restored


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
def test_every_policy_restores_each_checkpoint_into_another_shape(tmp_path, processes):
    """Chains of checkpoints under each policy, each restored into clusters of another code and node count:
    the records (weights and optimizer state) are bit-identical to those at the cut; the extra bytes too."""
    rng = np.random.default_rng(1)
    wants, kinds = {}, {}
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, processes=processes) as cluster:
        client = cluster.connect()
        make_tables(client)
        for policy in ("full", "incremental", "differential", "intermittent"):
            for n in range(1, 5):
                train(client, rng, 2, 2 * n)
                wants[policy, n] = state(client)
                number = client.checkpoint(str(tmp_path / policy), policy=policy, extra=b"reader at %d" % n)
                train(client, rng, 1, 100 + n)  # writes after the cut are not in it
                manifest = client.checkpoint_wait()
                assert manifest["number"] == number == n
                kinds.setdefault(policy, []).append(manifest["kind"])
        # another chain taken in between: the next of this one cannot rely on the nodes' flags
        client.checkpoint(str(tmp_path / "incremental"), policy="incremental")
        assert client.checkpoint_wait()["kind"] == "full"
    assert kinds["full"] == ["full"] * 4 and kinds["incremental"] == ["full"] + ["incremental"] * 3
    assert kinds["differential"] == ["full"] + ["differential"] * 3
    for policy in ("incremental", "differential", "intermittent"):
        for n in (1, 4):
            shape = dict(nodes=3, code="none", k=1, r=0) if n == 1 else {}
            restored = assert_restores(str(tmp_path / policy), wants[policy, n], n, **shape)
            assert restored.number == n and restored.extra == b"reader at %d" % n
            assert sorted(restored.tables) == ["a", "b"]


@pytest.mark.parametrize("bits", [None, 3, 4])
def test_every_node_killed_after_a_checkpoint_and_it_restores_exactly_or_within_the_quantization_bound(tmp_path,
                                                                                                     bits):
    """Exact checkpoints restore bit for bit; quantized ones within half a step of each row's range (the
    documented bound: (max - min) / (2**bits - 1) / 2 per weight), optimizer state exact."""
    rng = np.random.default_rng(10)
    path = str(tmp_path / "c")
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, spares=0) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        take(client, path, policy="incremental", bits=bits)
        train(client, rng, 2, 2)
        take(client, path, policy="incremental", bits=bits)
        want = state(client)
        for p in range(5):
            cluster.kill(p)
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1) as other:
        client = other.connect()
        client.restore(path)
        got = state(client)
    for table, dim in (("a", 8), ("b", 4)):
        if bits is None:
            np.testing.assert_array_equal(got[table], want[table])
            continue
        np.testing.assert_array_equal(got[table][:, dim:], want[table][:, dim:])
        weights = want[table][:, :dim]
        step = (weights.max(axis=1) - weights.min(axis=1)) / (2 ** bits - 1)
        assert (np.abs(got[table][:, :dim] - weights) <= step[:, None] / 2 * 1.001 + 1e-6).all()


def test_optimizer_state_quantized_on_request(tmp_path):
    rng = np.random.default_rng(11)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        assert take(client, str(tmp_path / "c"), policy="full", state_bits=8)["state_bits"] == 8
        want = state(client)["a"]
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as other:
        client = other.connect()
        client.restore(str(tmp_path / "c"))
        got = state(client)["a"]
    np.testing.assert_array_equal(got[:, :8], want[:, :8])  # weights exact
    step = (want[:, 8:].max(axis=1) - want[:, 8:].min(axis=1)) / 255
    assert (np.abs(got[:, 8:] - want[:, 8:]) <= step[:, None] / 2 * 1.001 + 1e-6).all()
    assert not np.array_equal(got[:, 8:], want[:, 8:])


def test_incremental_checkpoints_write_only_the_rows_written_since_and_quantized_ones_stay_close(tmp_path):
    rng = np.random.default_rng(2)
    with ectable.LocalCluster(nodes=4, code="rs", k=2, r=2, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 1)
        full = client.checkpoint(str(tmp_path / "q"), policy="incremental", bits=4)
        first = client.checkpoint_wait()
        ids = np.arange(50)
        client.apply_gradient("a", ids, np.ones((50, 8), np.float32))
        second = take(client, str(tmp_path / "q"), policy="incremental", bits=4)
        want = state(client)
    assert first["number"] == full == 1 and first["kind"] == "full"
    assert second["kind"] == "incremental" and second["rows"] == 50  # "b" untouched: not written again
    assert {p["table"] for p in second["pieces"]} == {"a"}
    assert first["rows"] == 301  # the rows ever written: 300 of "a", 1 of "b"; the others are initial values
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as other:
        client = other.connect()
        client.restore(str(tmp_path / "q"))
        got = state(client)
    dim = 8
    np.testing.assert_array_equal(got["a"][:, dim:], want["a"][:, dim:])  # optimizer state: exact
    spread = want["a"][:, :dim].max(axis=1) - want["a"][:, :dim].min(axis=1)
    assert (np.abs(got["a"][:, :dim] - want["a"][:, :dim]) <= spread[:, None] / 15 / 2 * 1.0001 + 1e-7).all()


def test_a_checkpoint_of_a_degraded_cluster_reads_the_dead_node_through_the_parity(tmp_path):
    rng = np.random.default_rng(3)
    with ectable.LocalCluster(nodes=5, code="rs", k=3, r=2, spares=0) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        take(client, str(tmp_path / "c"), policy="incremental")
        cluster.kill(1)
        train(client, rng, 2, 2)
        manifest = take(client, str(tmp_path / "c"), policy="incremental")
        want = state(client)
    assert manifest["degraded"] == [1] and manifest["kind"] == "incremental"
    assert_restores(str(tmp_path / "c"), want)


def test_a_checkpoint_just_after_a_kill_and_of_the_replacement_that_rebuilt_it(tmp_path):
    """Taken before the client saw the kill (it fails the node over first), then from the replacement,
    whose rows all count as written since (the padding of the last stripe is not a row)."""
    rng = np.random.default_rng(8)
    path = str(tmp_path / "c")
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, spares=1, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        take(client, path, policy="differential")
        cluster.kill(1)
        first = take(client, path, policy="differential")
        wants = [state(client)]
        client.wait_recovered(timeout=60)
        train(client, rng, 1, 2)
        second = take(client, path, policy="differential")
        wants.append(state(client))
    assert [first["kind"], second["kind"]] == ["differential"] * 2
    assert_restores(path, wants[0], 2)
    assert_restores(path, wants[1], 3)


def test_a_node_killed_while_writing_fails_the_checkpoint_and_the_next_is_a_full_one(tmp_path):
    rng = np.random.default_rng(4)
    path = str(tmp_path / "c")
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, spares=1) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        take(client, path, policy="incremental")
        train(client, rng, 1, 2)
        client.checkpoint(path, policy="incremental")
        cluster.kill(2)  # before the client hears its pieces are written
        with pytest.raises(ectable.Error, match="checkpoint 2 failed"):
            client.checkpoint_wait()
        assert not os.path.exists(os.path.join(path, "00000002", "manifest.json"))
        client.wait_recovered(timeout=60)
        train(client, rng, 1, 3)
        manifest = take(client, path, policy="incremental")
        want = state(client)
    assert manifest["number"] == 3 and manifest["kind"] == "full"  # the nodes' flags were cleared for number 2
    assert_restores(path, want)


def test_a_checkpoint_given_up_while_nodes_still_write_it_is_superseded_by_the_next(tmp_path, monkeypatch):
    """Checkpoint 1 fails (a node killed) while the others still write their pieces: the next checkpoint
    is taken at once, and their writers of checkpoint 1 stop."""
    from ectable.checkpoint import pieces
    release, write = threading.Event(), pieces.write_piece

    def slow(fs, directory, data, prefix="piece"):
        if directory.endswith("00000001"):
            release.wait(30)
        return write(fs, directory, data, prefix)
    monkeypatch.setattr(pieces, "write_piece", slow)
    rng = np.random.default_rng(9)
    path = str(tmp_path / "c")
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, spares=1, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        client.checkpoint(path, policy="incremental")
        cluster.kill(0)
        with pytest.raises(ectable.Error, match="checkpoint 1 failed"):
            client.checkpoint_wait()
        client.checkpoint(path, policy="incremental")
        release.set()
        assert client.checkpoint_wait()["number"] == 2
        want = state(client)
    assert_restores(path, want)


def test_keep_deletes_what_no_kept_checkpoint_needs(tmp_path):
    rng = np.random.default_rng(5)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        for name, policy, keep in (("d", "differential", 2), ("i", "incremental", 1)):
            for n in range(5):
                train(client, rng, 1, n)
                take(client, str(tmp_path / name), policy=policy, keep=keep)
        want = state(client)
    assert sorted(os.listdir(tmp_path / "d")) == ["00000001", "00000004", "00000005", "chain.json"]
    assert sorted(os.listdir(tmp_path / "i")) == [f"{n:08d}" for n in range(1, 6)] + ["chain.json"]
    assert_restores(str(tmp_path / "i"), want)


def test_in_memory_filesystem_with_nodes_in_process_and_refused_with_node_processes():
    rng = np.random.default_rng(6)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        train(client, rng, 2)
        take(client, "memory://ck/run", policy="full")
        want = state(client)
    assert_restores("memory://ck/run", want)
    fsspec.filesystem("memory").rm("/ck", recursive=True)
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1) as cluster:
        with pytest.raises(ectable.InvalidRequest, match="memory://"):
            cluster.connect().checkpoint("memory://ck/run")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A chain of a full and two incremental checkpoints, and the records at each."""
    path = str(tmp_path_factory.mktemp("chain") / "c")
    rng = np.random.default_rng(7)
    wants = []
    with ectable.LocalCluster(nodes=3, code="xor", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        make_tables(client)
        for n in range(3):
            train(client, rng, 2, 2 * n)
            take(client, path, policy="incremental", bits=8)
            wants.append(state(client))
    return path, wants


def damaged(chain, tmp_path, change):
    """A copy of the chain with `change(root)` applied."""
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(chain[0], copy)
    change(copy)
    return str(copy)


def first_piece(root, number):
    manifest = json.load(open(root / f"{number:08d}" / "manifest.json"))
    return root / f"{number:08d}" / manifest["pieces"][0]["file"]


def truncate(root):
    path = first_piece(root, 2)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip(root):
    path = first_piece(root, 3)
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))


def relabel(root):
    manifest_path = root / "00000003" / "manifest.json"
    manifest = json.load(open(manifest_path))
    manifest["tables"] = [t | {"dim": 9} if t["name"] == "a" else t for t in manifest["tables"]]
    manifest_path.write_text(json.dumps(manifest))


DAMAGE = [
    (truncate, "corrupt or truncated"),
    (flip, "corrupt or truncated"),
    (lambda root: first_piece(root, 1).unlink(), "is missing"),
    (lambda root: __import__("shutil").rmtree(root / "00000002"), "missing"),  # a chain link gone
    (lambda root: (root / "00000003" / "extra.bin").write_bytes(b"x"), None),  # no extra was stored: ignored
    (relabel, "do not fit table 'a'"),
    (lambda root: (root / "chain.json").unlink(), "no chain.json"),
]


@pytest.mark.parametrize("change,words", DAMAGE, ids=[f"damage-{n}" for n in range(len(DAMAGE))])
def test_a_damaged_checkpoint_is_refused_naming_the_piece_and_nothing_is_restored(chain, tmp_path, change, words):
    path = damaged(chain, tmp_path, change)
    with ectable.LocalCluster(nodes=3, code="rs", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        if words is None:
            client.restore(path)
            return
        with pytest.raises(BadCheckpoint, match=words):
            client.restore(path)
        assert client.tables() == {}


def test_an_unfinished_checkpoint_is_never_read_and_a_table_in_the_way_refuses_the_restore(chain, tmp_path):
    path = damaged(chain, tmp_path, lambda root: (root / "00000003" / "manifest.json").unlink())
    with ectable.LocalCluster(nodes=3, code="rs", k=2, r=1, processes=False) as cluster:
        client = cluster.connect()
        assert client.restore(path).number == 2  # the last finished one
        with pytest.raises(ectable.InvalidRequest, match=r"\['a', 'b'\] exist"):
            client.restore(path)
        with pytest.raises(BadCheckpoint, match="checkpoint 3"):
            cluster.connect().restore(path, 3)


def ectable_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ectable", *args], capture_output=True, text=True, timeout=120)


def test_the_shell_lists_inspects_restores_and_exports(chain, tmp_path):
    path, wants = chain
    listed = ectable_cli("checkpoint", "list", path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == \
        [["1", "full"], ["2", "incremental"], ["3", "incremental"]]
    inspected = ectable_cli("checkpoint", "inspect", path, "--verify")
    assert inspected.returncode == 0 and "verified" in inspected.stdout and "8-bit" in inspected.stdout
    assert "a: 3,000 rows x 8, adagrad" in inspected.stdout
    broken = damaged(chain, tmp_path, truncate)
    refused = ectable_cli("checkpoint", "inspect", broken, "--number", "2", "--verify")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "corrupt or truncated" in refused.stderr
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, spares=0) as cluster:
        toml = tmp_path / "cluster.toml"
        toml.write_text(ectable.config.dumps(cluster.describe()))
        restored = ectable_cli("restore", path, "--config", str(toml), "--number", "2")
        assert restored.returncode == 0, restored.stderr
        assert "restored checkpoint 2: tables ['a', 'b']" in restored.stdout
        again = ectable_cli("restore", path, "--config", str(toml))
        assert again.returncode == 1 and "exist in this cluster" in again.stderr and "Traceback" not in again.stderr
        client = cluster.connect()
        got = state(client)
        np.testing.assert_array_equal(got["a"][:, 8:], wants[1]["a"][:, 8:])  # quantized weights, exact state
        assert ectable_cli("export", "a", str(tmp_path / "a.npy"), "--config", str(toml)).returncode == 0
        np.testing.assert_array_equal(ectable.load_rows(str(tmp_path / "a.npy")), got["a"][:, :8])
        assert client.export("a", "memory://exported/a.npy", state=True) == N_A
        np.testing.assert_array_equal(ectable.load_rows("memory://exported/a.npy"), got["a"])
        np.testing.assert_array_equal(ectable.load_rows(str(tmp_path / "a.npy"), mmap=True), got["a"][:, :8])
