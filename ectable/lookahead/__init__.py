"""Bagpipe-style lookahead: prefetch the rows of batches known in advance and cache those reused soon."""
from .lookahead import Lookahead

__all__ = ["Lookahead"]
