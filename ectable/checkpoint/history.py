"""A chain of checkpoints in one place: the root directory (a local path or fsspec URL), its identity,
and the checkpoints in it, numbered.

    ROOT/chain.json          {"format", "id"}: names the chain (nodes' flags are cleared for one chain)
    ROOT/00000001/           a checkpoint: pieces, extra.bin, manifest.json (written last: `pieces`)
    ROOT/00000002/ ...

A numbered directory without a manifest is a checkpoint that never finished; it is never read and is
deleted by the next checkpoint that keeps only some (`keep`).
"""
from __future__ import annotations

import json
import uuid

from .pieces import MANIFEST, BadCheckpoint, location, read_manifest
from .policy import Taken

CHAIN = "chain.json"


class Chain:
    """The checkpoints under one root: `fs`, `root` (path in fs), `id`, and `manifests` (finished ones,
    ascending by number) with `numbers` (every numbered directory, finished or not)."""

    def __init__(self, url: str, create: bool = False):
        """Open the chain at `url`; with `create`, start one there if there is none."""
        self.url = url
        self.fs, self.root = location(url)
        self.root = self.root.rstrip("/") or "/"
        try:
            self.id = json.loads(self.fs.cat_file(f"{self.root}/{CHAIN}"))["id"]
        except FileNotFoundError:
            if not create:
                raise BadCheckpoint(f"{url} holds no checkpoints (no {CHAIN})") from None
            self.fs.makedirs(self.root, exist_ok=True)
            self.id = uuid.uuid4().hex
            tmp = f"{self.root}/.{CHAIN}.{self.id[:8]}"
            with self.fs.open(tmp, "wb") as f:
                f.write(json.dumps({"format": 1, "id": self.id}).encode())
            self.fs.mv(tmp, f"{self.root}/{CHAIN}")
        except (ValueError, KeyError, TypeError) as exc:
            raise BadCheckpoint(f"{url}/{CHAIN} is not a chain's record: {exc}") from None
        self.numbers = sorted(int(name) for name in self._entries() if name.isdigit())
        self.manifests = []
        for number in self.numbers:
            if not self.fs.exists(f"{self.directory(number)}/{MANIFEST}"):
                continue  # never finished
            manifest = read_manifest(self.fs, self.directory(number))
            if manifest.get("chain") != self.id or manifest.get("number") != number:
                raise BadCheckpoint(f"checkpoint {self.directory(number)} belongs to another chain or number")
            self.manifests.append(manifest)

    def _entries(self) -> list[str]:
        return [path.rstrip("/").rsplit("/", 1)[-1] for path in self.fs.ls(self.root, detail=False)]

    def directory(self, number: int) -> str:
        return f"{self.root}/{number:08d}"

    def url_of(self, number: int) -> str:
        """The URL of checkpoint `number`'s directory, as another process opens it."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        path = self.directory(number)
        return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"

    def taken(self) -> list[Taken]:
        return [Taken(m["number"], m["kind"], m["rows"], m["total"]) for m in self.manifests]

    def manifest(self, number: int) -> dict:
        for manifest in self.manifests:
            if manifest["number"] == number:
                return manifest
        raise BadCheckpoint(f"checkpoint {number} of {self.url} is missing or never finished")

    def remove(self, number: int) -> None:
        """Delete checkpoint directory `number` (finished or not)."""
        if self.fs.exists(self.directory(number)):
            self.fs.rm(self.directory(number), recursive=True)
