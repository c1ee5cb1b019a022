"""The client side: the public verbs (`Client`), degraded reads and rebuilds (`repair`), `connect`."""
from .client import Client


def connect(path: str) -> Client:
    """A client of the cluster described by the TOML file at `path`; `close()` it when done."""
    from ..cluster.maps import RemoteCluster
    cluster = RemoteCluster.from_file(path)
    try:
        client = Client(cluster)
    except BaseException:  # refused (authentication, a node away): what was opened for it closes with it
        cluster.close()
        raise
    client.owns_cluster = True
    return client


__all__ = ["Client", "connect"]
