"""Every result in bench/results/ as one Markdown file of tables (bench/results/summary.md).

    python -m bench.report
"""
from __future__ import annotations

import json

from .common import RESULTS, machine


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(data: dict) -> str:
    lines = ["| " + " | ".join(data["columns"]) + " |", "|" + "---|" * len(data["columns"])]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in data["rows"]]
    return "\n".join(lines)


def main() -> None:
    parts = [f"# Benchmark results\n\nmachine: {machine()}\n"]
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if "columns" not in data or not isinstance(data.get("rows"), list):
            continue
        title = data["benchmark"] + (f" — {data['workload']}" if data.get("workload") else "")
        if data.get("compute_ms"):
            title += f", {data['compute_ms']:g} ms model step"
        parts.append(f"## {title}\n\n{table(data)}\n")
    out = RESULTS / "summary.md"
    out.write_text("\n".join(parts))
    print(f"wrote {out.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    main()
