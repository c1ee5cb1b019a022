"""ectable's benchmarks: each module runs with `python -m bench.NAME`, prints a table and writes JSON."""
