"""A node process's Prometheus metrics, served over HTTP by `prometheus_client` on a port of its own.

Counters grow as the node answers requests; gauges are set from the node's status about once a
second by the node's own loop (so a scrape never reads the node's state from another thread).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from ..protocol.messages import REQUESTS

KNOWN_OPS = frozenset(REQUESTS)

GAUGES = {  # name: (help, the node status field it shows)
    "data_rows": ("Data rows this node holds, all tables", "data_rows"),
    "parity_rows": ("Parity rows this node holds, all tables", "parity_rows"),
    "table_bytes": ("Bytes of the rows and parity rows this node holds", "bytes"),
    "dirty_rows": ("Rows written in the open window, whose parity deltas are not sent yet", "dirty_rows"),
    "unacked_deltas": ("Parity deltas sent and not yet acknowledged by their parity holders (delta lag)",
                       "unacked_deltas"),
    "rebuild_rows_left": ("Rows this node still has to rebuild (0 once whole)", "rebuild_missing"),
    "resident_bytes": ("Resident memory of the node process", "rss_bytes"),
    "tables": ("Tables this node holds", "tables"),
}


class NodeMetrics:
    """The metrics of one node process, served on `port` at `addr` (`/metrics`)."""

    def __init__(self, port: int, addr: str = "127.0.0.1"):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("ectable_requests", "Requests answered, by operation", ["op"], registry=registry)
        self.rows_read = Counter("ectable_rows_read", "Rows clients asked this node for", registry=registry)
        self.rows_written = Counter("ectable_rows_written", "Rows clients wrote to this node", registry=registry)
        self.gauges = {name: Gauge(f"ectable_{name}", text, registry=registry) for name, (text, _) in GAUGES.items()}
        self.parity_lag = Gauge("ectable_parity_lag_writes", "Writes applied here whose parity is not yet safe",
                                registry=registry)
        self.window_age = Gauge("ectable_window_age_seconds", "Age of the open window's oldest write (0: none)",
                                registry=registry)
        self.rebuild_done = Gauge("ectable_rebuild_rows_done", "Rows rebuilt so far by this node's rebuild",
                                  registry=registry)
        self.rebuild_rate = Gauge("ectable_rebuild_rows_per_second", "Rows per second of this node's rebuild",
                                  registry=registry)
        self.rebuilding = Gauge("ectable_rebuilding", "1 while this node rebuilds its rows, else 0", registry=registry)
        self.server, self.thread = start_http_server(port, addr=addr, registry=registry)
        self.port = self.server.server_port

    def answered(self, op: str, rows_read: int = 0, rows_written: int = 0) -> None:
        """One request answered (an operation no node takes counts as "unknown": labels stay bounded)."""
        self.requests.labels(op=op if op in KNOWN_OPS else "unknown").inc()
        if rows_read:
            self.rows_read.inc(rows_read)
        if rows_written:
            self.rows_written.inc(rows_written)

    def update(self, status: dict, window_age: float) -> None:
        """Set the gauges from a node's `status()` (with the process's `rss_bytes`)."""
        for name, (_, field) in GAUGES.items():
            if status.get(field) is not None:
                self.gauges[name].set(status[field])
        self.parity_lag.set(status["write_seq"] - status["durable_seq"])
        self.window_age.set(window_age)
        rebuild = status.get("rebuild") or {}
        self.rebuilding.set(1 if status.get("role") == "rebuilding" else 0)
        self.rebuild_done.set(rebuild.get("done", 0))
        self.rebuild_rate.set(rebuild.get("rate", 0.0))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
