"""Test hosts on one machine: Linux network namespaces, each with its own address, joined by a bridge.

`Hosts()` makes a switch namespace holding a bridge; `add(name)` makes a host namespace with one
interface (`eth0`, a veth pair whose other end is on the bridge) and the next address of
198.18.0.0/24 (inside 198.18.0.0/15, the range reserved for benchmark networks). A host has a
route to that subnet only: nothing it sends can leave the machine, and it does not see the
machine's own addresses (its loopback is its own). Needs root and iproute2 (`available()` says why
not). Partitions, not kills:

- `cut(name)` / `heal(name)` take the host's link down and up again (it reaches no one, no one it);
- `block(a, b)` / `unblock(a, b)` drop everything between two hosts (blackhole routes on both).

`popen(name, argv)` runs a program inside a host (`ip netns exec`). `close()` kills what was
started there and deletes every namespace (their interfaces go with them); it also runs at
interpreter exit, and a new `Hosts()` deletes namespaces left by processes that died.
"""
from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import time

from ..membership.server import dies_with_parent

PREFIX = "ectable-"  # namespace names: ectable-<pid of the owner>-<tag>-<host>
SUBNET = "198.18.0"


def available() -> str | None:
    """None when namespaces can be made here, else why not (for a test's skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`"
    probe = f"{PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> str:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def sweep() -> list[str]:
    """Delete namespaces of ours whose owning process is gone; the names deleted."""
    gone = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        try:
            owner = int(name[len(PREFIX):].split("-", 1)[0])
            os.kill(owner, 0)
            continue  # its owner lives
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        gone.append(name)
    return gone


class Hosts:
    """Hosts in network namespaces on one bridge (see the module's docstring)."""

    def __init__(self):
        sweep()
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.switch = f"{self.tag}-switch"
        self.addresses: dict[str, str] = {}  # host -> its address
        self._ports: dict[str, str] = {}  # host -> its veth on the bridge
        self._procs: list[subprocess.Popen] = []
        self._namespaces: list[str] = []
        atexit.register(self.close)
        self._netns(self.switch)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)

    def _netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("link", "set", "lo", "up", ns=name)

    def ns(self, host: str) -> str:
        """The namespace of `host`."""
        return f"{self.tag}-{host}"

    def add(self, host: str) -> str:
        """A new host on the bridge; returns its address."""
        if host in self.addresses:
            raise ValueError(f"host {host!r} exists")
        index = len(self.addresses) + 1
        if index > 250:
            raise ValueError("at most 250 hosts")
        ns, port, address = self.ns(host), f"p{index}", f"{SUBNET}.{index}"
        self._netns(ns)
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
        _ip("link", "set", port, "master", "br0", "up", ns=self.switch)
        _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
        _ip("link", "set", "eth0", "up", ns=ns)
        self.addresses[host], self._ports[host] = address, port
        return address

    def routes(self, host: str) -> list[str]:
        """The host's routing table, one route per line."""
        return [line for line in _ip("route", "show", "table", "all", ns=self.ns(host)).splitlines() if line.strip()]

    # -- partitions --------------------------------------------------------
    def cut(self, host: str) -> None:
        """Take the host's link down: it reaches no one and no one reaches it (it keeps running)."""
        _ip("link", "set", self._ports[host], "down", ns=self.switch)

    def heal(self, host: str) -> None:
        _ip("link", "set", self._ports[host], "up", ns=self.switch)

    def block(self, a: str, b: str) -> None:
        """Drop everything between hosts a and b, both ways; each still reaches every other host."""
        _ip("route", "add", "blackhole", f"{self.addresses[b]}/32", ns=self.ns(a))
        _ip("route", "add", "blackhole", f"{self.addresses[a]}/32", ns=self.ns(b))

    def unblock(self, a: str, b: str) -> None:
        _ip("route", "del", "blackhole", f"{self.addresses[b]}/32", ns=self.ns(a))
        _ip("route", "del", "blackhole", f"{self.addresses[a]}/32", ns=self.ns(b))

    # -- programs ----------------------------------------------------------
    def argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run inside the host."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside the host; `close()` kills it (its own process group), and so does Linux when
        the thread that started it ends."""
        proc = subprocess.Popen(self.argv(host, argv), start_new_session=True, preexec_fn=dies_with_parent(os.getpid()),
                                **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run `argv` inside the host to its end (bounded by `timeout`); its output as text."""
        return subprocess.run(self.argv(host, argv), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        """Kill every program started here and delete every namespace."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
        for name in reversed(self._namespaces):
            for _ in range(50):  # a namespace whose last process is still exiting is busy a moment
                if subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
        self._namespaces = []
        atexit.unregister(self.close)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
