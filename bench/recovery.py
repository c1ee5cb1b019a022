"""Recovery: rebuild time against shard size, training through a rebuild, and against a checkpoint reload.

Three parts (and a fourth on request), all in one run, nodes as processes on loopback:

1. `size`: SIGKILL a node of an idle xor(4,1) cluster with one spare; time until every
   stripe is protected again, for growing tables. Beside it, the two limits a rebuild
   cannot beat on this machine: decoding the same bytes in process, and moving them over
   loopback ZeroMQ (a rebuilt row reads k slots and writes one: "MB/s moved"); and the CPU
   every process of the cluster spent from the kill to full protection, per MB rebuilt.
2. `during`: a training loop over a workload (`--workload`, default criteo-like: get_many,
   model step, apply_gradient_many, step) with a node SIGKILLed part way; iteration times
   before, during and after the rebuild (a time series, and the during/before ratio), and
   the CPU per iteration of the trainer, the nodes, etcd and the deciders in each phase.
3. `checkpoint`: the same failure handled the way training is protected today: a full
   checkpoint of every table every N iterations, so a failure costs reading the last one
   back and replaying the iterations since (N/2 on average, at the measured cost of an
   iteration). Its reload reads from disk (the file is dropped from the page cache first)
   into numpy, a lower bound on loading it into any store. Besides the given intervals it
   uses the one at which writing checkpoints costs training as much as parity does
   (`--overhead`, from bench.train_loop). Compared with ectable's time to full protection
   and with the training time ectable's failure cost (part 2).
4. `degraded` (not run unless asked): training iterations with every node up, then with a node dead and
   no spare, so that every read decodes that node's rows from the survivors and every write to them goes
   through their parity.

    python -m bench.recovery [--parts size during checkpoint degraded] [--workload criteo] [--scale 1.0]
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import tempfile
import time

import numpy as np

import ectable
from ectable.cluster.maps import StoredMap
from ectable.codes import get_code
from ectable.testing import read_records

from .common import add_node_nice, family_cpu, nice, report
from .train_loop import create_tables, full_checkpoint, touch_all
from .workloads import DIM, WORKLOADS, Workload

K = 4
NODE_NICE: int | None = None  # `--node-nice`: the node processes' `node_nice` (None: LocalCluster's default)


def make_cluster(work: Workload, spares: int = 1, share: float = 1.0):
    """An xor(4,1) cluster of node processes with `spares` spares, holding the workload's tables."""
    cluster = ectable.LocalCluster(nodes=K + 1, code="xor", k=K, r=1, spares=spares, rebuild_share=share,
                                   **nice(NODE_NICE))
    client = cluster.connect()
    create_tables(client, work, init="uniform")
    return cluster, client


def rebuild_time(client, cluster, victim: int = 2) -> tuple[float, int, dict]:
    """Seconds from SIGKILL to full protection, the rows (data + parity) rebuilt, and the replacement's own account
    of its rebuild (`last_rebuild` in its status: `seconds` from taking the position, `pulling` from its
    rebuilder's first round, once every writer had replayed into it)."""
    start = time.perf_counter()
    cluster.kill(victim)
    client.status()  # fails it over: the spare takes its place and starts pulling
    client.wait_recovered(timeout=600)
    elapsed = time.perf_counter() - start
    st = client.status()["nodes"][victim]
    return elapsed, st["data_rows"] + st["parity_rows"], st["last_rebuild"]


def decode_limit(rows: int) -> float:
    """Seconds to decode `rows` records of 65 floats from 4 survivors, in process (XOR, one core)."""
    code = get_code("xor", 4, 1)
    rng = np.random.default_rng(0)
    blocks = {t: rng.integers(0, 256, (rows, (DIM + 1) * 4), dtype=np.uint8) for t in (0, 1, 3, 4)}
    start = time.perf_counter()
    code.decode(blocks, [2])
    return time.perf_counter() - start


def network_limit(client, rows: int) -> float:
    """Seconds to read `rows` records from one node over loopback ZeroMQ, in 32K-row requests."""
    layout = client._table("t")[1]
    cand = np.arange(min(layout.num_rows, 1 << 18))
    ids = cand[layout.data_node(cand) == 0][: 1 << 15]
    start, done = time.perf_counter(), 0
    while done < rows:
        client._call(0, {"op": "get", "table": "t", "records": True}, [ids])
        done += ids.size
    return time.perf_counter() - start


def part_size(sizes, out):
    rows_out = []
    for rows in sizes:
        work = Workload("one table", {"t": rows}, [])
        cluster, client = make_cluster(work)
        with cluster:
            touch_all(client, work)
            at_kill = family_cpu()
            secs, rebuilt, spare = rebuild_time(client, cluster)
            cpu = sum(seconds - at_kill[pid][1] for pid, (_, seconds) in family_cpu().items() if pid in at_kill)
            net = network_limit(client, rebuilt)
        dec = decode_limit(rebuilt)
        mb = rebuilt * (DIM + 1) * 4 / 1e6
        pulling = spare["pulling"]
        rows_out.append([rows, rebuilt, round(mb, 1), round(secs, 2), round(spare["seconds"], 2), round(pulling, 2),
                         round(mb / pulling, 1), round(mb * (K + 1) / pulling), round(mb / net), round(mb / dec),
                         round(cpu / mb * 1000, 1), round(cpu / secs, 2)])
        print(f"  {rows} rows: rebuilt {rebuilt} rows ({mb:.0f} MB) in {secs:.2f} s from the kill; the spare "
              f"took {spare['seconds']:.2f} s, {pulling:.2f} s of it pulling rows", flush=True)
    out["size"] = rows_out
    # "MB/s moved": a rebuilt row reads k survivors' slots and writes one
    report("recovery_size", ["table rows", "rows rebuilt", "MB rebuilt", "kill to protected s", "spare s",
                             "pulling s", "MB/s pulling", "MB/s moved", "loopback MB/s", "decode MB/s",
                             "CPU ms per MB", "cores busy"], rows_out)


def train(client, work: Workload, compute, kill_at=None, cluster=None, profile=None, lookahead: int = 0,
          marks: list | None = None):
    """Iteration times; with `kill_at`, SIGKILL node 2 before that iteration. Also the rebuild window. With
    `profile` (two cProfile.Profile), the trainer is profiled over the iterations before the kill (from the
    sixth) and over those that start with node 2 rebuilding. With `lookahead` L > 0, the loop goes through
    `ectable.Lookahead` (L batches read ahead, a cache of a million rows; its thread owns the client). `marks`
    (with `kill_at`): gets (iteration, seconds, `family_cpu()`) as the sixth iteration, the kill's and the next
    begin, after the iteration that ended the rebuild, and at the end."""
    times, rebuilding = [], []
    at = {5, kill_at, kill_at + 1} if marks is not None and kill_at is not None else set()  # iterations to mark

    def mark(n):
        if at:
            marks.append((n, time.perf_counter(), family_cpu()))
    la = ectable.Lookahead(client, work.batches, lookahead=lookahead, cache_rows=1 << 20) if lookahead else None
    api, feed = (la, la) if la is not None else (client, work.batches)
    for n, batch in enumerate(feed):
        if n in at:
            mark(n)
        if n == kill_at:
            cluster.kill(2)
        profiled = None
        before = kill_at is None or n < kill_at
        if profile is not None and ((before and n >= 5) or (rebuilding and rebuilding[-1])):
            profiled = profile[0] if before else profile[1]
            profiled.enable()
        start = time.perf_counter()
        api.get_many(batch)
        time.sleep(compute)
        api.apply_gradient_many(work.gradients(batch))
        api.step()
        times.append(time.perf_counter() - start)
        if profiled:
            profiled.disable()
        # as the client's map says (no request: one to the spare every iteration would slow training down)
        rebuilding.append(kill_at is not None and n >= kill_at and _rebuilding(client.cluster, 2, la is not None))
        if at and n > kill_at and rebuilding[-2] and not rebuilding[-1]:
            mark(n + 1)
    mark(len(times))
    if la is not None:
        la.close()
    return np.array(times), np.array(rebuilding)


def _rebuilding(cluster, p: int, looked_only: bool) -> bool:
    """Whether the map shows position p rebuilding; `looked_only`: as last read, with no side effect (another
    thread, the lookahead's, uses the cluster: only it may fail nodes over)."""
    return (StoredMap.state(cluster, p) if looked_only else cluster.state(p)) == "rebuilding"


def phases(times: np.ndarray, rebuilding: np.ndarray, kill_at: int) -> tuple:
    """Iteration times (before the failure, skipping 5 of warm-up; the failover iteration; while rebuilding; after),
    each iteration in one phase only."""
    later = slice(kill_at + 1, None)
    return times[5:kill_at], times[kill_at], times[later][rebuilding[later]], times[later][~rebuilding[later]]


def part_during(work: Workload, compute, shares, out, profile: bool = False, lookahead: int = 0):
    """Training through a failure, once per rebuild share; returns the training time each failure cost. With
    `profile`, prints the trainer's cProfile over the rebuild (per iteration, the calls of ectable's client);
    `lookahead`: as `train`'s."""
    rows_out, series, lost, cpu, survivors = [], {}, {}, {}, 0
    for share in shares:
        cluster, client = make_cluster(work, share=share)
        prof = (cProfile.Profile(), cProfile.Profile()) if profile else None
        marks: list = []
        with cluster:
            touch_all(client, work)
            kill_at, victim = len(work.batches) // 6, cluster.node_pids()[2]
            times, rebuilding = train(client, work, compute, kill_at, cluster, prof, lookahead, marks)
            spare, survivors = cluster.node_pids()[2], len(cluster.node_pids()) - 1
        before, first, during, after = phases(times, rebuilding, kill_at)
        cpu[share] = cpu_phases(marks, victim, spare)
        lost[share] = first + during.sum() - (during.size + 1) * before.mean()  # training time the failure cost
        rate = 1 / before.mean()
        rows_out.append([share, round(rate, 1), round(before.mean() / first, 3),
                         round(before.mean() / during.mean(), 3) if during.size else "-",
                         round(before.mean() / after.mean(), 3) if after.size else "-",
                         round(during.sum(), 2), round(lost[share], 2)])
        series[share] = {"times": times.tolist(), "rebuilding": rebuilding.tolist(), "kill_at": kill_at}
        print(f"  share {share}: the rebuild spanned {during.size} iterations ({during.sum():.2f} s); "
              f"the failure cost training {lost[share]:.2f} s", flush=True)
        if prof is not None:
            _print_profile(prof, before.size, int(rebuilding[:-1].sum()))  # after an iteration that ended rebuilding
    out["during"] = series
    report("recovery_during_cpu", ["rebuild share", "phase", "iterations", "ms/it", "trainer CPU ms/it",
                                   "a survivor's CPU ms/it", "node 2's CPU ms/it", "etcd + deciders ms/it",
                                   "all CPU ms/it", "cores busy"],
           [[share, *row] for share, rows in cpu.items() for row in rows], {"survivors": survivors})
    report("recovery_during", ["rebuild share", "it/s before", "failover it.", "during rebuild", "after",
                               "rebuild s", "training lost s"], rows_out,
           {"series": series, "table_rows": sum(work.sizes.values()), "workload": work.describe(),
            "compute_ms": compute * 1000})
    return lost


def cpu_phases(marks: list, victim: int, spare: int) -> list:
    """Per phase of a `train` with `marks` (before the kill, rebuilding, after): [phase, iterations, wall ms, then
    CPU ms per iteration of the trainer, of a surviving node (their mean), of the node at the failed position (the
    `victim` before the kill, then its `spare`), of etcd and the deciders, of all; cores busy on average]."""
    start, kill, failed_over, *rest = marks
    spans = [("before", start, kill, victim), ("rebuilding", failed_over, rest[0], spare)]
    if len(rest) > 1 and rest[1][0] > rest[0][0]:  # the rebuild ended before the last iteration
        spans.append(("after", rest[0], rest[1], spare))
    rows = []
    for name, (na, ta, ca), (nb, tb, cb), node in spans:
        spent = {pid: (role, cpu - ca[pid][1]) for pid, (role, cpu) in cb.items() if pid in ca}
        survivors = [cpu for pid, (role, cpu) in spent.items() if role == "node" and pid not in (victim, spare)]
        of = lambda *roles: sum(cpu for role, cpu in spent.values() if role in roles)  # noqa: E731
        per = lambda seconds: round(seconds / max(nb - na, 1) * 1000, 2)  # noqa: E731
        total = sum(cpu for _, cpu in spent.values())
        rows.append([name, nb - na, per(tb - ta), per(of("trainer")), per(sum(survivors) / max(len(survivors), 1)),
                     per(spent.get(node, ("", 0.0))[1]), per(of("etcd", "decider")), per(total),
                     round(total / (tb - ta), 2)])
    return rows


def part_degraded(work: Workload, out, batches: int = 30):
    """Training iterations (get_many, apply_gradient_many, step; no model step) with every node up, then with
    node 2 dead and no spare: every read decodes node 2's rows from the survivors and every write to them goes
    through their parity, and nothing is rebuilt. Median ms per read and per write (with its step), and per
    decode of node 2's share of a batch alone (`Repair.read_many`: the client's decode work and the
    survivors' reads)."""
    cluster, client = make_cluster(work, spares=0)
    feed = work.batches[:batches]
    with cluster:
        touch_all(client, work)
        healthy = _iteration_ms(client, work, feed)
        cluster.kill(2)
        client.status()  # fails it over: no spare, so the position stays dead
        degraded = _iteration_ms(client, work, feed)
        shares = [{t: u[client._table(t)[1].data_node(u) == 2] for t, u in ((t, np.unique(i)) for t, i in b.items())}
                  for b in feed]
        shares = [{t: u for t, u in share.items() if u.size} for share in shares]
        decode = float(np.median([_ms(client.repair.read_many, share) for share in shares]))
    rows = [["all up", *np.round(healthy, 2), "-"], ["node 2 dead", *np.round(degraded, 2), round(decode, 2)],
            ["ratio", *np.round(degraded / healthy, 2), "-"]]
    out["degraded"] = rows
    report("recovery_degraded", ["nodes", "get_many ms", "apply_gradient_many + step ms", "decode of node 2's rows ms"],
           rows, {"workload": work.describe(), "rows_decoded": sum(u.size for s in shares for u in s.values()) / len(shares)})


def _iteration_ms(client, work: Workload, feed) -> np.ndarray:
    """Median ms of (get_many, apply_gradient_many + step) over the batches `feed`, after one untimed iteration."""
    def write(batch):
        client.apply_gradient_many(work.gradients(batch))
        client.step()
    spent = []
    for n, batch in enumerate([feed[0], *feed]):
        spent.append([_ms(client.get_many, batch), _ms(write, batch)])
    return np.median(np.array(spent[1:]), axis=0)


def _ms(call, x) -> float:
    start = time.perf_counter()
    call(x)
    return (time.perf_counter() - start) * 1000


def _print_profile(profiles: tuple, before: int, during: int) -> None:
    """The client's calls over the iterations profiled before the kill and while rebuilding: cumulative ms and
    calls per iteration, largest while rebuilding first."""
    per = []
    for prof, iterations in zip(profiles, (before, during)):
        per.append({f"{os.path.basename(path)}:{line}({name})": (cum / max(iterations, 1) * 1000, calls / max(iterations, 1))
                    for (path, line, name), (_, calls, _, cum, _) in pstats.Stats(prof).stats.items()
                    if f"{os.sep}ectable{os.sep}client{os.sep}" in path})
    print(f"  trainer, ms per iteration (cumulative) over {before} iterations before the kill and {during} while "
          f"rebuilding:\n    {'before':>8} {'calls':>6} {'during':>8} {'calls':>6}")
    for where in sorted(per[1], key=lambda w: per[1][w][0], reverse=True)[:30]:
        (ms0, calls0), (ms1, calls1) = per[0].get(where, (0.0, 0.0)), per[1][where]
        print(f"    {ms0:8.2f} {calls0:6.1f} {ms1:8.2f} {calls1:6.1f}  {where}")


def part_checkpoint(work: Workload, intervals, compute, overhead, lost_training, out):
    """Full checkpoints every N iterations against ectable: recovery time, and training time lost."""
    rows = sum(work.sizes.values())
    cluster, client = make_cluster(work, spares=1)
    with cluster, tempfile.TemporaryDirectory() as tmp:
        touch_all(client, work)
        path = os.path.join(tmp, "checkpoint.npy")
        start = time.perf_counter()  # the checkpoint: every record of every row, read out and written to disk
        full_checkpoint({t: read_all(client, t, n) for t, n in work.sizes.items()}, path)
        write_secs = time.perf_counter() - start
        _drop_cache(path)
        start = time.perf_counter()  # recovery: read it back...
        with open(path, "rb") as f:
            loaded = [np.load(f) for _ in work.sizes]
        load_secs = time.perf_counter() - start
        del loaded
        iteration = train(client, work, compute)[0][5:].mean()  # ...and replay, at this cost per iteration
        ec_secs, rebuilt, _ = rebuild_time(client, cluster)
    if overhead:  # the interval at which checkpoints cost training what parity does
        intervals = [*intervals, int(round(write_secs / (overhead * iteration)))]
    rows_out = []
    for interval in intervals:
        replay = interval / 2 * iteration  # a failure loses half an interval on average
        total = load_secs + replay
        rows_out.append([interval, f"{write_secs / (interval * iteration):.1%}", round(load_secs, 2), round(replay, 2),
                         round(total, 2), round(total / ec_secs, 1),
                         round(total / lost_training, 1) if lost_training else "-"])
    out["checkpoint"] = rows_out
    print(f"  {rows} rows: a full checkpoint takes {write_secs:.2f} s to write, {load_secs:.2f} s to read back; "
          f"an iteration takes {iteration * 1000:.0f} ms; ectable rebuilt {rebuilt} rows in {ec_secs:.2f} s"
          + (f" and training lost {lost_training:.2f} s to the failure" if lost_training else ""))
    report("recovery_vs_checkpoint", ["checkpoint every", "its overhead", "reload s", "replay s", "total s",
                                      "vs ectable rebuild", "vs ectable training lost"], rows_out,
           {"table_rows": rows, "workload": work.describe(), "checkpoint_write_s": write_secs, "checkpoint_read_s": load_secs, "iteration_s": iteration,
            "ectable_rebuild_s": ec_secs, "ectable_training_lost_s": lost_training, "rows_rebuilt": rebuilt,
            "parity_overhead": overhead, "compute_ms": compute * 1000})


def read_all(client, table, rows):
    return np.concatenate([read_records(client, table, np.arange(lo, min(rows, lo + (1 << 17))))
                           for lo in range(0, rows, 1 << 17)])


def _drop_cache(path: str) -> None:
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 500_000, 1_000_000, 2_000_000])
    parser.add_argument("--workload", default="criteo", choices=sorted(WORKLOADS), help="for the training parts")
    parser.add_argument("--scale", type=float, default=1.0, help="table sizes (criteo, zipf)")
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--shares", type=float, nargs="+", default=[0.5, 0.2, 0.1], help="rebuild_share values to train through")
    parser.add_argument("--intervals", type=int, nargs="+", default=[100, 1000],
                        help="iterations between full checkpoints")
    parser.add_argument("--overhead", type=float, default=0.05,
                        help="parity's training overhead (bench.train_loop): adds the checkpoint interval that costs as much")
    parser.add_argument("--parts", nargs="+", default=["size", "during", "checkpoint"])
    parser.add_argument("--profile", action="store_true", help="during: cProfile the trainer over each rebuild")
    parser.add_argument("--lookahead", type=int, default=0, help="during: train through ectable.Lookahead, L batches ahead")
    add_node_nice(parser)
    args = parser.parse_args()
    global NODE_NICE
    NODE_NICE = args.node_nice
    out: dict = {}
    compute = args.compute_ms / 1000
    if "size" in args.parts:
        part_size(args.sizes, out)
    work = WORKLOADS[args.workload](args.iters, args.scale)
    print(work.describe())
    if "degraded" in args.parts:
        part_degraded(work, out)
    lost = part_during(work, compute, args.shares, out, args.profile, args.lookahead) if "during" in args.parts else {}
    if "checkpoint" in args.parts:
        part_checkpoint(dataclasses.replace(work, batches=work.batches[:30]), args.intervals, compute, args.overhead, min(lost.values(), default=None), out)


if __name__ == "__main__":
    main()
