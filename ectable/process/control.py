"""Control calls from a decider (or a cluster's owner) to nodes by endpoint, over any transport."""
from __future__ import annotations

import zmq

from .. import clock
from ..errors import Error, NodeDown
from ..transport import Channel, ZmqChannel


class Control:
    """`call_all({endpoint: (header, arrays)}, timeout, again)`: all sent at once, one timeout for them all
    (`again`: see `Channel.start`); {endpoint: (reply, arrays), or the NodeDown / Error met}. Subclasses open
    the channels."""

    refused: tuple = ()  # what opening or using a channel to a bad endpoint raises, besides NodeDown

    def __init__(self):
        self.channels: dict[str, Channel] = {}

    def open(self, endpoint: str, timeout: float) -> Channel:
        raise NotImplementedError

    def keep(self, endpoints) -> None:
        """Close the channels to every endpoint but `endpoints` (nodes gone from the map and presence): each
        open channel holds sockets, of which a process has a bounded number."""
        for endpoint in self.channels.keys() - set(endpoints):
            self.channels.pop(endpoint).close()

    def call_all(self, requests: dict, timeout: float, again: bool = True) -> dict:
        pending, out = {}, {}
        for endpoint, (header, arrays) in requests.items():
            try:
                channel = self.channels.get(endpoint)
                if channel is None:
                    channel = self.channels[endpoint] = self.open(endpoint, timeout)
                pending[endpoint] = channel.start(header, list(arrays), again)
            except NodeDown as exc:
                out[endpoint] = exc
            except self.refused as exc:  # a bad endpoint, say: as good as dead
                self.channels.pop(endpoint).close()
                out[endpoint] = NodeDown(f"{endpoint}: {exc}")
        deadline = clock.monotonic() + timeout
        for endpoint, request in pending.items():
            try:
                reply = request.wait(max(deadline - clock.monotonic(), 0.01))
            except NodeDown as exc:
                out[endpoint] = exc
                continue
            out[endpoint] = Error(f"node {endpoint}: {reply[0].get('message')}") if reply[0].get("error") else reply
        return out

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()


class ZmqControl(Control):
    """Control calls over ZeroMQ (with CURVE keys, if the cluster has them)."""

    refused = (zmq.ZMQError,)

    def __init__(self, context: zmq.Context, curve: dict | None = None):
        super().__init__()
        self.context, self.curve = context, curve

    def open(self, endpoint: str, timeout: float) -> ZmqChannel:
        return ZmqChannel(endpoint, self.context, self.curve, connect_timeout=timeout)
