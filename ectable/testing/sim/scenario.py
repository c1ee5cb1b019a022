"""One seeded run: a cluster of simulated node processes, two deciders and a training client, under
faults, checked against a dict model.

The seed decides the cluster's shape (code, k, r, nodes, spares, window and rebuild tuning), the
network's faults (loss, duplicates, delays that reorder), the client's requests, and the chaos:
SIGKILLs of nodes at any message (never more than r positions unprotected at once), kills of
deciders (a new one starts later), partitions of a node from everything, late spares, (one seed in
three) drains of nodes by an operator and (another one in three) nodes added by one. Two seeds in seven
run the client as a `LocalCluster` does, as the parent of the node processes: it sees a node exit at once
(`SimCluster.sees_exits`).
Invariants (SPEC 4.1 and 4.2): every read equals the model; after every `flush()` the parity is
exact (against zfec for rs); the client never fails while at most r positions are unprotected;
no node meets an internal error; at the end, once healed and recovered, every record (weights and
optimizer state) equals the model, bit for bit, and the parity is exact.
"""
from __future__ import annotations

import random
import traceback
from dataclasses import dataclass, field

import numpy as np

from ... import clock
from ...client import Client
from ...cluster.map import Map
from ...cluster.store import ClusterStore
from ...config import ClusterConfig
from ...membership.memory import MemoryMembership
from ..checks import check_parity, read_records
from ..reference import ReferenceTable
from .cluster import SimCluster
from .hosts import SimDecider, SimNodeHost
from .network import Faults, Network
from .world import Killed, Stuck, World

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
FLUSH_TIMEOUT = 300.0  # simulated seconds: a lost request costs a whole request deadline (30 s)


@dataclass
class Outcome:
    seed: int
    code: str
    ok: bool
    message: str = ""
    shape: str = ""
    sim_seconds: float = 0.0
    events: int = 0
    digest: str = ""
    counts: dict = field(default_factory=dict)

    @property
    def replay(self) -> str:
        """The command that runs this seed again, exactly."""
        return f"python -m ectable.testing.sim --code {self.code} --seed {self.seed}"


class Chaos:
    """The seed's faults, injected while `enabled`."""

    def __init__(self, sim: "Simulation", rate: float, budget: int):
        self.sim, self.world, self.rate = sim, sim.world, rate
        self.budget = budget  # faults in all (so that a run that waits long does not collect hundreds)
        self.enabled = True
        self.counts = {"node kills": 0, "decider kills": 0, "partitions": 0, "late spares": 0, "drains": 0,
                       "adds": 0}
        if rate:
            self.world.at(self.world.rng.expovariate(rate), self.strike, "chaos")
        # one seed in three also drains nodes (from a stream of its own: the other seeds run as before drains existed)
        self.drains = random.Random(self.world.seed * 11 + 3) if self.world.seed % 3 == 1 else None
        if self.drains is not None:
            self.world.at(self.drains.uniform(0.5, 5.0), self.drain, "chaos")
        # one seed in three adds nodes (`ectable node add`), from a stream of its own
        self.adds = random.Random(self.world.seed * 13 + 5) if self.world.seed % 3 == 2 else None
        if self.adds is not None:
            self.world.at(self.adds.uniform(0.5, 5.0), self.add, "chaos")

    def unprotected(self) -> set[int]:
        """Positions whose data is not fully protected now: not up in the map, their node dead or cut off, or
        asked to leave (a drain takes the position's protection until a spare rebuilt it)."""
        sim, m = self.sim, self.sim.store.read_map()
        drains = sim.store.drains()
        out = set()
        for p in range(m.nodes):
            host = sim.hosts.get(m.endpoints[p])
            if (m.states[p] != "up" or host is None or not host.alive or m.endpoints[p] in drains
                    or sim.network.cut.get(host.endpoint, 0.0) > self.world.now):
                out.add(p)
        return out

    def may_lose(self, host: SimNodeHost) -> bool:
        if not host.alive:
            return False
        if host.node is None:
            return True  # a spare
        return len(self.unprotected() | {host.node.position}) <= self.sim.config.r

    def at_message(self, endpoint: str) -> None:
        """A message reaches (or leaves) `endpoint`: maybe its node dies right there."""
        host = self.sim.hosts[endpoint]
        if (self.enabled and self.budget > 0 and self.world.rng.random() < self.sim.faults.kill_at_message
                and self.may_lose(host)):
            self.kill(host)

    def kill(self, host: SimNodeHost) -> None:
        self.world.note(f"kill {host.endpoint}")
        host.kill()
        self.counts["node kills"] += 1
        self.budget -= 1

    def drain(self) -> None:
        """An operator drains a node holding a position (and, half the time, adds a spare for it), only while
        every position is protected."""
        if not self.enabled or self.budget <= 0:
            return
        sim = self.sim
        if not self.unprotected():
            m = sim.store.read_map()
            endpoint = m.endpoints[self.drains.randrange(m.nodes)]
            self.world.note(f"drain {endpoint}")
            sim.store.request_drain(endpoint)
            self.counts["drains"] += 1
            self.budget -= 1
            if self.drains.random() < 0.5:
                sim.add_spare()
                self.counts["late spares"] += 1
        self.world.at(self.drains.uniform(1.0, 6.0), self.drain, "chaos")

    def add(self) -> None:
        """An operator adds a node (a spare started for it, then asked to take one more position), at most twice,
        only while every position is protected: the cluster is laid out again while the client trains."""
        if not self.enabled or self.budget <= 0 or self.counts["adds"] >= 2:
            return
        if not self.unprotected():
            host = self.sim.add_spare()
            self.world.note(f"add {host.endpoint}")
            self.sim.store.request_grow(host.endpoint)
            self.counts["adds"] += 1
            self.budget -= 1
        self.world.at(self.adds.uniform(2.0, 8.0), self.add, "chaos")

    def strike(self) -> None:
        if not self.enabled or self.budget <= 0:
            return
        self.budget -= 1
        rng, sim = self.world.rng, self.sim
        kind = rng.choice(["node", "node", "node", "decider", "partition", "spare"])
        hosts = [h for h in sim.hosts.values() if h.alive]
        if kind == "node" and hosts:
            host = rng.choice(hosts)
            if self.may_lose(host):
                self.kill(host)
        elif kind == "decider":
            alive = [d for d in sim.deciders if d.name not in self.world.killed]
            if alive:
                victim = rng.choice(alive)
                self.world.note(f"kill {victim.name}")
                victim.kill()
                self.counts["decider kills"] += 1
                self.world.at(rng.uniform(0.2, 4.0), sim.start_decider, "chaos")
        elif kind == "partition" and hosts:
            host = rng.choice(hosts)
            if self.may_lose(host):
                self.world.note(f"cut {host.endpoint}")
                sim.network.cut[host.endpoint] = self.world.now + rng.uniform(0.2, 6.0)
                self.counts["partitions"] += 1
        elif kind == "spare" and len(sim.hosts) < sim.config.nodes + 6:
            sim.add_spare()
            self.counts["late spares"] += 1
        self.world.at(rng.expovariate(self.rate), self.strike, "chaos")


class Simulation:
    """The cluster of one seed and its training client."""

    def __init__(self, seed: int, code: str):
        self.world = world = World(seed)
        rng = world.rng
        k = rng.choice([3, 4])
        r = 1 if code == "xor" else 2
        self.config = ClusterConfig(k + r + rng.choice([0, 0, 1]), code, k, r,
                                    window_rows=rng.choice([1 << 20, 16, 64]),
                                    window_seconds=rng.choice([5.0, 0.5]),
                                    rebuild_batch=rng.choice([8, 64, 1 << 15]),
                                    rebuild_share=rng.choice([0.5, 1.0]),
                                    rebuild_streams=1 if seed % 3 == 0 else 2)  # (not drawn: as below)
        self.spares = rng.choice([0, 1, 2, 2])
        self.sees_exits = seed % 7 in (3, 4)  # (not drawn from the rng: the other seeds run as they did)
        self.faults = Faults(drop=rng.choice([0.0, 0.0, 0.002, 0.01]), duplicate=rng.choice([0.0, 0.02, 0.1]),
                             spike=rng.choice([0.0, 0.01, 0.05]), kill_at_message=rng.choice([0.0, 0.002, 0.01]))
        self.network = Network(world, self.faults)
        self.store = ClusterStore(MemoryMembership(clock=world.monotonic), "/ectable/sim")
        self.token = world.token_hex(8)
        self.hosts: dict[str, SimNodeHost] = {}
        self.deciders: list[SimDecider] = []
        self.chaos: Chaos | None = None

    def shape(self) -> str:
        c = self.config
        return (f"{c.code}({c.k},{c.r}) on {c.nodes} nodes + {self.spares} spares, window_rows={c.window_rows}, "
                f"window_seconds={c.window_seconds}, rebuild_batch={c.rebuild_batch}, rebuild_streams={c.rebuild_streams}; "
                f"{self.faults}"
                + ("; the client sees node exits" if self.sees_exits else ""))

    def cluster_for(self, owner: str) -> SimCluster:
        return SimCluster(self.world, self.network, self.store, owner, self.sees_exits and owner == "client")

    def add_spare(self) -> SimNodeHost:
        endpoint = f"sim://node-{len(self.hosts)}"
        self.world.note(f"start {endpoint}")
        host = self.hosts[endpoint] = SimNodeHost(self.world, self.network, self.store, endpoint, self.token,
                                                  self.cluster_for)
        return host

    def start_decider(self) -> None:
        self.deciders.append(SimDecider(self.world, self.network, self.store, f"decider/{len(self.deciders)}",
                                        self.token))

    def start(self) -> SimCluster:
        for _ in range(self.config.nodes + self.spares):
            self.add_spare()
        endpoints = list(self.hosts)[: self.config.nodes]
        self.store.swap_map(None, Map.initial(self.config.get_config(), endpoints))
        for _ in range(2):
            self.start_decider()
        cluster = self.cluster_for("client")
        deadline = self.world.now + 30.0
        while None in cluster._map.sources:
            if self.world.now > deadline:
                raise AssertionError("nodes did not take their positions")
            self.world.sleep(0.05)
            cluster.refresh()
        return cluster

    def train(self, ops: int) -> None:
        """Start the cluster, train `ops` requests under the seed's faults, heal, recover, check everything."""
        world = self.world
        client = Client(self.start())
        training = Training(self, client)
        training.create_tables()
        self.chaos = Chaos(self, rate=world.rng.choice([0.0, 0.2, 0.5, 1.0]), budget=world.rng.randint(2, 12))
        self.network.arrival = self.chaos.at_message
        for _ in range(ops):
            training.op()
        self.chaos.enabled = False
        self.heal()
        client.wait_recovered(timeout=600.0)
        client.flush(timeout=FLUSH_TIMEOUT)
        training.check_everything()

    def heal(self) -> None:
        """End every fault: partitions end, a decider runs, every dead position can get a spare, drains not
        begun yet are withdrawn."""
        self.network.cut.clear()
        m = self.store.read_map()
        for endpoint in self.store.drains():
            if m.position_of(endpoint) is not None:
                self.store.cancel_drain(endpoint, m)
        self.faults.drop = self.faults.kill_at_message = 0.0
        if all(d.name in self.world.killed for d in self.deciders):
            self.start_decider()
        lost = sum(not h.alive for h in self.hosts.values() if h.node is not None)
        for _ in range(len(self.store.read_map().dead()) + lost):
            self.add_spare()


class Training:
    """The client's seeded requests, each checked against the dict model."""

    def __init__(self, sim: Simulation, client: Client):
        self.sim, self.client, self.rng = sim, client, np.random.default_rng(sim.world.seed)
        self.models: dict[str, ReferenceTable] = {}
        self.flushes = 0
        # one seed in six also drops tables and creates them again (from a stream of its own: the other
        # seeds run as they did before drops existed)
        self.drops = random.Random(sim.world.seed * 7 + 1) if sim.world.seed % 6 == 5 else None
        self.created = 0

    def create_tables(self) -> None:
        rng = self.sim.world.rng
        for t in range(rng.choice([1, 2])):
            self.create(f"t{t}", rng, seed=t)

    def create(self, name: str, rng, seed: int) -> None:
        self.client.create_table(name, num_rows=rng.randint(20, 90), dim=rng.choice([1, 2, 4]),
                                 optimizer=rng.choice(OPTIMIZERS), lr=0.1, init="uniform", seed=seed)
        self.models[name] = ReferenceTable(self.client._table(name)[0])

    def recreate(self) -> None:
        """Drop a table and create another (a dropped name is not used again)."""
        name = self.drops.choice(sorted(self.models))
        self.sim.world.note(f"drop_table {name}")
        self.client.drop_table(name)
        del self.models[name]
        self.created += 1
        self.create(f"{name[:2]}_{self.created}", self.drops, seed=self.drops.randint(0, 99))

    def ids(self, table: str, n: int, unique: bool = False) -> np.ndarray:
        rows = self.models[table].spec.num_rows
        if unique:
            return self.rng.choice(rows, size=min(n, rows), replace=False).astype(np.int64)
        return self.rng.integers(0, rows, size=n, dtype=np.int64)

    def values(self, table: str, n: int) -> np.ndarray:
        return self.rng.standard_normal((n, self.models[table].spec.dim)).astype(np.float32)

    def op(self) -> None:
        world, client = self.sim.world, self.client
        if self.drops is not None and self.drops.random() < 0.05:
            return self.recreate()
        kind = world.rng.choices(["get", "put", "grad", "grad_many", "step", "flush", "idle"],
                                 weights=[4, 2, 5, 2, 3, 1, 1])[0]
        table = world.rng.choice(sorted(self.models))
        model = self.models[table]
        if kind == "get":
            ids = self.ids(table, world.rng.randint(1, 12))
            world.note(f"get {table} {ids.tolist()}")
            self.same(table, ids, client.get(table, ids), model.get(ids))
        elif kind == "put":
            ids = self.ids(table, world.rng.randint(1, 8), unique=True)
            rows = self.values(table, ids.size)
            world.note(f"put {table} {ids.tolist()}")
            client.put(table, ids, rows)
            model.put(ids, rows)
        elif kind == "grad":
            ids = self.ids(table, world.rng.randint(1, 16))
            grads = self.values(table, ids.size) * np.float32(0.1)
            world.note(f"apply_gradient {table} {ids.tolist()}")
            client.apply_gradient(table, ids, grads)
            model.apply_gradient(ids, grads)
        elif kind == "grad_many":
            batch = {}
            for name in self.models:
                ids = self.ids(name, world.rng.randint(1, 10))
                batch[name] = (ids, self.values(name, ids.size) * np.float32(0.1))
            world.note(f"apply_gradient_many {({t: ids.tolist() for t, (ids, _) in batch.items()})}")
            client.apply_gradient_many(batch)
            for name, (ids, grads) in batch.items():
                self.models[name].apply_gradient(ids, grads)
        elif kind == "step":
            world.note("step")
            client.step()
        elif kind == "flush":
            world.note("flush")
            client.flush(timeout=FLUSH_TIMEOUT)
            self.flushes += 1
            check_parity(client.cluster, client)
        else:
            world.note("idle")
            world.sleep(world.rng.uniform(0.0, 2.0))

    def same(self, table: str, ids, got: np.ndarray, want: np.ndarray, what: str = "rows") -> None:
        bad = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)).any(axis=1))
        if bad.size:
            raise AssertionError(f"table {table!r}: {what} of ids {ids[bad][:8].tolist()} differ from the model "
                                 f"(got {got[bad[0]].tolist()}, want {want[bad[0]].tolist()})")

    def check_everything(self) -> None:
        for table, model in self.models.items():
            ids = np.arange(model.spec.num_rows, dtype=np.int64)
            self.same(table, ids, self.client.get(table, ids), model.get(ids))
            want = np.stack([model.record(i) for i in ids])
            self.same(table, ids, read_records(self.client, table, ids), want, "records")
        check_parity(self.client.cluster, self.client)


def run(seed: int, code: str = "xor", ops: int = 60, trace: bool = False) -> Outcome:
    """Run one seed; its outcome (never raises for a failed invariant: the outcome says it). `trace`:
    print what happens, as it happens."""
    sim = Simulation(seed, code)
    world = sim.world
    world.tracing = trace
    outcome = Outcome(seed, code, ok=False, shape=sim.shape())
    try:
        with clock.use(world):
            try:
                with world.acting("client"):
                    sim.train(ops)
            finally:
                world.close()  # ends the fibers' threads while they still read the world's clock
        if world.problems:
            raise AssertionError("; ".join(world.problems[:3]))
        outcome.ok = True
    except (AssertionError, Stuck, Killed, Exception) as exc:
        outcome.message = f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exc(limit=-12))}"
    outcome.sim_seconds, outcome.events, outcome.digest = world.now, world.events, world.digest.hexdigest()[:16]
    outcome.counts = {**sim.network.counts, **(sim.chaos.counts if sim.chaos else {})}
    return outcome
