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
        t = np.cumsum(times)
        t = t - t[s["kill_at"]]  # seconds since the SIGKILL
        rate = 1 / np.convolve(times, np.ones(5) / 5, mode="valid")  # smoothed over 5 iterations
        line, = ax.plot(t[2:-2], rate, lw=1, label=f"rebuild share {share}")
        busy = np.flatnonzero(s["rebuilding"])
        if busy.size:
            ax.axvspan(t[busy[0]], t[busy[-1]], color=line.get_color(), alpha=0.08)
    ax.axvline(0, color="k", lw=0.8, ls="--")
    ax.text(0, ax.get_ylim()[1] * 0.95, " SIGKILL", va="top")
    ax.set_xlabel("seconds since the SIGKILL (shaded: the spare is rebuilding)")
    ax.set_ylabel("iterations / s")
    ax.set_title(f"Training through a node failure ({data['rows']:,} rows, dim 64, xor(4,1), "
                 f"{data['compute_ms']:.0f} ms model step)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(IMG / "recovery_during.png", dpi=110)


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


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    IMG.mkdir(parents=True, exist_ok=True)
    for plot in (recovery_during, recovery_size):
        plot(plt)
    print(f"wrote plots to {IMG}")


if __name__ == "__main__":
    main()
