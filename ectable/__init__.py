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
from .client import Client, connect
from .errors import AuthenticationFailed, Error, InvalidRequest, NodeDown, Unavailable
from .process.local import LocalCluster
from .storage.table import TableSpec

__version__ = "0.1.0"
__all__ = ["LocalCluster", "connect", "Client", "TableSpec", "Error", "InvalidRequest", "Unavailable", "NodeDown",
           "AuthenticationFailed"]
