"""Shared helpers: timing, tables and JSON results."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import time

RESULTS = pathlib.Path(__file__).parent / "results"


def best_rate(fn, nbytes: float, repeat: int = 5, min_time: float = 0.2) -> float:
    """Best observed throughput of fn() in bytes per second (best of `repeat` runs)."""
    fn()
    best = 0.0
    for _ in range(repeat):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = max(best, nbytes * n / elapsed)
    return best


def cpu_seconds(pids) -> float:
    """CPU seconds (user + system, all threads) the processes `pids` used so far (Linux /proc)."""
    total = 0
    for pid in set(pids):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process started, directly or not, by `pid` (Linux /proc)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # gone since its parent listed it (a node just killed)
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            out += [child, *descendants(child)]
    return out


def kind(pid: int) -> str:
    """What process `pid` is: "etcd", "node", "decider", or its program's name."""
    with open(f"/proc/{pid}/cmdline") as f:
        argv = f.read().split("\0")
    if any(a.endswith("etcd") for a in argv):
        return "etcd"
    return next((a for a in ("node", "decider") if a in argv), os.path.basename(argv[0]))


def family_cpu() -> dict:
    """{pid: (kind, CPU seconds so far)} of this process ("trainer") and its `descendants` (by `kind`)."""
    out = {os.getpid(): ("trainer", cpu_seconds([os.getpid()]))}
    for pid in descendants(os.getpid()):
        try:
            out[pid] = (kind(pid), cpu_seconds([pid]))
        except OSError:  # gone meanwhile
            pass
    return out


def add_node_nice(parser) -> None:
    """The `--node-nice` option of the benchmarks that start node processes."""
    parser.add_argument("--node-nice", type=int, help="the node processes' priority below this one's (LocalCluster's "
                        "node_nice; default: its default)")


def nice(node_nice: int | None) -> dict:
    """LocalCluster options for `--node-nice` (none: its default)."""
    return {} if node_nice is None else {"node_nice": node_nice}


def machine() -> dict:
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def report(name: str, columns: list[str], rows: list[list], extra: dict | None = None) -> pathlib.Path:
    """Print rows as a table and write them as JSON under bench/results/."""
    widths = [max(len(str(c)), *(len(_fmt(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(v).rjust(w) for v, w in zip(r, widths)))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), "columns": columns, "rows": rows}
    assert not set(payload) & set(extra or {}), "extra results may not replace the table"
    payload.update(extra or {})
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path.relative_to(RESULTS.parent.parent)}")
    return path


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
