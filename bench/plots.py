"""PNG plots of the benchmark results in bench/results/ (matplotlib, the `bench` extra).

    python -m bench.plots            # writes docs/img/*.png from whatever results exist
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

from .common import RESULTS

IMG = pathlib.Path(__file__).parent.parent / "docs" / "img"


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def recovery_during(plt) -> None:
    """Iterations per second around a SIGKILL, one line per rebuild share."""
    data = _load("recovery_during")
    if not data:
        return
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for share, s in data["series"].items():
        times = np.array(s["times"])
        t = np.cumsum(times) - (np.cumsum(times) - times)[s["kill_at"]]  # iteration ends, seconds since the SIGKILL
        rate = 1 / np.convolve(times, np.ones(5) / 5, mode="valid")  # over each iteration and the 4 before it
        line, = ax.plot(t[4:], rate, lw=1, label=f"rebuild share {share}")
        busy = np.flatnonzero(s["rebuilding"])
        if busy.size:
            ax.axvspan(t[busy[0]], t[busy[-1]], color=line.get_color(), alpha=0.08)
    ax.axvline(0, color="k", lw=0.8, ls="--")
    ax.text(0, ax.get_ylim()[1] * 0.95, " SIGKILL", va="top")
    ax.set_xlabel("seconds since the SIGKILL (shaded: the spare is rebuilding)")
    ax.set_ylabel("iterations / s")
    ax.set_title(f"Training through a node failure ({data.get('workload', '').split(':')[0]}, {data['table_rows']:,} rows, "
                 f"xor(4,1), {data['compute_ms']:.0f} ms model step)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(IMG / "recovery_during.png", dpi=110)


def recovery_during_cpu(plt) -> None:
    """CPU per iteration by process before, during and after a rebuild (the first share run), against what 2
    cores give in an iteration's time."""
    data = _load("recovery_during_cpu")
    if not data or not data["rows"]:
        return
    columns, share = data["columns"], data["rows"][0][0]
    rows = [dict(zip(columns, row)) for row in data["rows"] if row[0] == share]
    survivors = data["survivors"]
    parts = [("trainer", "trainer CPU ms/it", 1, "tab:gray"),
             (f"{survivors} surviving nodes", "a survivor's CPU ms/it", survivors, "tab:blue"),
             ("node 2 (killed, then the spare, rebuilding)", "node 2's CPU ms/it", 1, "tab:orange"),
             ("etcd and deciders", "etcd + deciders ms/it", 1, "tab:green")]
    fig, ax = plt.subplots(figsize=(10, 3.2))
    y, left = np.arange(len(rows)), np.zeros(len(rows))
    for label, column, times, color in parts:
        width = np.array([r[column] * times for r in rows], dtype=float)
        ax.barh(y, width, left=left, color=color, label=label)
        left += width
    ax.scatter([2 * r["ms/it"] for r in rows], y, marker="|", s=600, color="k", label="2 cores x the iteration's time")
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r['phase']}\n{r['ms/it']:.0f} ms/it" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("CPU ms per iteration")
    ax.set_title(f"Where the CPU goes through a failure (rebuild share {share})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(IMG / "recovery_during_cpu.png", dpi=110)


def recovery_size(plt) -> None:
    """Rebuild time against rows rebuilt."""
    data = _load("recovery_size")
    if not data:
        return
    rows = np.array(data["rows"], dtype=object)
    rebuilt, secs = rows[:, 1].astype(float), rows[:, 3].astype(float)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot(rebuilt / 1e3, secs, "o-")
    ax.set_xlabel("rows rebuilt (thousands; 260 B each)")
    ax.set_ylabel("seconds to full protection")
    ax.set_title("Rebuild time against shard size (idle cluster)", fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(IMG / "recovery_size.png", dpi=110)


def train_loop(plt) -> None:
    """Throughput of each store against numpy, per workload and model step."""
    runs = sorted(RESULTS.glob("train_loop_*.json"))
    runs = [json.loads(p.read_text()) for p in runs if "inprocess" not in p.name]
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(9, 3.8))
    stores = [row[0] for row in runs[0]["rows"]]
    width = 0.8 / len(runs)
    for n, run in enumerate(runs):
        ratio = {row[0]: row[3] for row in run["rows"]}
        label = f"{run['workload'].split(':')[0]}, {run['compute_ms']:g} ms model step"
        ax.bar(np.arange(len(stores)) + n * width, [ratio.get(s, 0) for s in stores], width, label=label)
    ax.set_xticks(np.arange(len(stores)) + width * (len(runs) - 1) / 2)
    ax.set_xticklabels([s.replace(", window_seconds=1.0", "").replace(", window_steps=", "\nW=")
                        .replace(" + ", "\n+ ").replace(" nodes", "\nnodes") for s in stores], fontsize=7)
    ax.set_ylabel("ids/s against in-process numpy")
    ax.set_title("Training-loop throughput (node processes on loopback, 2 cores)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(IMG / "train_loop.png", dpi=110)


def recovery_vs_checkpoint(plt) -> None:
    """Time to recover against the checkpoint interval, beside ectable's rebuild; checkpoint overhead."""
    data = _load("recovery_vs_checkpoint")
    if not data:
        return
    every = np.logspace(1, 4, 60)
    it = data["iteration_s"]
    total = data["checkpoint_read_s"] + every / 2 * it
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.loglog(every, total, label="full checkpoint: reload + replay of half an interval")
    ax.axhline(data["ectable_rebuild_s"], color="C1", label="ectable: rebuild onto a spare")
    if data.get("ectable_training_lost_s"):
        ax.axhline(data["ectable_training_lost_s"], color="C2", ls="--", label="ectable: training time the failure cost")
    ax.set_xlabel("iterations between full checkpoints")
    ax.set_ylabel("seconds")
    over = ax.twinx()
    over.loglog(every, data["checkpoint_write_s"] / (every * it), color="C3", lw=0.8, ls=":")
    over.set_ylabel("checkpoint overhead (dotted)", color="C3")
    ax.set_title(f"Recovery against full checkpoints ({data.get('workload', '').split(':')[0]}, {data['table_rows']:,} rows)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(IMG / "recovery_vs_checkpoint.png", dpi=110)


def memory_per_node(plt) -> None:
    """Bytes per node against replication that survives as many failures."""
    data = _load("memory_per_node")
    if not data:
        return
    rows = data["rows"]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.bar(x - 0.2, [r[4] for r in rows], 0.4, label="ectable (data + parity + window)")
    ax.bar(x + 0.2, [r[6] for r in rows], 0.4, label="replication, same failures survived")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r[0]}\n{r[1]} nodes" for r in rows])
    ax.set_ylabel("MiB per node")
    ax.set_title(f"Memory per node, criteo-like x{data['scale']:g}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(IMG / "memory_per_node.png", dpi=110)


def node_cpu(plt) -> None:
    """Node CPU per iteration of each store in the training loop, and a node's parity work by part."""
    loop, parts = _load("train_loop_criteo_compute20ms"), _load("node_time_criteo")
    if not loop or "cpu_ms_per_iteration" not in loop or not parts:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    cpu = loop["cpu_ms_per_iteration"]
    names = [n for n in cpu if "CURVE" not in n]
    left.barh(np.arange(len(names)), [cpu[n][0] for n in names], color="tab:blue", label="node processes")
    left.barh(np.arange(len(names)), [cpu[n][1] for n in names], left=[cpu[n][0] for n in names],
              color="tab:gray", label="trainer")
    left.set_yticks(np.arange(len(names)))
    left.set_yticklabels([n.replace(", window_seconds=1.0", "") for n in names], fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("CPU ms per iteration")
    left.set_title("Training loop, criteo-like, 20 ms model step", fontsize=9)
    left.legend(fontsize=7)
    columns = parts["columns"]
    pieces = [c for c in ("close_window", "op_delta", "apply_queued") if c in columns]
    stores = [row[0] for row in parts["rows"] if row[0] != "none"]
    bottom = np.zeros(len(stores))
    for piece in pieces:
        values = np.array([row[columns.index(piece)] for row in parts["rows"] if row[0] != "none"], dtype=float)
        right.bar(stores, values, bottom=bottom, label=piece)
        bottom += values
    right.tick_params(axis="x", labelsize=7)
    right.set_ylabel("ms per iteration, 6 nodes")
    right.set_title("Parity work by part, in process", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(IMG / "node_cpu.png", dpi=110)


def lookahead(plt) -> None:
    """Iteration time against the lookahead L, per workload and model step, beside the plain loop, the
    in-process numpy loop and the model step alone."""
    data = _load("lookahead")
    if not data:
        return
    rows = [dict(zip(data["columns"], r)) for r in data["rows"]]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.2), squeeze=False)
    biggest = max(r["C"] for r in rows if isinstance(r["C"], int))
    for ax, workload in zip(axes[0], workloads):
        for compute in dict.fromkeys(r["compute_ms"] for r in rows if r["workload"] == workload):
            mine = [r for r in rows if r["workload"] == workload and r["compute_ms"] == compute]
            points = sorted((r["L"], r["ms/batch"]) for r in mine if isinstance(r["L"], int) and r["C"] == biggest)
            line, = ax.plot(*zip(*points), "o-", label=f"lookahead, {compute} ms model step")
            for r in mine:
                if r["L"] == "plain":
                    ax.axhline(r["ms/batch"], color=line.get_color(), ls="--", lw=1, label=f"plain loop, {compute} ms")
                elif str(r["L"]).startswith("numpy"):
                    ax.axhline(r["ms/batch"], color=line.get_color(), ls=":", lw=1, label=f"numpy in process, {compute} ms")
            if compute:
                ax.axhline(compute, color="k", lw=0.8, label=f"the {compute} ms model step alone")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("lookahead L (batches read ahead)")
        ax.set_ylabel("ms per batch")
        ax.set_ylim(bottom=0)
        ax.set_title(workload, fontsize=10)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(IMG / "lookahead.png", dpi=110)


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    IMG.mkdir(parents=True, exist_ok=True)
    for plot in (train_loop, node_cpu, recovery_during, recovery_during_cpu, recovery_size, recovery_vs_checkpoint,
                 memory_per_node, lookahead):
        plot(plt)
    print(f"wrote plots to {IMG}")


if __name__ == "__main__":
    main()
