"""The client side: the public verbs (`Client`), degraded reads and rebuilds (`repair`), `connect`."""
from .client import Client


def connect(path: str) -> Client:
    """A client of the cluster described by the TOML file at `path`; `close()` it when done."""
    from ..cluster.maps import RemoteCluster
    client = Client(RemoteCluster.from_file(path))
    client.owns_cluster = True
    return client


__all__ = ["Client", "connect"]
