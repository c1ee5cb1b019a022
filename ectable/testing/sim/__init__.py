"""Deterministic simulation: the real node, client and failover code on a seeded simulated network,
clock and membership store, in one thread, so that every failure is a seed that replays exactly.

`run(seed, code)` runs one seed and returns its `Outcome`; `python -m ectable.testing.sim` runs many
(see `--help`). Only the transport (`network.py`), the clock (`world.py`) and the membership
backend (the in-memory one, on the world's clock) are simulated; nodes, hosts, clients, repair,
rebuilders and deciders are the production classes.
"""
from .scenario import Outcome, run
from .world import World

__all__ = ["Outcome", "World", "run"]
