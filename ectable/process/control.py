"""Control calls from a decider (or a cluster's owner) to nodes by endpoint, over ZeroMQ."""
from __future__ import annotations

import time

import zmq

from ..errors import Error, NodeDown
from ..transport import ZmqChannel


class ZmqControl:
    """`call_all({endpoint: (header, arrays)}, timeout)`: all sent at once, one timeout for them all;
    {endpoint: (reply, arrays), or the NodeDown / Error met}."""

    def __init__(self, context: zmq.Context, curve: dict | None = None):
        self.context, self.curve = context, curve
        self.channels: dict[str, ZmqChannel] = {}

    def call_all(self, requests: dict, timeout: float) -> dict:
        pending, out = {}, {}
        for endpoint, (header, arrays) in requests.items():
            try:
                channel = self.channels.get(endpoint)
                if channel is None:
                    channel = self.channels[endpoint] = ZmqChannel(endpoint, self.context, self.curve,
                                                                   connect_timeout=timeout)
                pending[endpoint] = channel.start(header, list(arrays))
            except NodeDown as exc:
                out[endpoint] = exc
            except zmq.ZMQError as exc:  # a bad endpoint, say: as good as dead
                self.channels.pop(endpoint).close()
                out[endpoint] = NodeDown(f"{endpoint}: {exc}")
        deadline = time.monotonic() + timeout
        for endpoint, request in pending.items():
            try:
                reply = request.wait(max(deadline - time.monotonic(), 0.01))
            except NodeDown as exc:
                out[endpoint] = exc
                continue
            out[endpoint] = Error(f"node {endpoint}: {reply[0].get('message')}") if reply[0].get("error") else reply
        return out

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()

