"""Reusable checks for ectable clusters: a reference model, parity checks and a Hypothesis state machine."""
from .checks import check_parity, read_records
from .reference import ReferenceTable

__all__ = ["check_parity", "read_records", "ReferenceTable"]
