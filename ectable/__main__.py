"""The `ectable` command: node, node add, node drain, spare add, decider, up, down, status, keygen,
checkpoint list|inspect, restore, export."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from . import config as cluster_config
from .process.status_view import render  # noqa: F401 - the status table, for scripts and tests


class CommandError(Exception):
    """A command that cannot be done: printed as one line, exit status 1."""


def cmd_node(args) -> None:
    from .process.node_server import run
    from .security import checked
    data = cluster_config.load(args.config) if args.config else {}
    try:
        curve = checked(data.get("security"))
    except ValueError as exc:
        sys.exit(f"ectable node: {exc}")
    map_header, bind = None, args.bind
    if args.name is not None:
        if args.id is not None:
            raise CommandError("give --name or --id, not both")
        args.id, named = cluster_config.find_node(data, args.name)
        bind = bind or named
    if args.id is not None:
        if "nodes" not in data:
            sys.exit("ectable node --id needs --config with [cluster] and [nodes]")
        endpoints = data["nodes"]["endpoints"]
        bind = bind or endpoints[args.id]
        map_header = {"op": "map", "position": args.id, "config": data["cluster"], "endpoints": endpoints, "dead": []}
    metrics = args.metrics_port
    if metrics is None and "port" in data.get("metrics", {}):  # one port per node: the file's, plus its position
        metrics = int(data["metrics"]["port"]) + (args.id or 0)
    run(bind or "tcp://127.0.0.1:0", curve, args.parent, map_header, _token(data), data.get("membership"), metrics,
        args.nice)


def cmd_drain(args) -> None:
    from .cluster import plans
    from .cluster.store import open_store
    data = cluster_config.load(args.drain_config or args.config or "cluster.toml")
    if "membership" not in data:
        raise CommandError("node drain needs a cluster file with a [membership] section (etcd endpoints, prefix)")
    _, endpoint = cluster_config.find_node(data, args.target)
    name = f"{args.target} ({endpoint})"
    store = open_store(data["membership"])
    try:
        m = store.read_map()
        if m is None:
            raise CommandError("the store holds no cluster map: is the cluster up?")
        p = m.position_of(endpoint)
        if args.cancel:
            if endpoint not in store.drains():
                raise CommandError(f"no drain of {name} is asked for")
            if p is None or not store.cancel_drain(endpoint, m):
                raise CommandError(f"the drain of {name} has begun (its node is fenced): it goes on")
            print(f"withdrew the drain of {name}")
            return
        if p is None and endpoint not in store.presence():
            raise CommandError(f"{name} holds no position and is not running")
        store.request_drain(endpoint)
        print(f"asked {name} to leave" + (f" position {p}" if p is not None else ""), flush=True)
        deadline, said = time.monotonic() + args.timeout, None
        while True:
            state, now = plans.drain_progress(store.read_map(), store.presence(), store.drains(), endpoint, p)
            if now != said:
                print(now, flush=True)
                said = now
            if state == "done":
                return
            if state == "withdrawn":
                raise CommandError(f"the drain of {name} was withdrawn")
            if time.monotonic() > deadline:
                raise CommandError(f"not drained within {args.timeout:g} s ({now}); the request stands: "
                                   f"withdraw it with --cancel")
            time.sleep(0.5)
    finally:
        store.membership.close()


def cmd_add(args) -> None:
    from .cluster.store import open_store
    path = args.add_config or args.config or "cluster.toml"
    data = cluster_config.load(path)
    if "membership" not in data:
        raise CommandError("node add needs a cluster file with a [membership] section (etcd endpoints, prefix)")
    position, endpoint = cluster_config.find_node(data, args.target)
    name = f"{args.target} ({endpoint})"
    if position is not None:
        raise CommandError(f"{name} is listed as a node already: `ectable spare add` lists a new one as a spare first")
    store = open_store(data["membership"])
    try:
        if args.cancel:
            if endpoint not in store.grows():
                raise CommandError(f"no adding of {name} is asked for")
            store.cancel_grow(endpoint)
            print(f"withdrew the adding of {name}")
            return
        m = store.read_map()
        if m is None:
            raise CommandError("the store holds no cluster map: is the cluster up?")
        listed = len(data["nodes"]["endpoints"]) if "nodes" in data else m.nodes  # positions the file knows
        if endpoint not in m.endpoints:
            if endpoint not in store.presence():
                raise CommandError(f"{name} is not running: start it on its host first (`ectable node --config "
                                   f"{path} --name {args.target}`)")
            store.request_grow(endpoint)
            print(f"asked to add {name} as position {m.nodes}: the cluster is laid out again over {m.nodes + 1} "
                  f"positions while it serves", flush=True)
        deadline, said = time.monotonic() + args.timeout, None
        while endpoint not in m.endpoints:
            if endpoint not in store.grows():
                m = store.read_map()  # added just now (the decider closes the request with the map change)?
                if endpoint in m.endpoints:
                    break
                raise CommandError(f"the adding of {name} was withdrawn (`--cancel`, or attempts that failed: see "
                                   f"the decider's log)")
            now = _grow_waits(m, store.presence(), endpoint)
            if now != said:
                print(now, flush=True)
                said = now
            if time.monotonic() > deadline:
                raise CommandError(f"not added within {args.timeout:g} s ({now}); the request stands: withdraw it "
                                   f"with --cancel")
            time.sleep(0.5)
            m = store.read_map()
        p = m.endpoints.index(endpoint)
        if p < listed:  # a node died meanwhile with no other spare free
            raise CommandError(f"{name} took dead position {p} instead (no other spare was free): add another "
                               f"spare, then ask again")
        cluster_config.write_private(path, cluster_config.with_node(cluster_config.load(path), args.target, m.nodes))
        print(f"{name} holds position {p}, {m.states[p]}: {m.nodes} positions; {path} lists it as a node now")
    finally:
        store.membership.close()


def _grow_waits(m, presence: dict, endpoint: str) -> str:
    """What an asked-for grow waits for now."""
    from .cluster import plans
    why = plans.grow_waits(m, presence) or (None if endpoint in presence else "the node to announce itself")
    return f"waiting: {why}" if why else "the decider lays the cluster out again"


def cmd_spare(args) -> None:
    data = cluster_config.load(args.config)
    cluster_config.write_private(args.config, cluster_config.with_spare(data, args.name, args.endpoint))
    print(f"added spare {args.name} at {args.endpoint} to {args.config}; on its host, start it with "
          f"`ectable node --config {args.config} --name {args.name}` (with a node key of its own in [security]): it "
          f"announces itself and waits for a position")


def cmd_decider(args) -> None:
    from .process.decider_process import run
    from .security import checked
    data = cluster_config.load(args.config)
    if "membership" not in data:
        sys.exit("ectable decider needs --config with a [membership] section (etcd endpoints, prefix)")
    try:
        checked(data.get("security"))
    except ValueError as exc:
        sys.exit(f"ectable decider: {exc}")
    run(data, _token(data), args.parent)


def _token(data: dict) -> str | None:
    """The cluster's control token: from the environment, else from the config file."""
    return os.environ.get("ECTABLE_CONTROL_TOKEN") or data.get("control", {}).get("token")


def cmd_up(args) -> None:
    from .process.local import ProcessCluster
    running = running_pid(args.config)
    if running is not None:
        raise CommandError(f"{args.config} describes a running cluster (ectable up, pid {running}): stop it with "
                           f"`ectable down --config {args.config}`, or name another file with --config")
    cluster = ProcessCluster(nodes=args.nodes, code=args.code, k=args.k, r=args.r, spares=args.spares, keys=args.keys,
                             metrics_port=args.metrics_port)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        cluster_config.write_private(args.config, {**cluster.describe(), "up": {"pid": os.getpid()}})
        print(f"ectable: {args.nodes} nodes ({args.code}, k={args.k}, r={cluster.config.r}) and {args.spares} spares "
              f"are up; wrote {args.config}. Ctrl-C or `ectable down --config {args.config}` stops them.", flush=True)
        while not stop:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
        if running_pid(args.config) == os.getpid():
            os.remove(args.config)  # it describes a cluster that is gone


def running_pid(path: str) -> int | None:
    """The process id of the `ectable up` whose cluster the TOML file at `path` describes, if it runs."""
    try:
        pid = cluster_config.load(path).get("up", {}).get("pid")
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            command = f.read().split(b"\0")
    except (OSError, ValueError, TypeError):
        return None
    started_by_up = any(part.endswith(b"ectable") for part in command) and b"up" in command  # -m ectable, or the script
    return int(pid) if started_by_up else None


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmd_down(args) -> None:
    pid = running_pid(args.config)
    if pid is None:
        raise CommandError(f"{args.config} describes no running cluster (none that `ectable up` started)")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        raise CommandError(f"the cluster of {args.config} (pid {pid}) did not stop within {args.timeout:g} s")
    print(f"ectable: stopped the cluster of {args.config} (pid {pid})")


def cmd_status(args) -> None:
    from .client import connect
    from .process.status_view import Watch
    client = connect(args.config)
    try:
        if not args.watch:
            status = client.status()
            print(json.dumps(status, default=str) if args.json else render(status))
            return
        watch = Watch(client, args.config, args.watch, args.json)
        try:
            for frame in watch.frames():
                if sys.stdout.isatty() and not args.json:
                    frame = "\x1b[H\x1b[J" + frame  # redraw in place
                print(frame, flush=True)
        finally:
            watch.close()
        raise SystemExit(1)  # the cluster was stopped (the last frame said so)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


def cmd_checkpoint(args) -> None:
    from .checkpoint import pieces
    from .checkpoint.history import Chain
    chain = Chain(args.path)
    if args.action == "list":
        finished = {m["number"]: m for m in chain.manifests}
        print(f"{'number':>8}  {'kind':<12}  {'taken (UTC)':<19}  {'rows':>10}  {'bytes':>12}  {'bits':>5}  restore reads")
        for number in chain.numbers:
            m = finished.get(number)
            if m is None:
                print(f"{number:>8}  unfinished (never read; the next checkpoint with keep deletes it)")
                continue
            print(f"{number:>8}  {m['kind']:<12}  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(m['created']))}  "
                  f"{m['rows']:>10,}  {sum(p['bytes'] for p in m['pieces']):>12,}  {m['bits'] or '-':>5}  "
                  f"{m['chain_numbers']}")
        return
    manifest = chain.manifest(args.number) if args.number else (chain.manifests or [None])[-1]
    if manifest is None:
        raise pieces.BadCheckpoint(f"{args.path} holds no finished checkpoint")
    directory = chain.directory(manifest["number"])
    print(f"checkpoint {manifest['number']} of {args.path}: {manifest['kind']} ({manifest['policy']['name']} policy), "
          f"weights {'exact' if manifest['bits'] is None else str(manifest['bits']) + '-bit'}"
          f"{' adaptive' if manifest['adaptive'] else ''}, optimizer state "
          f"{'exact' if manifest.get('state_bits') is None else str(manifest['state_bits']) + '-bit'}; restore reads "
          f"{manifest['chain_numbers']}")
    print(f"taken by a cluster of {manifest['cluster']['nodes']} nodes, {manifest['cluster']['id']} "
          f"(k={manifest['cluster']['k']}, r={manifest['cluster']['r']}); read through the parity: "
          f"{manifest['degraded'] or '-'}; extra: {manifest['extra']['bytes'] if manifest['extra'] else 0} bytes")
    for table in manifest["tables"]:
        own = [p for p in manifest["pieces"] if p["table"] == table["name"]]
        print(f"  {table['name']}: {table['num_rows']:,} rows x {table['dim']}, {table['optimizer']['name']}; "
              f"{sum(p['rows'] for p in own):,} rows in {len(own)} pieces, {sum(p['bytes'] for p in own):,} bytes")
    if args.verify:
        for entry in manifest["pieces"]:
            pieces.read_piece(chain.fs, directory, entry)
        print(f"  verified {len(manifest['pieces'])} pieces: sizes, checksums and contents")


def cmd_restore(args) -> None:
    from . import restore
    restored = restore(args.path, args.config, args.number)
    extra = f", {len(restored.extra)} bytes of extra state" if restored.extra else ""
    print(f"restored checkpoint {restored.number}: tables {restored.tables}, {restored.rows:,} rows{extra}")


def cmd_export(args) -> None:
    from .client import connect
    with connect(args.config) as client:
        rows = client.export(args.table, args.path, state=args.state)
    print(f"wrote {rows:,} rows of {args.table!r} to {args.path}")


def cmd_keygen(args) -> None:
    from .security import keygen
    os.makedirs(args.out, mode=0o700, exist_ok=True)
    if os.listdir(args.out):
        sys.exit(f"ectable keygen: {args.out} is not empty (keys made apart do not fit together); "
                 f"choose a new directory")
    made = keygen(args.nodes, args.deciders, args.clients)
    for name, section in made.items():
        cluster_config.write_private(os.path.join(args.out, f"{name}.toml"), {"security": section})
    print(f"wrote CURVE keys for {args.nodes} nodes, {args.deciders} deciders and {args.clients} clients to "
          f"{args.out}/ (one file per process, keep them secret); `ectable up --keys {args.out}` uses them")


def build_parser() -> argparse.ArgumentParser:
    """The command line: every subcommand and option, each with its help text."""
    parser = argparse.ArgumentParser(prog="ectable", description="erasure-coded embedding-table storage")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("node", help="run one storage node, add one (`ectable node add NAME`) or drain one "
                       "(`ectable node drain NAME`)")
    actions = p.add_subparsers(dest="action", metavar="{add,drain}", help="add: make spare NAME one more active "
                               "node; drain: take node NAME out of the cluster (`--help` of each); without them: "
                               "run a node")
    a = actions.add_parser("add", help="make running spare NAME one more position: the cluster is laid out again "
                           "over it while it serves (writes wait a moment; nothing is lost); waits until it holds "
                           "the position, then lists it as a node in the cluster file")
    a.add_argument("target", metavar="NAME", help="the spare's name in the cluster file (`ectable spare add`)")
    a.add_argument("--config", dest="add_config", help="the cluster file (default cluster.toml)")
    a.add_argument("--cancel", action="store_true", help="withdraw the request instead")
    a.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    a.set_defaults(fn=cmd_add)
    d = actions.add_parser("drain", help="hand node NAME's position, identity and state to a free spare, then stop "
                           "the node; waits until the spare holds the position and the node is gone")
    d.add_argument("target", metavar="NAME", help="the node's name in the cluster file")
    d.add_argument("--config", dest="drain_config", help="the cluster file (default cluster.toml)")
    d.add_argument("--cancel", action="store_true", help="withdraw the request instead (only before the node is "
                   "fenced)")
    d.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    d.set_defaults(fn=cmd_drain)
    p.add_argument("--config", help="cluster TOML (endpoints, code, keys)")
    p.add_argument("--id", type=int, help="this node's position in [nodes] endpoints")
    p.add_argument("--name", help="this node's name in the cluster file ([nodes] names or spare_names; default names "
                   "node-N and spare-N): a node takes its position, a spare binds its endpoint and waits")
    p.add_argument("--bind", help="endpoint to listen on (default: from the config, else tcp://127.0.0.1:0)")
    p.add_argument("--parent", type=int, help="exit when this process dies")
    p.add_argument("--nice", type=int, default=0, help="lower the node's CPU priority by this much (as `nice -n`): "
                   "on a machine it shares with a training loop, the loop's work goes first (default 0)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port of 127.0.0.1 (default: "
                   "the cluster file's [metrics] port plus --id, if it has one; else none)")
    p.set_defaults(fn=cmd_node)
    p = sub.add_parser("spare", help="add a spare to a cluster file (then start it on its host)")
    p.add_argument("action", choices=["add"], help="add: list one more spare in the file")
    p.add_argument("name", help="the spare's name (what `ectable node --name` takes)")
    p.add_argument("endpoint", help="where it listens: tcp://HOST:PORT")
    p.add_argument("--config", default="cluster.toml", help="the cluster file to change (default cluster.toml)")
    p.set_defaults(fn=cmd_spare)
    p = sub.add_parser("decider", help="run a failover decider (run two or more: they elect one through etcd)")
    p.add_argument("--config", required=True, help="cluster TOML: [membership] etcd endpoints and prefix, [security]")
    p.add_argument("--parent", type=int, help="exit when this process dies")
    p.set_defaults(fn=cmd_decider)
    p = sub.add_parser("up", help="start a local cluster and write its TOML (until Ctrl-C or `ectable down`)")
    p.add_argument("--nodes", type=int, default=5, help="active nodes (default 5)")
    p.add_argument("--code", default="xor", choices=["none", "xor", "rs"],
                   help="the erasure code: none, xor (r=1) or rs (Reed-Solomon) (default xor)")
    p.add_argument("-k", type=int, default=4, help="data rows per stripe (default 4)")
    p.add_argument("-r", type=int, default=None, help="parity rows per stripe (default: 1 for xor, 2 for rs, 0 for none)")
    p.add_argument("--spares", type=int, default=1, help="spare nodes that take a dead node's place (default 1)")
    p.add_argument("--config", default="cluster.toml",
                   help="where to write the cluster TOML (default cluster.toml; refused if it describes a running "
                        "cluster)")
    p.add_argument("--keys", help="a directory of CURVE keys from `ectable keygen`")
    p.add_argument("--metrics-port", type=int, help="serve each node's Prometheus metrics on 127.0.0.1, from this "
                   "port up: one port per node and spare, in order (default: no metrics)")
    p.set_defaults(fn=cmd_up)
    p = sub.add_parser("down", help="stop a cluster that `ectable up` started")
    p.add_argument("--config", default="cluster.toml", help="the cluster's TOML (default cluster.toml)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to stop (default 60)")
    p.set_defaults(fn=cmd_down)
    p = sub.add_parser("status", help="print the nodes and tables of a cluster")
    p.add_argument("--config", default="cluster.toml", help="the cluster's TOML (default cluster.toml)")
    p.add_argument("--watch", type=float, nargs="?", const=1.0, default=0.0, metavar="SECONDS",
                   help="redraw every SECONDS (default 1) until Ctrl-C or the cluster stops")
    p.add_argument("--json", action="store_true", help="print the status as JSON (one object per line with --watch)")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("keygen", help="make CURVE keys for a cluster: one pair per node, decider and client")
    p.add_argument("--out", default="keys", help="directory to write node-N.toml, decider-N.toml, client-N.toml to")
    p.add_argument("--nodes", type=int, default=16, help="node keys, spares to come included")
    p.add_argument("--deciders", type=int, default=2, help="decider keys (default 2)")
    p.add_argument("--clients", type=int, default=4, help="client keys (default 4)")
    p.set_defaults(fn=cmd_keygen)
    p = sub.add_parser("checkpoint", help="list the checkpoints of a chain, or inspect one")
    p.add_argument("action", choices=["list", "inspect"], help="list the chain, or inspect one checkpoint")
    p.add_argument("path", help="the chain's directory or fsspec URL (what client.checkpoint was given)")
    p.add_argument("--number", type=int, help="inspect this checkpoint (default: the last finished one)")
    p.add_argument("--verify", action="store_true", help="inspect: read every piece and check its checksum")
    p.set_defaults(fn=cmd_checkpoint)
    p = sub.add_parser("restore", help="restore a checkpoint into a running cluster (of any shape)")
    p.add_argument("path", help="the chain's directory or fsspec URL")
    p.add_argument("--config", default="cluster.toml", help="the cluster's TOML")
    p.add_argument("--number", type=int, help="restore this checkpoint (default: the last finished one)")
    p.set_defaults(fn=cmd_restore)
    p = sub.add_parser("export", help="write a table's rows to a .npy file (ectable.load_rows reads it)")
    p.add_argument("table", help="the table's name")
    p.add_argument("path", help="the file's path or fsspec URL")
    p.add_argument("--config", default="cluster.toml", help="the cluster's TOML")
    p.add_argument("--state", action="store_true", help="whole records: weights, then optimizer state")
    p.set_defaults(fn=cmd_export)
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    from .errors import Error
    try:
        args.fn(args)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (Error, CommandError, OSError, ValueError) as exc:
        sys.exit(f"ectable {args.command}: {exc}")
    except Exception as exc:  # a bug: one line still, the traceback on request
        if os.environ.get("ECTABLE_DEBUG"):
            raise
        sys.exit(f"ectable {args.command}: {type(exc).__name__}: {exc} (ECTABLE_DEBUG=1 shows the traceback)")


if __name__ == "__main__":
    main()
