"""The client's side of the checkpoint tier: take a checkpoint at the caller's iteration boundary,
finish it when every node has written its pieces, restore a chain into any cluster, export a table.

A checkpoint is taken in two rounds to every node: a check (do its flags fit the chain, are its
rows all there), then the snapshot (each node copies its rows and answers; it writes their pieces in
the background). If any node's flags do not fit (a checkpoint failed since, or the chain is new to
it) the checkpoint is a full one. The rows of a position that is dead or still rebuilding are read
by the client through the parity, all of them, and written by a thread of the client's. The
manifest is written once every node reports its pieces written (`wait`).
"""
from __future__ import annotations

import hashlib
import time
from typing import NamedTuple

import numpy as np

from ..arrays import unique
from .. import clock
from ..checkpoint import pieces, policy as policies
from ..checkpoint.history import Chain
from ..checkpoint.quantize import BITS
from ..errors import Error, InvalidRequest, NodeDown
from ..protocol import messages as m
from ..storage import snapshots
from ..storage.table import TableSpec

WAIT = 900.0  # seconds checkpoint_wait waits by default
READ_ROWS = 1 << 16  # rows per read of a position read through the parity
EXTRA = "extra.bin"


class Restored(NamedTuple):
    """What a restore installed: the checkpoint's number, its `extra` bytes, its tables and rows written."""

    number: int
    extra: bytes | None
    tables: list
    rows: int


class _Pending(NamedTuple):
    chain: Chain
    number: int
    manifest: dict  # everything but the pieces
    nodes: dict  # position -> the node identity writing its pieces
    local: snapshots.Writer | None  # pieces of positions read through the parity
    keep: int | None


class Checkpoints:
    """Checkpoints of one client; at most one is being written at a time."""

    def __init__(self, client):
        self.client = client
        self.pending: _Pending | None = None

    def relaid(self, sources: dict) -> None:
        """The cluster was laid out again: the node now at each position took over the pieces its predecessor
        wrote (`storage.relayout`), so a checkpoint being written is asked of it."""
        if self.pending is not None:
            self.pending = self.pending._replace(nodes={p: sources.get(p) for p in self.pending.nodes})

    # -- take ----------------------------------------------------------------
    def take(self, path: str, policy, bits: int | None, adaptive: bool, extra, keep: int | None,
             state_bits: int | None = None) -> int:
        """Start checkpoint of every table into the chain at `path`; its number."""
        policy = policies.Policy.from_config(policy)
        for name, value in (("bits", bits), ("state_bits", state_bits)):
            if value not in (None, *BITS) or isinstance(value, bool):
                raise InvalidRequest(f"{name} must be one of {BITS} or None (exact), got {value!r}")
        if extra is not None and not isinstance(extra, (bytes, bytearray, memoryview)):
            raise InvalidRequest(f"extra must be bytes (or None), got {type(extra).__name__}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise InvalidRequest(f"keep must be a positive number of checkpoints, got {keep!r}")
        if not isinstance(path, str) or not path:
            raise InvalidRequest(f"a checkpoint path is a directory or fsspec URL, got {path!r}")
        client = self.client
        self._refuse_memory(path)
        self.wait()  # the one before, if it is still being written
        chain = Chain(path, create=True)
        taken = chain.taken()
        kind = policies.next_kind(policy, taken)
        number = (chain.numbers[-1] if chain.numbers else 0) + 1
        after = taken[-1].number if taken else None
        base = next((t.number for t in reversed(taken) if t.kind == "full"), None)
        client._refresh_tables()  # (not `tables()`, which would send a step due first)
        tables = {name: spec.get_config() for name, (spec, _) in client._tables.items()}
        directory = chain.url_of(number)
        chain.fs.makedirs(chain.directory(number), exist_ok=True)
        request = dict(number=number, root=chain.id, directory=directory, after=after, base=base, bits=bits,
                       adaptive=bool(adaptive), state_bits=state_bits)
        live = client._positions()  # what moved failed over first, so that every position's state is known
        checks = self._ask_all({p: m.Snapshot(kind=kind, check=True, **request) for p in live})
        if kind != "full" and not all(reply["fits"] for reply in checks.values() if reply and "fits" in reply):
            kind = "full"  # some node's flags were cleared for another chain, or a checkpoint that failed
        ready = [p for p, reply in checks.items() if reply and "fits" in reply]
        taken_by, total, rows = {}, 0, 0
        for p, reply in self._ask_all({p: m.Snapshot(kind=kind, **request) for p in ready}).items():
            if reply and "rows" in reply:
                taken_by[p] = client._sources.get(p)
                rows += reply["rows"]
                total += reply["touched"]
        degraded = [p for p in range(client.nodes) if p not in taken_by]
        work = self._read_through_parity(degraded, tables)
        local = None
        if work:
            local = snapshots.Writer(number, directory, "client", work, bits, adaptive, state_bits)
            rows += local.rows
            total += local.rows
        manifest = {"chain": chain.id, "number": number, "kind": kind, "policy": policy.get_config(),
                    "bits": bits, "adaptive": bool(adaptive and bits is not None), "state_bits": state_bits,
                    "rows": rows, "total": total,
                    "tables": list(tables.values()), "degraded": degraded, "created": time.time(),
                    "chain_numbers": [t.number for t in policies.restore_chain(
                        [*taken, policies.Taken(number, kind, rows, total)])],
                    "cluster": client.config.make_code().get_config() | {"nodes": client.nodes},
                    "extra": self._write_extra(chain, number, extra)}
        self.pending = _Pending(chain, number, manifest, taken_by, local, keep)
        return number

    def _refuse_memory(self, path: str) -> None:
        """memory:// is a filesystem per process: node processes could not write where the client reads."""
        if path.startswith("memory:") and getattr(self.client.cluster, "processes", True):
            raise InvalidRequest("memory:// checkpoints need nodes in this process (processes=False): each "
                                 "process has a memory filesystem of its own")

    def _ask_all(self, requests: dict) -> dict:
        """{position: reply} of snapshot requests sent to every position at once (to the node identity this
        client knows there); None for a node that did not answer (its rows are read through the parity)."""
        client = self.client
        replies, failed = client._gather_live(
            {(p,): ({**request.header(), "node": client._sources.get(p)}, []) for p, request in requests.items()})
        for p in failed:
            client._lost(p)
        return {p: replies[(p,)][0] if (p,) in replies else None for p in requests}

    def _read_through_parity(self, positions: list, tables: dict) -> list:
        """[(table, dim, ids, records)] of every row of `positions`, read from wherever they can be."""
        work = []
        for name in tables:
            spec, layout = self.client._table(name)
            for p in positions:
                local = np.arange(layout.data_capacity())
                ids = layout.data_ids(p, local)
                ids = ids[ids < spec.num_rows]
                records = np.empty((ids.size, spec.width), dtype=np.float32)
                for start in range(0, ids.size, READ_ROWS):
                    part = ids[start:start + READ_ROWS]
                    records[start:start + part.size] = self.client._read_node(p, {name: part}, records=True)[0]
                if ids.size:
                    work.append((name, spec.dim, ids, records))
        return work

    @staticmethod
    def _write_extra(chain: Chain, number: int, extra) -> dict | None:
        if extra is None:
            return None
        data = bytes(extra)
        with chain.fs.open(f"{chain.directory(number)}/{EXTRA}", "wb") as f:
            f.write(data)
        return {"file": EXTRA, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    # -- finish ----------------------------------------------------------------
    def progress(self) -> dict | None:
        """The checkpoint being written: number, kind, rows, rows and bytes written so far, whether done, and
        why it failed if a node could not write its part; None if none is being written."""
        pending = self.pending
        if pending is None:
            return None
        reports = [self._progress(p) for p in pending.nodes] + ([pending.local.progress()] if pending.local else [])
        return {"number": pending.number, "kind": pending.manifest["kind"], "rows": pending.manifest["rows"],
                "written": sum(r.get("written", 0) for r in reports), "bytes": sum(r.get("bytes", 0) for r in reports),
                "done": all(r["done"] for r in reports), "error": next((r["error"] for r in reports if r["error"]), None)}

    def _progress(self, p) -> dict:
        """Node p's report on its pieces; a node gone away since reports that as its error."""
        pending = self.pending
        try:
            return self.client._call(p, m.SnapshotProgress(number=pending.number, node=pending.nodes[p]).header(), [])[0]
        except (NodeDown, InvalidRequest) as exc:
            return {"done": True, "error": f"node {p} went away before writing its pieces ({exc})"}

    def _fail(self, why: str):
        """Give up the checkpoint being written: its directory has no manifest, so it is never read (the
        next checkpoint that keeps some deletes it), and its number is not used again."""
        pending, self.pending = self.pending, None
        raise Error(f"checkpoint {pending.number} failed: {why}; take another (it will be a full one)")

    def wait(self, timeout: float | None = None) -> dict | None:
        """Wait until the checkpoint being written is, then write its manifest; its manifest (None if none)."""
        pending = self.pending
        if pending is None:
            return None
        deadline = clock.monotonic() + (WAIT if timeout is None else timeout)
        entries, seconds = {}, []
        while True:
            for p in pending.nodes:
                if p not in entries:
                    reply = self._progress(p)
                    if reply["error"]:
                        self._fail(f"node {p}: {reply['error']}")
                    if reply["done"]:
                        entries[p] = reply["pieces"]
                        seconds.append(reply["seconds"])
            local = pending.local
            if local is not None and local.done and local.error:
                self._fail(f"the rows read through the parity could not be written: {local.error}")
            if len(entries) == len(pending.nodes) and (local is None or local.done):
                break
            if clock.monotonic() > deadline:
                raise Error(f"checkpoint {pending.number} not written after {timeout or WAIT} s (still writing: "
                            f"nodes {sorted(set(pending.nodes) - set(entries))}); wait again")
            clock.sleep(0.01)
        listed = [entry for p in sorted(entries) for entry in entries[p]] + (local.pieces if local else [])
        seconds += [local.seconds] if local else []
        manifest = {**pending.manifest, "pieces": listed, "write_seconds": max(seconds, default=0.0)}
        pieces.write_manifest(pending.chain.fs, pending.chain.directory(pending.number), manifest)
        self.pending = None
        if pending.keep is not None:
            self._prune(pending.chain.url, pending.keep)
        return manifest

    @staticmethod
    def _prune(url: str, keep: int) -> None:
        """Delete the checkpoints that no restore to the last `keep` reads, and unfinished ones."""
        chain = Chain(url)
        finished = {m["number"] for m in chain.manifests}
        for taken in policies.deletable(chain.taken(), keep):
            chain.remove(taken.number)
        for number in chain.numbers:
            if number not in finished:
                chain.remove(number)

    # -- restore -------------------------------------------------------------
    def restore(self, path: str, number: int | None = None) -> Restored:
        """Install checkpoint `number` (default: the last) of the chain at `path` into this cluster, whose
        tables of those names must not exist: every piece of the chain is checked first, so a bad
        checkpoint changes nothing, and the tables are dropped again if writing them fails."""
        chain = Chain(path)
        taken = chain.taken()
        try:
            links = policies.restore_chain(taken, number)
        except InvalidRequest as exc:
            raise pieces.BadCheckpoint(f"{path}: {exc}") from None
        manifests = [chain.manifest(t.number) for t in links]
        last = manifests[-1]
        if last.get("chain_numbers") != [t.number for t in links]:
            raise pieces.BadCheckpoint(f"checkpoint {last['number']} of {path} was taken after checkpoints "
                                       f"{last.get('chain_numbers')}, not {[t.number for t in links]}: one is missing")
        specs = {config["name"]: TableSpec.from_config(config) for config in last["tables"]}
        existing = sorted(set(specs) & set(self.client.tables()))
        if existing:
            raise InvalidRequest(f"tables {existing} exist in this cluster: restore into a cluster without them")
        for manifest in manifests:  # check everything before anything changes
            for entry in manifest["pieces"]:
                self._checked(chain, manifest, entry, specs)
        extra = self._read_extra(chain, last)
        created, rows = [], 0
        try:
            for spec in specs.values():
                init = dict(spec.init)
                self.client.create_table(spec.name, spec.num_rows, spec.dim, spec.optimizer["name"],
                                         spec.optimizer["lr"], spec.optimizer["eps"], init.pop("kind"), spec.seed,
                                         **init)
                created.append(spec.name)
            for manifest in manifests:  # later checkpoints' rows over earlier ones'
                for entry in manifest["pieces"]:
                    piece = self._checked(chain, manifest, entry, specs)
                    if piece["table"] in specs and piece["rows"]:
                        records = np.concatenate([piece["weights"], piece["state"]], axis=1)
                        self.client.put_many({piece["table"]: (piece["ids"], records)}, records=True)
                        rows += piece["rows"]
        except BaseException:
            for name in created:
                try:
                    self.client.drop_table(name)
                except Error:
                    pass
            raise
        return Restored(last["number"], extra, list(specs), rows)

    @staticmethod
    def _checked(chain: Chain, manifest: dict, entry: dict, specs: dict) -> dict:
        """A piece of `manifest`, read and checked against the tables being restored."""
        piece = pieces.read_piece(chain.fs, chain.directory(manifest["number"]), entry)
        name = f"piece {entry['file']} of checkpoint {manifest['number']}"
        spec = specs.get(piece["table"])
        if spec is None:
            if any(t["name"] == piece["table"] for t in manifest["tables"]):
                return piece  # a table dropped before the last checkpoint of the chain
            raise pieces.BadCheckpoint(f"{name} holds rows of table {piece['table']!r}, which it does not list")
        ids = piece["ids"]
        if piece["dim"] != spec.dim or piece["state"].shape[1] != spec.width - spec.dim:
            raise pieces.BadCheckpoint(f"{name}: rows of {piece['dim']} weights and {piece['state'].shape[1]} state "
                                       f"values do not fit table {spec.name!r} ({spec.dim} + {spec.width - spec.dim})")
        if ids.size and (ids.min() < 0 or ids.max() >= spec.num_rows or unique(ids).size != ids.size):
            raise pieces.BadCheckpoint(f"{name}: row ids out of range or repeated for table {spec.name!r}")
        if not (np.isfinite(piece["weights"]).all() and np.isfinite(piece["state"]).all()):
            raise pieces.BadCheckpoint(f"{name}: non-finite values")
        return piece

    @staticmethod
    def _read_extra(chain: Chain, manifest: dict) -> bytes | None:
        entry = manifest.get("extra")
        if entry is None:
            return None
        try:
            data = chain.fs.cat_file(f"{chain.directory(manifest['number'])}/{entry['file']}")
        except FileNotFoundError:
            raise pieces.BadCheckpoint(f"{EXTRA} of checkpoint {manifest['number']} is missing") from None
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise pieces.BadCheckpoint(f"{EXTRA} of checkpoint {manifest['number']} is corrupt or truncated")
        return data


def export(client, table: str, path: str, state: bool = False) -> int:
    """Write every row of `table` (weights, or with `state` whole records) as one float32 .npy file at
    `path` (a local path or fsspec URL), read in blocks; its row count."""
    spec, layout = client._table(table)
    width = spec.width if state else spec.dim
    fs, where = pieces.location(path)
    with fs.open(where, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (spec.num_rows, width)})
        for start in range(0, spec.num_rows, READ_ROWS):
            ids = np.arange(start, min(start + READ_ROWS, spec.num_rows))
            rows = np.empty((ids.size, width), dtype=np.float32)
            for p, at in client._by_node(layout, ids):
                rows[at] = client._read_node(p, {table: ids[at]}, records=True)[0][:, :width]
            f.write(rows.tobytes())
    return spec.num_rows


def load_rows(path: str, mmap: bool = False) -> np.ndarray:
    """The rows a `Client.export` wrote at `path` (a local path or fsspec URL); `mmap`: map a local file
    instead of reading it."""
    fs, where = pieces.location(path)
    if mmap:
        return np.load(where, mmap_mode="r")
    with fs.open(where, "rb") as f:
        return np.load(f, allow_pickle=False)
