"""An ectable cluster whose every process runs on a host of its own (`netns.Hosts`).

    etcd-0..      etcd members (a cluster of `etcd` members)
    decider-0..   `ectable decider`
    node-0..      `ectable node --id N`, one per position
    spare-0..     `ectable node` without a position
    ops           where `ectable status` runs
    trainer-0..   started by `trainer()`: `python -m ectable.testing.trainer`

Every process talks to the others over its host's address only, with CURVE keys made by
`ectable keygen`; its files (one TOML per process, as an operator would hand them out), logs
and etcd data are under `workdir`.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time

from .. import config as cluster_config
from ..membership.server import etcd_binary
from .netns import Hosts

NODE_PORT = 7000
ETCD_CLIENT, ETCD_PEER = 2379, 2380


class HostCluster:
    def __init__(self, hosts: Hosts, workdir: str, nodes: int = 8, spares: int = 1, code: str = "xor", k: int = 4,
                 r: int = 1, etcd: int = 3, deciders: int = 2, trainers: int = 2):
        self.hosts, self.workdir = hosts, workdir
        self.nodes, self.spares = nodes, spares
        os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)
        names = ([f"etcd-{i}" for i in range(etcd)] + [f"decider-{i}" for i in range(deciders)]
                 + [f"node-{i}" for i in range(nodes)] + [f"spare-{i}" for i in range(spares)] + ["ops"]
                 + [f"trainer-{i}" for i in range(trainers)])
        for name in names:
            hosts.add(name)
        self.etcd = [f"etcd-{i}" for i in range(etcd)]
        keys = os.path.join(workdir, "keys")
        subprocess.run([sys.executable, "-m", "ectable", "keygen", "--out", keys, "--nodes", str(nodes + spares),
                        "--deciders", str(deciders), "--clients", str(trainers + 1)], check=True, capture_output=True)
        shared = {
            "cluster": {"nodes": nodes, "code": code, "k": k, "r": r},
            "nodes": {"endpoints": [self.endpoint(f"node-{i}") for i in range(nodes)]},
            "membership": {"endpoints": [f"http://{hosts.addresses[e]}:{ETCD_CLIENT}" for e in self.etcd],
                           "prefix": f"/ectable/{secrets.token_hex(4)}"},
            "control": {"token": secrets.token_hex(16)},
        }
        own = {f"node-{i}": f"node-{i}" for i in range(nodes)}
        own.update({f"spare-{i}": f"node-{nodes + i}" for i in range(spares)})
        own.update({f"decider-{i}": f"decider-{i}" for i in range(deciders)})
        own.update({f"trainer-{i}": f"client-{i}" for i in range(trainers)})
        own["ops"] = f"client-{trainers}"
        for host, key in own.items():
            security = cluster_config.load(os.path.join(keys, f"{key}.toml"))["security"]
            data = dict(shared) if host.startswith(("node", "spare", "decider")) else {"membership": shared["membership"]}
            cluster_config.write_private(self.file(host), {**data, "security": security})

    def endpoint(self, host: str) -> str:
        return f"tcp://{self.hosts.addresses[host]}:{NODE_PORT}"

    def file(self, host: str) -> str:
        """The TOML file of the process on `host`."""
        return os.path.join(self.workdir, f"{host}.toml")

    def log(self, host: str) -> str:
        return os.path.join(self.workdir, "logs", f"{host}.log")

    def start(self, host: str, argv: list[str]) -> subprocess.Popen:
        """Run `argv` on `host`, its output to the host's log (replacing what ran there before)."""
        with open(self.log(host), "ab") as log:
            return self.hosts.popen(host, argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    # -- the cluster -------------------------------------------------------
    def up(self, timeout: float = 120.0) -> None:
        """Start etcd, the deciders, the nodes and the spares; return once every node is up."""
        peers = ",".join(f"{e}=http://{self.hosts.addresses[e]}:{ETCD_PEER}" for e in self.etcd)
        for e in self.etcd:
            address = self.hosts.addresses[e]
            self.start(e, [etcd_binary(), "--name", e, "--data-dir", os.path.join(self.workdir, e),
                           "--listen-client-urls", f"http://{address}:{ETCD_CLIENT}",
                           "--advertise-client-urls", f"http://{address}:{ETCD_CLIENT}",
                           "--listen-peer-urls", f"http://{address}:{ETCD_PEER}",
                           "--initial-advertise-peer-urls", f"http://{address}:{ETCD_PEER}",
                           "--initial-cluster", peers, "--initial-cluster-state", "new",
                           "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn"])
        python = [sys.executable, "-m", "ectable"]
        for host in [h for h in self.hosts.addresses if h.startswith("decider-")]:
            self.start(host, [*python, "decider", "--config", self.file(host)])
        for i in range(self.nodes):
            self.start(f"node-{i}", [*python, "node", "--config", self.file(f"node-{i}"), "--id", str(i)])
        for i in range(self.spares):
            self.start(f"spare-{i}", [*python, "node", "--config", self.file(f"spare-{i}"),
                                      "--bind", self.endpoint(f"spare-{i}")])
        self.wait(self.whole, timeout, "every node up")

    def whole(self, status: dict) -> bool:
        """Whether every position is served by an active node and every spare is free."""
        return all(n["role"] == "active" for n in status["nodes"]) and status["spares"] == self.spares

    def status(self, timeout: float = 60.0) -> dict | None:
        """`ectable status --json` run on the ops host; None if it failed."""
        done = self.hosts.run("ops", [sys.executable, "-m", "ectable", "status", "--json", "--config", self.file("ops")],
                              timeout=timeout)
        if done.returncode != 0:
            self.last_error = done.stderr.strip() or done.stdout.strip()
            return None
        return json.loads(done.stdout)

    def wait(self, ready, timeout: float, what: str) -> dict:
        """Poll the status until `ready(status)`; AssertionError naming `what` (and the last status) if it never is."""
        deadline, status = time.monotonic() + timeout, None
        self.last_error = None
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and ready(status):
                return status
            time.sleep(0.5)
        raise AssertionError(f"not {what} within {timeout} s: last status {status}, last error {self.last_error}")

    def python(self, host: str, code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a Python snippet on `host`."""
        return self.hosts.run(host, [sys.executable, "-c", code], timeout=timeout)

    # -- trainers ----------------------------------------------------------
    def trainer(self, host: str, table: str, seed: int, **options) -> "Trainer":
        return Trainer(self, host, table, seed, options)


class Trainer:
    """A `ectable.testing.trainer` process on a host of its own, and what it logged."""

    def __init__(self, cluster: HostCluster, host: str, table: str, seed: int, options: dict):
        self.table = table
        self.stop_file = os.path.join(cluster.workdir, f"{table}-{seed}.stop")
        self.out = os.path.join(cluster.workdir, f"{table}-{seed}.jsonl")
        extra = [a for key, value in options.items() for a in (f"--{key}", str(value))]
        self.proc = cluster.start(host, [sys.executable, "-m", "ectable.testing.trainer", "--config", cluster.file(host),
                                         "--table", table, "--seed", str(seed), "--stop", self.stop_file,
                                         "--out", self.out, *extra])
        self.log = cluster.log(host)

    def events(self) -> list[dict]:
        try:
            with open(self.out) as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def steps(self) -> int:
        return max((e["step"] for e in self.events() if "step" in e), default=0)

    def errors(self) -> list[dict]:
        return [e for e in self.events() if "error" in e]

    def wait_steps(self, steps: int, timeout: float) -> None:
        """Wait until the trainer made `steps` more steps than now."""
        target, deadline = self.steps() + steps, time.monotonic() + timeout
        while self.steps() < target:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"trainer made {self.steps()} of {target} steps; {self.tail()}")
            time.sleep(0.2)

    def finish(self, timeout: float = 120.0) -> dict:
        """Stop it and return its final check ({steps, stale, errors, lost, unknown})."""
        open(self.stop_file, "w").close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"trainer did not finish within {timeout} s; {self.tail()}") from None
        final = [e["final"] for e in self.events() if "final" in e]
        assert final, f"trainer exited ({self.proc.returncode}) without its final check; {self.tail()}"
        return final[0]

    def tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "log: " + f.read()[-3000:]
        except FileNotFoundError:
            return "no log"
