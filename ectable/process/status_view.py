"""What `ectable status` shows: a client's `status()` as a table, and a watch that is never stale."""
from __future__ import annotations

import json
import os
import threading
import time


def render(status: dict) -> str:
    """A readable table of a client's `status()`: the cluster, its nodes (process, address, memory), its
    tables, and a progress bar while a node rebuilds or a checkpoint is written."""
    code = status["code"]
    head = (f"code {code['id']}(k={code['k']}, r={code['r']})  epoch {status.get('epoch', '-')}  "
            f"tables {len(status['tables'])}  spares {status['spares']}  dirty rows {status['dirty_rows']}  "
            f"parity lag {status['parity_lag_writes']} writes  degraded {status['degraded'] or '-'}"
            + (f"  draining {status['draining']}" if status.get("draining") else ""))
    cols = ["node", "role", "health", "pid", "memory", "data rows", "parity rows", "dirty", "unacked", "rebuild left",
            "rejected", "endpoint"]
    rows = [[n.get("position"), n.get("role"), n.get("health"), n.get("pid", "-"), _mib(n.get("rss_bytes")),
             n.get("data_rows", "-"), n.get("parity_rows", "-"), n.get("dirty_rows", "-"), n.get("unacked_deltas", "-"),
             n.get("rebuild_missing", "-"), n.get("rejected", 0) + n.get("malformed", 0) if "rejected" in n else "-",
             n.get("endpoint", "")] for n in status["nodes"]]
    lines = [head, *_table(cols, rows)]
    if status["tables"]:
        lines += ["", *_table(["table", "rows", "dim", "optimizer"],
                              [[name, f"{t['num_rows']:,}", t["dim"], t["optimizer"]["name"]]
                               for name, t in sorted(status["tables"].items())])]
    for n in status["nodes"]:
        if n.get("role") == "rebuilding":
            lines.append(f"node {n['position']} rebuilding " + progress_bar(n["rebuild"]))
    checkpoint = status.get("checkpoint")
    if checkpoint:
        lines.append(f"checkpoint {checkpoint['number']} ({checkpoint['kind']}) writing " + progress_bar(
            {"done": checkpoint["written"], "left": checkpoint["rows"] - checkpoint["written"]}))
    if status["degraded"] and not status["spares"] and not status["recovery"]["rebuilding"]:
        lines.append(f"nodes {status['degraded']} are down and no spare is left: serving degraded")
    return "\n".join(lines)


def _table(cols: list, rows: list) -> list[str]:
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    return ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [cols, *rows]]


def _mib(n) -> str:
    return "-" if n is None else f"{n / (1 << 20):,.0f} MiB"


def progress_bar(progress: dict, width: int = 30) -> str:
    """[#####.....]  45%  12,000 / 26,000 rows  3,100 rows/s  ETA 4.5 s"""
    done, left = progress.get("done", 0), progress.get("left", 0)
    total = done + left
    share = done / total if total else 1.0
    fill = int(round(share * width))
    eta = progress.get("eta")
    return (f"[{'#' * fill}{'.' * (width - fill)}] {share:4.0%}  {done:,} / {total:,} rows  "
            f"{progress.get('rate', 0.0):,.0f} rows/s  ETA {'-' if eta is None else f'{eta:.1f} s'}")


class Watch:
    """Frames of a cluster's status every `interval` seconds. The status is asked for in a thread of its
    own, so a cluster that stops answering shows as such at the next frame, never as its last good
    frame; a cluster whose file is gone (`ectable down`) ends the watch."""

    def __init__(self, client, path: str, interval: float, as_json: bool = False):
        self.client, self.path, self.interval, self.as_json = client, path, interval, as_json
        self.stale_after = max(3.0, 3 * interval)
        self._latest: tuple[float, dict] | None = None  # (when, status)
        self._failure: tuple[float, str] | None = None  # (when, what) of the last failed ask
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="ectable-status", daemon=True)
        self._started = time.time()
        self._thread.start()

    def frames(self):
        """Each frame's text, until the cluster's file is gone (then a last frame saying so)."""
        deadline = time.monotonic() + self.stale_after
        while self._latest is None and self._failure is None and time.monotonic() < deadline:
            self._stop.wait(0.05)  # the first answer
        while True:
            if not os.path.exists(self.path):
                yield self._note(f"{self.path} is gone: the cluster was stopped")
                return
            yield self.frame()
            self._stop.wait(self.interval)

    def frame(self) -> str:
        now = time.time()
        if self._latest is not None and now - self._latest[0] <= self.stale_after:
            when, status = self._latest
            if self.as_json:
                return json.dumps({"time": when, "status": status}, default=str)
            return f"{time.strftime('%H:%M:%S', time.localtime(when))}  " + render(status)
        since = self._latest[0] if self._latest is not None else self._started
        why = f" ({self._failure[1]})" if self._failure is not None else ""
        return self._note(f"no answer from the cluster for {now - since:.0f} s{why}")

    def _note(self, text: str) -> str:
        return json.dumps({"time": time.time(), "error": text}) if self.as_json else \
            f"{time.strftime('%H:%M:%S')}  {text}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.stale_after)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self._latest = (time.time(), self.client.status())
            except Exception as exc:  # shown in the next frame; asked again
                self._failure = (time.time(), f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)
