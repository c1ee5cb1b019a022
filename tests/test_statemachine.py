"""The cluster against a dict of rows, with kills and recoveries, for each code."""
import pytest

from ectable.testing.statemachine import machine_for

# A whole Hypothesis run of one machine (150 examples in the ci profile) took 85 s alone on a quiet 2-core machine
# (TestRSNoSpare) and went past the default 300 s bound twice beside two kill loops: the bound is a guard against a
# hang, not a timing.
pytestmark = pytest.mark.timeout(900)

TestXor = machine_for(code="xor", nodes=5, k=4, r=1, spares=2).TestCase
TestRS = machine_for(code="rs", nodes=6, k=3, r=2, spares=2).TestCase
TestRSNoSpare = machine_for(code="rs", nodes=5, k=3, r=2, spares=0).TestCase
TestXorGrouped = machine_for(code="xor", nodes=5, k=4, r=1, spares=2, window_steps=3).TestCase  # 3 steps a window
TestRSGrouped = machine_for(code="rs", nodes=6, k=3, r=2, spares=1, window_steps=2).TestCase
TestNone = machine_for(code="none", nodes=4, k=4, r=0, spares=0).TestCase
