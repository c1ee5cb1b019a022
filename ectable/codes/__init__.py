"""Erasure codes behind one interface (`Code`), looked up by name."""
from __future__ import annotations

from .abc import Code
from .none import NoCode
from .rs import RSCode
from .xor import XorCode

registry: dict[str, type[Code]] = {cls.codec_id: cls for cls in (NoCode, XorCode, RSCode)}


def get_code(config: dict | str, k: int | None = None, r: int | None = None) -> Code:
    """A code from its config dict ({"id", "k", "r"}) or its name plus k and r."""
    if isinstance(config, str):
        config = {"id": config, "k": k, "r": r}
    name = config.get("id")
    if name not in registry:
        raise ValueError(f"unknown code {name!r}; choose one of {sorted(registry)}")
    args = {key: config[key] for key in ("k", "r") if config.get(key) is not None}
    return registry[name](**args)


__all__ = ["Code", "NoCode", "XorCode", "RSCode", "get_code", "registry"]
