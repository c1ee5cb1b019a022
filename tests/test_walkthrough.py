"""The three-host walk-through of docs/walkthrough.md, run on network namespaces as `make walkthrough` does
(needs root: skipped without)."""
import os
import subprocess
import sys

import pytest

from ectable.testing import netns

WHY = netns.available()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(WHY is not None, reason=f"no network namespaces here: {WHY}")
@pytest.mark.timeout(900)
def test_the_three_host_walk_through():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "three_hosts.py")], capture_output=True,
                          text=True, timeout=880, cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    # every row equal after node c-1 was drained, after node d-1 was added, after host b failed (one position
    # rebuilt on the spare, one served through the parity), and again in a cluster of another shape restored
    # from the checkpoint
    assert done.stdout.count("\n0 of 200,000 rows differ from the rows saved after training\n") == 4, done.stdout
    assert "holds position 5, up; the node stopped" in done.stdout
    assert "holds position 6, up: 7 positions" in done.stdout
    assert "degraded [" in done.stdout and "restored checkpoint 1" in done.stdout
