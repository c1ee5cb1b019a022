"""The three-host walk-through of docs/operations.md, done on network namespaces (needs root).

Hosts a, b and c each run an etcd member, two nodes (systemd units `ectable-node@a-0`, `@a-1`) and,
on a and b, a decider; rs(4,2) over six nodes survives the loss of a whole host. Host d joins
later with a spare, `trainer` runs the training job and `ectable status`. Node c-1 is drained (its
position handed to the spare); d starts a second spare, which is added as a seventh position (the
cluster laid out again over seven nodes), and a third. Then host b fails (its link goes down), the
spare takes one of its positions, the other is served through the parity, and every row is checked; at the end a new cluster on a, c and d is restored from the
checkpoint and checked row by row. Prints the transcript (Markdown) it runs; `make walkthrough`
writes it to docs/walkthrough.md:

    sudo .venv/bin/python examples/three_hosts.py > docs/walkthrough.md
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from ectable import config as cluster_config
from ectable.membership.server import etcd_binary
from ectable.testing.netns import Hosts, available

HOSTS = ["a", "b", "c", "d", "trainer"]
NODES = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]  # position -> (host, instance): name a-0...

TRAIN = """
import numpy as np, ectable
client = ectable.connect("client.toml")
client.create_table("items", num_rows=200_000, dim=16, optimizer="adagrad", lr=0.05)
rng = np.random.default_rng(0)
for step in range(200):
    ids = rng.integers(0, 200_000, 4096)
    client.apply_gradient("items", ids, rng.standard_normal((ids.size, 16)).astype(np.float32))
    client.step()
number = client.checkpoint("{ckpt}")  # the nodes write their pieces there (an object store in production)
client.checkpoint_wait()
np.save("{ref}", client.get("items", np.arange(200_000)))
print(f"200 steps; checkpoint {{number}} written; rows saved for the checks below")
client.close()
"""

CHECK = """
import numpy as np, ectable
client = ectable.connect("{config}")
rows = client.get("items", np.arange(200_000))
differ = int((rows != np.load("{ref}")).any(axis=1).sum())
print(f"{{differ}} of 200,000 rows differ from the rows saved after training")
client.close()
"""


class Walk:
    def __init__(self, hosts: Hosts, workdir: str):
        self.hosts, self.workdir = hosts, workdir
        self.python = sys.executable
        self.logs = os.path.join(workdir, "logs")
        os.makedirs(self.logs)

    def say(self, text: str) -> None:
        print(text + "\n", flush=True)

    def shell(self, host: str, argv: list[str], shown: str | None = None, stdin: str | None = None) -> str:
        """Run a command on a host to its end and print it with its output."""
        done = subprocess.run(self.hosts.argv(host, argv), capture_output=True, text=True, cwd=self.workdir,
                              input=stdin, timeout=600)
        self.say(f"```\n{host}$ {shown or shlex.join(argv)}\n{(done.stdout + done.stderr).rstrip()}\n```")
        if done.returncode != 0:
            raise SystemExit(f"failed on {host}: {shown or argv}")
        return done.stdout

    def service(self, host: str, name: str, argv: list[str]) -> subprocess.Popen:
        """What `systemctl start NAME` runs on the host (its unit's ExecStart), output to a log."""
        with open(os.path.join(self.logs, f"{host}-{name}.log"), "ab") as log:
            return self.hosts.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)

    def wait_status(self, ready, what: str, config: str = "client.toml", timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(self.hosts.argv("trainer", [self.python, "-m", "ectable", "status", "--json", "--config",
                                                              config]), capture_output=True, text=True, cwd=self.workdir)
            if done.returncode == 0:
                if ready(json.loads(done.stdout)):
                    return
            time.sleep(0.5)
        raise SystemExit(f"not {what} within {timeout} s")


def main() -> None:
    why = available()
    if why:
        sys.exit(f"three_hosts: {why}")
    workdir = tempfile.mkdtemp(prefix="ectable-walk-")
    try:
        walk_through(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def walk_through(workdir: str) -> None:
    with Hosts() as hosts:
        address = {h: hosts.add(h) for h in HOSTS}
        walk = Walk(hosts, workdir)
        py = walk.python
        ectable = [py, "-m", "ectable"]
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
        walk.say(f"# Three hosts: a walk-through\n\nDone on network namespaces by `make walkthrough` at {commit} "
                 "(`examples/three_hosts.py`, which prints this page); hosts a, b, c and d, and the trainer's host, "
                 "each have their own address, and the commands below are what ran there. The addresses are "
                 "198.18.0.1–5 (a test network); the paths are shortened.")
        walk.say("## Keys and the cluster file\n\nOn the operator's machine: one key pair per node (spares to come "
                 "included), decider and client.")
        walk.shell("trainer", [*ectable, "keygen", "--out", "keys", "--nodes", "9", "--deciders", "2", "--clients", "2"],
                   "ectable keygen --out keys --nodes 9 --deciders 2 --clients 2")
        etcd = [f"http://{address[h]}:2379" for h in "abc"]
        cluster = {"cluster": {"nodes": 6, "code": "rs", "k": 4, "r": 2},
                   "nodes": {"endpoints": [f"tcp://{address[h]}:{7000 + i}" for h, i in NODES],
                             "names": [f"{h}-{i}" for h, i in NODES]},
                   "membership": {"endpoints": etcd, "prefix": "/ectable/prod"},
                   "control": {"token": os.urandom(16).hex()}}
        shown = dict(cluster, control={"token": "<32 hex digits: a secret the deciders and nodes share>"})
        walk.say(f"`cluster.toml`, the same on every host:\n\n```toml\n{cluster_config.dumps(shown).rstrip()}\n```\n\n"
                 "Each process gets the cluster file plus its own `[security]` section (its key pair and every "
                 "role's public keys from `keys/`), mode 0600, copied to its host only: node a-0 gets "
                 "`/etc/ectable/node-a-0.toml` with `keys/node-0.toml`'s section, and so on; deciders `decider.toml`, "
                 "trainers `client.toml`.")

        def own(name: str, key: str, sections: dict) -> None:
            security = cluster_config.load(os.path.join(workdir, "keys", f"{key}.toml"))["security"]
            cluster_config.write_private(os.path.join(workdir, name), {**sections, "security": security})
        for n, (h, i) in enumerate(NODES):
            own(f"node-{h}-{i}.toml", f"node-{n}", cluster)
        for n in range(2):
            own(f"decider-{n}.toml", f"decider-{n}", cluster)
        cluster_config.write_private(os.path.join(workdir, "cluster.toml"), cluster)  # the operator's, without keys
        own("client.toml", "client-0", {"membership": cluster["membership"]})

        peers = ",".join(f"{h}=http://{address[h]}:2380" for h in "abc")
        walk.say("## Units\n\nOn every host (`%i` is the node's name, `%H` the host's):\n\n```ini\n"
                 "# /etc/systemd/system/ectable-etcd.service\n[Service]\nExecStart=/usr/local/bin/etcd --name %H "
                 "--data-dir /var/lib/ectable-etcd --listen-client-urls http://ADDRESS:2379 --advertise-client-urls "
                 "http://ADDRESS:2379 --listen-peer-urls http://ADDRESS:2380 --initial-advertise-peer-urls "
                 f"http://ADDRESS:2380 --initial-cluster {peers} --initial-cluster-state new\nRestart=always\n\n"
                 "# /etc/systemd/system/ectable-node@.service\n[Service]\nExecStart=/opt/ectable/bin/ectable node "
                 "--config /etc/ectable/node-%i.toml --name %i\nRestart=on-failure\n\n"
                 "# /etc/systemd/system/ectable-decider.service (on a and b)\n[Service]\nExecStart=/opt/ectable/bin/"
                 "ectable decider --config /etc/ectable/decider.toml\nRestart=always\n```\n\n"
                 "Below, each `systemctl start` runs its unit's `ExecStart` on the host.")
        started = []
        for h in "abc":
            a = address[h]
            walk.service(h, "etcd", [etcd_binary(), "--name", h, "--data-dir", os.path.join(workdir, f"etcd-{h}"),
                                     "--listen-client-urls", f"http://{a}:2379", "--advertise-client-urls",
                                     f"http://{a}:2379", "--listen-peer-urls", f"http://{a}:2380",
                                     "--initial-advertise-peer-urls", f"http://{a}:2380", "--initial-cluster", peers,
                                     "--initial-cluster-state", "new", "--log-level", "warn"])
            started.append(f"{h}$ systemctl start ectable-etcd")
        for n, h in enumerate("ab"):
            walk.service(h, "decider", [*ectable, "decider", "--config", f"decider-{n}.toml"])
            started.append(f"{h}$ systemctl start ectable-decider    # decider-{n}.toml")
        for h, i in NODES:
            walk.service(h, f"node-{i}", [*ectable, "node", "--config", f"node-{h}-{i}.toml", "--name", f"{h}-{i}"])
            started.append(f"{h}$ systemctl start ectable-node@{h}-{i}")
        walk.say("## Start\n\n```\n" + "\n".join(started) + "\n```")
        walk.wait_status(lambda s: all(n["role"] == "active" for n in s["nodes"]), "every node up")
        walk.shell("trainer", [*ectable, "status", "--config", "client.toml"], "ectable status --config client.toml")

        walk.say("## Train and checkpoint\n\nThe trainer's job (on host `trainer`): 200 steps of 4,096 gradients, "
                 "then a checkpoint.")
        ckpt, ref = os.path.join(workdir, "ckpt"), os.path.join(workdir, "rows.npy")
        walk.shell("trainer", [py, "-"], "python - < train.py", stdin=TRAIN.format(ckpt=ckpt, ref=ref))
        walk.shell("trainer", [*ectable, "checkpoint", "list", ckpt], "ectable checkpoint list /checkpoints/items")

        walk.say("## Adding a spare\n\nHost d joins with a spare node: the operator lists it in the cluster file "
                 "(and hands d the file with `keys/node-6.toml`'s section), d starts it; it holds no position, "
                 "announces itself in etcd and waits for one.")
        def add_spare(n: int) -> str:
            """List spare d-n in the cluster file, give it node key 6 + n, start it on d; its endpoint."""
            endpoint = f"tcp://{address['d']}:{7000 + n}"
            walk.shell("trainer", [*ectable, "spare", "add", f"d-{n}", endpoint, "--config", "cluster.toml"],
                       f"ectable spare add d-{n} {endpoint} --config cluster.toml")
            own(f"node-d-{n}.toml", f"node-{6 + n}", {k: v for k, v in cluster_config.load(
                os.path.join(workdir, "cluster.toml")).items() if k != "security"})
            walk.service("d", f"spare-{n}", [*ectable, "node", "--config", f"node-d-{n}.toml", "--name", f"d-{n}"])
            walk.say(f"```\nd$ systemctl start ectable-node@d-{n}\n```")
            walk.wait_status(lambda s: s["spares"] == 1, f"spare d-{n} announced")
            return endpoint
        add_spare(0)
        walk.shell("trainer", [*ectable, "status", "--config", "client.toml"], "ectable status --config client.toml")

        walk.say("## Draining a node\n\nNode c-1 is to go (say, for work on its disk), with no failure: the operator "
                 "drains it. Once every position is up and a spare is free, the decider freezes c-1 (writes and deltas to "
                 "it wait), closes its window, waits until its deltas are acknowledged and hands everything c-1 holds to "
                 "the spare, which continues it under the same identity; one map change gives position 5 the spare's "
                 "address, and c-1 is told to stop. Nothing is rebuilt and nothing replayed: the cluster survives two "
                 "failures throughout. The command waits until c-1 has stopped.")
        walk.shell("trainer", [*ectable, "node", "drain", "c-1", "--config", "cluster.toml"],
                   "ectable node drain c-1 --config cluster.toml")
        walk.say("```\nc$ systemctl disable ectable-node@c-1    # it exited when told: keep it from starting again\n```")
        walk.shell("trainer", [*ectable, "status", "--config", "client.toml"], "ectable status --config client.toml")
        walk.shell("trainer", [py, "-"], "python - < check.py", stdin=CHECK.format(config="client.toml", ref=ref))

        walk.say("## Adding a node\n\nThe cluster is to grow by a node: host d starts another spare, d-1 (listed and "
                 "started as d-0 was, with `keys/node-7.toml`'s section), and the operator adds it. Placement rotates "
                 "stripes over every position, so nearly every row moves: the decider copies every node's rows while "
                 "they serve, sends each node its rows of the new layout ahead, then freezes every node, takes the "
                 "rows changed meanwhile, encodes the parity again and gives every node its new rows and parity; one "
                 "map change makes d-1 position 6, every position under a new identity. The command waits, and then "
                 "lists d-1 as a node in the cluster file.")
        add_spare(1)
        walk.shell("trainer", [*ectable, "node", "add", "d-1", "--config", "cluster.toml"],
                   "ectable node add d-1 --config cluster.toml")
        walk.shell("trainer", [*ectable, "status", "--config", "client.toml"], "ectable status --config client.toml")
        walk.shell("trainer", [py, "-"], "python - < check.py", stdin=CHECK.format(config="client.toml", ref=ref))
        walk.say("Host d starts a third spare, d-2, for what comes next (with `keys/node-8.toml`'s section):")
        spare = add_spare(2)

        walk.say("## A host fails\n\nHost b goes off the network (its link down: etcd member, decider and nodes 2 and 3 "
                 "with it). Within a few seconds their leases run out; the decider on a (which takes over if b's was "
                 "acting) declares positions 2 and 3 dead and puts the spare in one of them, which rebuilds; the other "
                 "is served through the parity.\n\n```\nb$ ip link set eth0 down    # (here: its port on the bridge)\n```")
        hosts.cut("b")
        walk.wait_status(lambda s: any(n.get("endpoint", "") == spare for n in s["nodes"]), "the spare in a dead position")
        walk.wait_status(lambda s: all(n["role"] == "active" for n in s["nodes"] if n["health"] == "up"),
                         "the spare rebuilt", timeout=300)
        walk.shell("trainer", [*ectable, "status", "--config", "client.toml"], "ectable status --config client.toml")
        walk.shell("trainer", [py, "-"], "python - < check.py", stdin=CHECK.format(config="client.toml", ref=ref))

        walk.say("## Restore from the checkpoint\n\nSay the whole cluster is lost. A new one (another key prefix, "
                 "nodes on a, c and d, xor(4,1) over five nodes this time: a checkpoint restores into any shape) is "
                 "started as above, and the checkpoint restored into it:")
        new = {"cluster": {"nodes": 5, "code": "xor", "k": 4, "r": 1},
               "nodes": {"endpoints": [f"tcp://{address[h]}:{7100 + i}" for h, i in
                                       [("a", 0), ("a", 1), ("c", 0), ("c", 1), ("d", 0)]]},
               "membership": {"endpoints": [etcd[0], etcd[2]], "prefix": "/ectable/restored"},
               "control": {"token": os.urandom(16).hex()}}
        for n in range(5):
            own(f"new-node-{n}.toml", f"node-{n}", new)
        own("new-decider.toml", "decider-0", new)
        own("new-client.toml", "client-1", {"membership": new["membership"]})
        walk.service("a", "new-decider", [*ectable, "decider", "--config", "new-decider.toml"])
        for p, h in enumerate("aaccd"):
            walk.service(h, f"new-node-{p}", [*ectable, "node", "--config", f"new-node-{p}.toml", "--id", str(p)])
        walk.wait_status(lambda s: all(n["role"] == "active" for n in s["nodes"]), "the new cluster up",
                         config="new-client.toml")
        walk.shell("trainer", [*ectable, "restore", ckpt, "--config", "new-client.toml"],
                   "ectable restore /checkpoints/items --config new-client.toml")
        walk.shell("trainer", [py, "-"], "python - < check.py    # against new-client.toml",
                   stdin=CHECK.format(config="new-client.toml", ref=ref))


if __name__ == "__main__":
    main()
