"""The cluster as clients see it: maps of positions, their states and channels."""
