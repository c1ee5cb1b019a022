"""The ZeroMQ transport: a DEALER per node on the client side, frames as in `codec`."""
from __future__ import annotations

import itertools
import time
from typing import Callable

import zmq

from ..errors import AuthenticationFailed, NodeDown
from . import codec
from .base import Channel, Pending, Resends

POLL = 0.05  # seconds between liveness checks while waiting
HWM = 1000
HANDSHAKE_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the handshake failed",
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the security mechanisms differ",
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the node refused this client's key"}
HANDSHAKE_TRIES = 3  # handshakes failed without detail, each on a fresh connection, that mean the keys do not fit


def make_socket(context: zmq.Context, kind: int, curve: dict | None = None, server: bool = False,
                immediate: bool = True) -> zmq.Socket:
    """A socket with ectable's options: LINGER 0, bounded queues, CURVE when keys are given (a [security]
    section: a server listens with the nodes' server pair, a client connects with its own pair).
    `immediate`: a DEALER refuses to queue for a peer it is not connected to (clients want to
    know at once; nodes sending deltas would rather queue them, in order, while connecting)."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if kind == zmq.DEALER and immediate:
        sock.setsockopt(zmq.IMMEDIATE, 1)
    if curve:
        if server:
            sock.curve_server = True
            sock.curve_secretkey = curve["server_secret"].encode()
            sock.curve_publickey = curve["server_public"].encode()
        else:
            sock.curve_serverkey = curve["server_public"].encode()
            sock.curve_secretkey = curve["secret"].encode()
            sock.curve_publickey = curve["public"].encode()
    return sock


def bind_to(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `sock` to `endpoint` (port 0: a free port) and return the endpoint it is bound to."""
    if endpoint.endswith(":0"):
        host = endpoint.rsplit(":", 1)[0]
        return f"{host}:{sock.bind_to_random_port(host)}"
    sock.bind(endpoint)
    return endpoint


def start_authenticator(context: zmq.Context, curve: dict | None):
    """With CURVE keys: a ZAP handler admitting only the listed keys of nodes, deciders and clients, which
    gives each message the sender's key as its "User-Id" (None without keys)."""
    if not curve:
        return None
    from zmq.auth.thread import ThreadAuthenticator
    auth = ThreadAuthenticator(context)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_Allowed([*curve["nodes"], *curve["deciders"], *curve["clients"]]))
    return auth


class _Allowed:
    """CURVE credentials: only the listed public keys may connect."""

    def __init__(self, keys):
        self.keys = {k.encode() if isinstance(k, str) else k for k in keys}

    def callback(self, domain, key):
        from zmq.utils import z85
        return z85.encode(key) in self.keys or key in self.keys


class ZmqChannel(Channel):
    """Requests to the node at `endpoint`; `alive()` (optional) lets a wait end early when the node died."""

    def __init__(self, endpoint: str, context: zmq.Context, curve: dict | None = None, alive: Callable | None = None,
                 connect_timeout: float = 5.0):
        self.endpoint, self._context, self._curve, self._alive = endpoint, context, curve, alive
        self.connect_timeout = connect_timeout
        self._ids = itertools.count(1)
        self._replies: dict[int, tuple] = {}
        self._waiting: set[int] = set()  # requests whose replies are still wanted
        self._sock = self._monitor = None
        self._failed_handshakes = 0

    def _socket(self):
        if self._sock is None:
            self._sock = make_socket(self._context, zmq.DEALER, self._curve)
            self._monitor = self._sock.get_monitor_socket(sum(HANDSHAKE_FAILED))
            self._sock.connect(self.endpoint)
        return self._sock

    def _check_handshake(self) -> None:
        """Raise `AuthenticationFailed` if the node refused this client's key or speaks another security
        mechanism. A handshake that failed without detail may be a node dying: the connection is made
        afresh (a dead node refuses it), and only HANDSHAKE_TRIES such failures in a row count."""
        from zmq.utils.monitor import recv_monitor_message
        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event not in HANDSHAKE_FAILED:
                continue
            failures = self._failed_handshakes + 1
            self._reset()
            if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and failures < HANDSHAKE_TRIES:
                self._failed_handshakes = failures  # the next _socket() connects again
                return
            has = "CURVE keys the node does not accept" if self._curve else "no CURVE keys"
            raise AuthenticationFailed(
                f"authentication with {self.endpoint} failed ({HANDSHAKE_FAILED[event]}): this client has "
                f"{has}; connect with the cluster file's [security] section (made by `ectable keygen`)")

    def start(self, header, arrays, again=True):
        """Send one request; while the node is not connected (IMMEDIATE refuses to queue), its wait sends it once
        it is, so that a node that is down holds up no request started after it."""
        rid = next(self._ids)
        frames = codec.encode({**header, "id": rid}, arrays)
        self._waiting.add(rid)
        try:
            self._socket().send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            sent = True
        except zmq.Again:
            sent = False
        return _ZmqPending(self, rid, frames, sent, again)

    def _send(self, frames) -> None:
        """Send a request once the node is connected; NodeDown if it is not within `connect_timeout`."""
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                self._socket().send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                self._check_handshake()
                if time.monotonic() > deadline or (self._alive and not self._alive()):
                    self._reset()
                    raise NodeDown(f"{self.endpoint} does not accept requests") from None
                time.sleep(0.005)

    def _wait(self, rid, frames, timeout, sent=True, again=True):
        try:
            if not sent:
                self._send(frames)
            now = time.monotonic()
            deadline, resends = now + timeout, Resends(now, frames, again)
            while rid not in self._replies:
                now = time.monotonic()
                left = deadline - now
                if self._alive and not self._alive():
                    self._reset()
                    raise NodeDown(f"{self.endpoint} died (it is no longer a live member) before it answered")
                if left <= 0:
                    self._check_handshake()
                    self._reset()
                    raise NodeDown(f"{self.endpoint} did not answer within {timeout} s")
                sock = self._socket()
                if resends.due(now):  # lost with a connection that broke, maybe: the node takes it twice alike
                    try:
                        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        pass  # not connected: the next resend, or the deadline
                if sock.poll(int(max(min(left, POLL, resends.at - now), 0.001) * 1000)):
                    try:
                        header, arrays = codec.decode(sock.recv_multipart(copy=False))
                    except codec.Malformed:
                        continue
                    if header.get("id") in self._waiting:  # a reply to a copy already answered is dropped
                        self._replies[header["id"]] = (header, arrays)
            return self._replies.pop(rid)
        finally:
            self._waiting.discard(rid)

    def _reset(self):
        """Forget the socket: late replies of a dead or slow node must not be read as new ones."""
        if self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(0)
            self._sock = self._monitor = None
        self._replies.clear()  # (requests still waited for keep their ids: their resends go out on the new socket)
        self._failed_handshakes = 0

    def close(self):
        self._reset()


class _ZmqPending(Pending):
    def __init__(self, channel, rid, frames, sent, again):
        self.channel, self.rid, self.frames, self.sent, self.again = channel, rid, frames, sent, again

    def wait(self, timeout):
        return self.channel._wait(self.rid, self.frames, timeout, self.sent, self.again)
