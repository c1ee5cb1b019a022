"""ectable: erasure-coded, fault-tolerant storage for the embedding tables of recommendation models."""
import importlib.util as _util
import os as _os
import sys as _sys

if _util.find_spec(__name__ + ".transport") is None:  # a plain checkout: `transport/` sits beside the package
    _top = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "transport")
    _spec = _util.spec_from_file_location(__name__ + ".transport", _os.path.join(_top, "__init__.py"),
                                          submodule_search_locations=[_top])
    _sys.modules[_spec.name] = transport = _util.module_from_spec(_spec)
    _spec.loader.exec_module(transport)

from . import config
from .checkpoint.pieces import BadCheckpoint
from .client import Client, connect
from .client.checkpoints import Restored, load_rows
from .errors import AuthenticationFailed, Error, InvalidRequest, NodeDown, Unavailable, WritesLost
from .lookahead import Lookahead
from .process.local import LocalCluster
from .storage.table import TableSpec



def restore(path: str, cluster, number: int | None = None) -> Restored:
    """Install checkpoint `number` (default: the last) of the chain at `path` into `cluster` (a
    `LocalCluster`, or the path of a cluster's TOML file), of any shape; see `Client.restore`."""
    client = connect(cluster) if isinstance(cluster, str) else cluster.connect()
    try:
        return client.restore(path, number)
    finally:
        client.close()


__version__ = "0.1.0"
__all__ = ["LocalCluster", "connect", "Client", "TableSpec", "Error", "InvalidRequest", "Unavailable", "NodeDown",
           "WritesLost", "AuthenticationFailed", "BadCheckpoint", "Restored", "restore", "load_rows",
           "Lookahead"]
