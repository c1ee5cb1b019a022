"""examples/dlrm_distributed.py: two trainer processes (torch.distributed, gloo, DDP) sharing ectable tables
train exactly what one trainer does on the same global batches in two micro-batches."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "dlrm_distributed.py"


def _run(tmp_path, name, *args):
    out = tmp_path / f"{name}.npz"
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "12", "--batch", "64", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(np.load(out)), proc.stdout


@pytest.mark.timeout(600)
def test_two_trainers_equal_one_trainer_on_the_same_global_batches(tmp_path):
    two, said = _run(tmp_path, "two", "--trainers", "2")
    one, _ = _run(tmp_path, "one", "--trainers", "1", "--micro", "2")
    start, _ = _run(tmp_path, "start", "--trainers", "1", "--steps", "0")
    assert "2 trainer(s)" in said
    assert set(two) == set(one) == {"user", "item", "category", "city"}
    for table in two:
        np.testing.assert_array_equal(two[table], one[table])  # sgd: bit for bit
    assert any(not np.array_equal(two[t], start[t]) for t in two)  # and they trained
