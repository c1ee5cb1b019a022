"""Runtimes that host the logic: node and decider processes, node hosts, the rebuilder, LocalCluster."""
