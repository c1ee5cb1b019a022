"""The README's usage examples run as written."""
import pathlib
import re

import ectable

BLOCKS = re.findall(r"```python\n(.*?)```", (pathlib.Path(__file__).parents[1] / "README.md").read_text(), re.S)


def test_readme_example_runs():
    exec(compile(BLOCKS[0], "README.md", "exec"), {})


def test_readme_checkpoint_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with ectable.LocalCluster(nodes=4, code="xor", k=3, r=1, processes=False) as cluster, \
            ectable.LocalCluster(nodes=3, code="rs", k=1, r=2, processes=False) as other_cluster:
        client = cluster.connect()
        client.create_table("items", num_rows=1000, dim=8, init="normal")
        client.put("items", [3], [[1.0] * 8])
        exec(compile(BLOCKS[1], "README.md", "exec"), {"client": client, "other_cluster": other_cluster,
                                                        "ectable": ectable})
        assert other_cluster.connect().get("items", [3]).tolist() == [[1.0] * 8]


def test_readme_torch_example_runs():
    import pytest
    pytest.importorskip("torch")
    exec(compile(BLOCKS[2], "README.md", "exec"), {})


def test_readme_lookahead_example_runs():
    import numpy as np
    batches = [{"items": np.array([1, 2, 2, 7 + i])} for i in range(20)]
    with ectable.LocalCluster(nodes=3, code="xor", k=2, processes=False) as cluster, \
            ectable.LocalCluster(nodes=3, code="xor", k=2, processes=False) as plain_cluster:
        client, plain = cluster.connect(), plain_cluster.connect()
        for c in (client, plain):
            c.create_table("items", num_rows=1000, dim=8)
        for batch in batches:  # what the loop does without a lookahead
            rows = plain.get_many(batch)
            plain.apply_gradient_many({t: (ids, 0.1 * rows[t]) for t, ids in batch.items()})
            plain.step()
        scope = {"client": client, "batches": batches, "ectable": ectable}
        exec(compile(BLOCKS[3], "README.md", "exec"), scope)
        assert scope["la"].stats["batches"] == 20
        ids = np.arange(30)
        np.testing.assert_array_equal(client.get("items", ids), plain.get("items", ids))
