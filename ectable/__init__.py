"""ectable: erasure-coded, fault-tolerant storage for the embedding tables of recommendation models."""
from . import config
from .client import Client, connect
from .errors import Error, InvalidRequest, NodeDown, Unavailable
from .process.local import LocalCluster
from .storage.table import TableSpec

__version__ = "0.1.0"
__all__ = ["LocalCluster", "connect", "Client", "TableSpec", "Error", "InvalidRequest", "Unavailable", "NodeDown"]
