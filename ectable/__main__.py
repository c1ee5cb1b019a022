"""The `ectable` command: node, decider, up, status, keygen, checkpoint list|inspect, restore, export."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from . import config as cluster_config


def cmd_node(args) -> None:
    from .process.node_server import run
    from .security import checked
    data = cluster_config.load(args.config) if args.config else {}
    try:
        curve = checked(data.get("security"))
    except ValueError as exc:
        sys.exit(f"ectable node: {exc}")
    map_header, bind = None, args.bind
    if args.id is not None:
        if "nodes" not in data:
            sys.exit("ectable node --id needs --config with [cluster] and [nodes]")
        endpoints = data["nodes"]["endpoints"]
        bind = bind or endpoints[args.id]
        map_header = {"op": "map", "position": args.id, "config": data["cluster"], "endpoints": endpoints, "dead": []}
    run(bind or "tcp://127.0.0.1:0", curve, args.parent, map_header, _token(data), data.get("membership"))


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
    cluster = ProcessCluster(nodes=args.nodes, code=args.code, k=args.k, r=args.r, spares=args.spares, keys=args.keys)
    fd = os.open(args.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(cluster_config.dumps(cluster.describe()))
    print(f"ectable: {args.nodes} nodes ({args.code}, k={args.k}, r={cluster.config.r}) and {args.spares} spares are up; "
          f"wrote {args.config}. Ctrl-C stops them.", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    cluster.close()


def cmd_status(args) -> None:
    from .client import connect
    client = connect(args.config)
    try:
        while True:
            text = render(client.status())
            if args.watch and sys.stdout.isatty():
                text = "\x1b[H\x1b[J" + text  # redraw in place
            print(text, flush=True)
            if not args.watch:
                return
            time.sleep(args.watch)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


def render(status: dict) -> str:
    """A readable table of a client's `status()`, with a progress bar while a node rebuilds."""
    code = status["code"]
    head = (f"code {code['id']}(k={code['k']}, r={code['r']})  epoch {status.get('epoch', '-')}  "
            f"tables {len(status['tables'])}  spares {status['spares']}  dirty rows {status['dirty_rows']}  "
            f"parity lag {status['parity_lag_writes']} writes  degraded {status['degraded'] or '-'}")
    cols = ["node", "role", "health", "data rows", "parity rows", "dirty", "unacked", "rebuild left", "rejected", "endpoint"]
    rows = [[n.get("position"), n.get("role"), n.get("health"), n.get("data_rows", "-"), n.get("parity_rows", "-"),
             n.get("dirty_rows", "-"), n.get("unacked_deltas", "-"), n.get("rebuild_missing", "-"),
             n.get("rejected", 0) + n.get("malformed", 0) if "rejected" in n else "-", n.get("endpoint", "")]
            for n in status["nodes"]]
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(str(c).ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)) for r in rows]
    for n in status["nodes"]:
        if n.get("role") == "rebuilding":
            lines.append(f"node {n['position']} rebuilding " + progress_bar(n["rebuild"]))
    checkpoint = status.get("checkpoint")
    if checkpoint:
        lines.append(f"checkpoint {checkpoint['number']} ({checkpoint['kind']}) writing " + progress_bar(
            {"done": checkpoint["written"], "left": checkpoint["rows"] - checkpoint["written"]}))
    if status["degraded"] and not status["spares"]:
        lines.append(f"nodes {status['degraded']} are down and no spare is left: serving degraded")
    return "\n".join(lines)


def progress_bar(progress: dict, width: int = 30) -> str:
    """[#####.....]  45%  12,000 / 26,000 rows  3,100 rows/s  ETA 4.5 s"""
    done, left = progress.get("done", 0), progress.get("left", 0)
    total = done + left
    share = done / total if total else 1.0
    fill = int(round(share * width))
    eta = progress.get("eta")
    return (f"[{'#' * fill}{'.' * (width - fill)}] {share:4.0%}  {done:,} / {total:,} rows  "
            f"{progress.get('rate', 0.0):,.0f} rows/s  ETA {'-' if eta is None else f'{eta:.1f} s'}")


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
        fd = os.open(os.path.join(args.out, f"{name}.toml"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cluster_config.dumps({"security": section}))
    print(f"wrote CURVE keys for {args.nodes} nodes, {args.deciders} deciders and {args.clients} clients to "
          f"{args.out}/ (one file per process, keep them secret); `ectable up --keys {args.out}` uses them")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="ectable", description="erasure-coded embedding-table storage")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("node", help="run one storage node")
    p.add_argument("--config", help="cluster TOML (endpoints, code, keys)")
    p.add_argument("--id", type=int, help="this node's position in [nodes] endpoints")
    p.add_argument("--bind", help="endpoint to listen on (default: from the config, else tcp://127.0.0.1:0)")
    p.add_argument("--parent", type=int, help="exit when this process dies")
    p.set_defaults(fn=cmd_node)
    p = sub.add_parser("decider", help="run a failover decider (run two or more: they elect one through etcd)")
    p.add_argument("--config", required=True, help="cluster TOML: [membership] etcd endpoints and prefix, [security]")
    p.add_argument("--parent", type=int, help="exit when this process dies")
    p.set_defaults(fn=cmd_decider)
    p = sub.add_parser("up", help="start a local cluster and write its TOML")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--code", default="xor", choices=["none", "xor", "rs"])
    p.add_argument("-k", type=int, default=4)
    p.add_argument("-r", type=int, default=None)
    p.add_argument("--spares", type=int, default=1)
    p.add_argument("--config", default="cluster.toml", help="where to write the cluster TOML")
    p.add_argument("--keys", help="a directory of CURVE keys from `ectable keygen`")
    p.set_defaults(fn=cmd_up)
    p = sub.add_parser("status", help="print the nodes of a cluster")
    p.add_argument("--config", default="cluster.toml")
    p.add_argument("--watch", type=float, nargs="?", const=1.0, default=0.0, help="repeat every N seconds")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("keygen", help="make CURVE keys for a cluster: one pair per node, decider and client")
    p.add_argument("--out", default="keys", help="directory to write node-N.toml, decider-N.toml, client-N.toml to")
    p.add_argument("--nodes", type=int, default=16, help="node keys, spares to come included")
    p.add_argument("--deciders", type=int, default=2)
    p.add_argument("--clients", type=int, default=4)
    p.set_defaults(fn=cmd_keygen)
    p = sub.add_parser("checkpoint", help="list the checkpoints of a chain, or inspect one")
    p.add_argument("action", choices=["list", "inspect"])
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
    p.add_argument("table")
    p.add_argument("path", help="the file's path or fsspec URL")
    p.add_argument("--config", default="cluster.toml", help="the cluster's TOML")
    p.add_argument("--state", action="store_true", help="whole records: weights, then optimizer state")
    p.set_defaults(fn=cmd_export)
    args = parser.parse_args(argv)
    from .errors import Error
    try:
        args.fn(args)
    except Error as exc:
        sys.exit(f"ectable {args.command}: {exc}")


if __name__ == "__main__":
    main()
