"""CURVE keys by role, and which operations a node takes from which role.

`ectable keygen` makes one key pair per node, decider and client, and one server key pair that
every node listens with. Each process gets a TOML file whose [security] section holds the
server's public key (nodes: its secret too), the process's own pair (`public`, `secret`) and
the public keys of every role (`nodes`, `deciders`, `clients`). A node admits a connection only
from a listed key, and then, per operation:

- `map`, `invalidate`, `rollback`, a fencing `applied` and a drain's handover (`freeze`,
  `hand_over`, `take_over`): only from a decider's key;
- a parity `delta` of a node's window: only from the key the current map gives the live node
  whose identity the delta names (a node announces its key with its presence; deciders copy it
  into the map), so a dead node, a spare, another node, a client or a decider cannot fold
  anything into a node's delta stream;
- `snapshot` (a checkpoint: the node writes files where the request says): only from a client's key;
- everything else (reads, writes, replays, degraded writes through the parity for a position
  the node knows dead, rebuild traffic): from any listed key.

Without keys (loopback only, see `ectable node`) every local process may send anything.
"""
from __future__ import annotations

ROLES = ("node", "decider", "client")
DECIDER_OPS = frozenset({"map", "invalidate", "rollback", "freeze", "hand_over", "take_over"})
CLIENT_OPS = frozenset({"snapshot"})
FIELDS = ("server_public", "public", "secret", "nodes", "deciders", "clients")


def keygen(nodes: int, deciders: int, clients: int) -> dict[str, dict]:
    """{name: its [security] section} for node-0.., decider-0.., client-0.."""
    import zmq

    def pair() -> tuple[str, str]:
        public, secret = zmq.curve_keypair()
        return public.decode(), secret.decode()

    server_public, server_secret = pair()
    own = {f"{role}-{i}": pair() for role, n in zip(ROLES, (nodes, deciders, clients)) for i in range(n)}
    lists = {f"{role}s": [public for name, (public, _) in own.items() if name.startswith(f"{role}-")] for role in ROLES}
    out = {}
    for name, (public, secret) in own.items():
        section = {"server_public": server_public, "public": public, "secret": secret, **lists}
        if name.startswith("node-"):
            section["server_secret"] = server_secret
        out[name] = section
    return out


def checked(section: dict | None) -> dict | None:
    """A [security] section with every field it needs, or ValueError naming what is missing."""
    if section is None:
        return None
    missing = [f for f in FIELDS if f not in section]
    if missing:
        raise ValueError(f"[security] lacks {missing}: make per-role keys with `ectable keygen --out DIR` "
                         f"and give each process its own file")
    return section


def role(section: dict, key: str | None) -> str | None:
    """The role whose listed key `key` is (None: not listed)."""
    for name in ROLES:
        if key in section[f"{name}s"]:
            return name
    return None


def refusal(msg, key: str | None, section: dict | None, peers: dict) -> str | None:
    """Why a node refuses request `msg` sent with `key` (None: it takes it). `peers`: {identity: key} of
    the nodes the node's current map gives a live position."""
    if section is None:
        return None
    who = role(section, key)
    if msg.op in DECIDER_OPS or (msg.op == "applied" and msg.fence):
        return None if who == "decider" else f"{msg.op} is taken from a decider's key only, not a {who}'s"
    if msg.op in CLIENT_OPS:
        return None if who == "client" else f"{msg.op} is taken from a client's key only, not a {who}'s"
    if msg.op == "delta" and msg.dead is None:
        if who == "node" and peers.get(msg.source) == key:
            return None
        return f"a window's parity delta of {msg.source!r} is taken only from that node's key in the map"
    return None if who is not None else "this key is not listed in the cluster's [security]"
