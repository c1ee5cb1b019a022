"""Runtimes that host the logic: node and coordinator processes, the rebuilder, LocalCluster."""
