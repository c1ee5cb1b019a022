"""Storage: a node's logic with no I/O: tables, shards, windows, optimizers, initialisers."""
