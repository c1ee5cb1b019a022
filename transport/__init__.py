"""Transports: how clients and nodes exchange (header, arrays) messages.

`Channel` is the one interface: a request/reply path to one node. The in-process
implementation calls the node's logic directly (for `processes=False`); the
ZeroMQ one (next) carries the same messages as a msgpack header frame plus raw
array frames.
"""
from .base import RESEND_AFTER, Channel, Done, Pending, Resends
from .inprocess import InProcessChannel
from .zeromq import ZmqChannel

__all__ = ["RESEND_AFTER", "Channel", "Pending", "Done", "Resends", "InProcessChannel", "ZmqChannel"]
