"""`EtcdMembership`: the membership store on etcd, through its v3 HTTP/JSON gateway (`etcd3gw`).

Every request has the store's `timeout`; a request that cannot reach one endpoint moves on to the
next while the timeout lasts (a `txn` only when it surely was not sent). With several endpoints each
gets its share of the timeout (at least 1 s), so that a member cut off from the network costs a
keep-alive less than a lease's time. Leases are whole seconds.
"""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, Sequence, TypeVar

import etcd3gw
import requests
from etcd3gw import exceptions as etcd_errors
from etcd3gw.lease import Lease
from urllib3.exceptions import ConnectTimeoutError

from ..errors import InvalidRequest
from .base import (Compacted, Compare, Delete, Event, KeyValue, LeaseNotFound, Membership, MembershipUnavailable, Op,
                   Put, Watch, check_txn)
from .etcd_watch import EtcdWatch, b64, parse_kv, prefix_range

T = TypeVar("T")
_TARGETS = {"mod": ("MOD", "mod_revision"), "create": ("CREATE", "create_revision"),
            "version": ("VERSION", "version"), "value": ("VALUE", "value")}


class EtcdMembership(Membership):
    """A client of the etcd cluster at `endpoints` ("http://127.0.0.1:2379", ...)."""

    min_ttl = 1.0  # etcd leases are whole seconds; raised to what the server grants when it enforces more

    def __init__(self, endpoints: Sequence[str], timeout: float = 5.0):
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints, self.timeout = list(endpoints), timeout
        self._clients = [self._client(e) for e in self.endpoints]
        self._current = 0
        self._lock = threading.Lock()
        self._watches: list[EtcdWatch] = []

    def _client(self, endpoint: str) -> etcd3gw.client.Etcd3Client:
        url = urllib.parse.urlsplit(endpoint)
        session = requests.Session()
        session.trust_env = False  # never through a proxy
        attempt = self.timeout if len(self.endpoints) == 1 else max(1.0, self.timeout / len(self.endpoints))
        return etcd3gw.client(host=url.hostname or "127.0.0.1", port=url.port or 2379, protocol=url.scheme or "http",
                              timeout=attempt, api_path="/v3/", session=session)

    def _call(self, request: Callable[[Any], T], resend: bool = True) -> T:
        """`request(client)` on the current endpoint, then the others while the timeout lasts."""
        deadline = time.monotonic() + self.timeout
        error: Exception | None = None
        for attempt in range(len(self._clients)):
            i = (self._current + attempt) % len(self._clients)
            try:
                result = request(self._clients[i])
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError,
                    requests.RequestException, KeyError) as e:
                error = e
                if (not resend and not _unsent(e)) or time.monotonic() >= deadline:
                    break
                continue
            except etcd_errors.Etcd3Exception as e:
                raise _translate(e) from e
            self._current = i
            return result
        self._current = (self._current + 1) % len(self._clients)
        raise MembershipUnavailable(f"etcd at {self.endpoints} did not answer: {error!r}") from error

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(lambda c: c.post(c.get_url(path), json=body))

    # --- reads ---
    def get(self, key: str) -> KeyValue | None:
        if not key:
            raise InvalidRequest("empty key")
        kvs = self._post("/kv/range", {"key": b64(key)}).get("kvs", [])
        return parse_kv(kvs[0]) if kvs else None

    def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        key, end = prefix_range(prefix)
        reply = self._post("/kv/range", {"key": key, "range_end": end})
        kvs = sorted((parse_kv(kv) for kv in reply.get("kvs", [])), key=lambda kv: kv.key)
        return kvs, int(reply["header"]["revision"])

    # --- writes ---
    def txn(self, compare: Sequence[Compare], success: Iterable[Op], failure: Iterable[Op] = ()) -> tuple[bool, int]:
        success, failure = list(success), list(failure)
        check_txn(compare, success, failure)
        body = {"compare": [_compare(c) for c in compare], "success": [_op(op) for op in success],
                "failure": [_op(op) for op in failure]}
        reply = self._call(lambda c: c.transaction(body), resend=False)
        return bool(reply.get("succeeded", False)), int(reply["header"]["revision"])

    # --- leases ---
    def grant(self, ttl: float) -> int:
        want = max(1, math.ceil(ttl), math.ceil(self.min_ttl))
        reply = self._post("/lease/grant", {"TTL": want, "ID": 0})  # as etcd3gw's lease(), keeping the TTL granted
        granted = int(reply.get("TTL", want))
        if granted > want:
            self.min_ttl = float(granted)  # the server's minimum (it depends on its election timeout)
        return int(reply["ID"])

    def keepalive(self, lease: int) -> bool:
        return self._call(lambda c: Lease(lease, c).refresh()) > 0  # -1: expired or unknown

    def revoke(self, lease: int) -> None:
        try:
            self._call(lambda c: Lease(lease, c).revoke())
        except LeaseNotFound:
            pass

    # --- watches ---
    def watch(self, prefix: str, callback: Callable[[list[Event]], None], start_revision: int | None = None) -> Watch:
        if start_revision is not None and start_revision > 0:
            key, end = prefix_range(prefix)
            try:  # a compacted start is refused here, not later on the watch's thread
                self._post("/kv/range", {"key": key, "range_end": end, "revision": start_revision, "count_only": True})
            except InvalidRequest:
                pass  # a future revision: the watch waits for it
        order = self._clients[self._current:] + self._clients[:self._current]
        w = EtcdWatch([c.get_url("/watch") for c in order], prefix, callback, start_revision, self.timeout)
        with self._lock:
            self._watches = [x for x in self._watches if not x.stopped] + [w]
        return w

    def close(self) -> None:
        with self._lock:
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancel()
        for c in self._clients:
            c.session.close()


def _compare(c: Compare) -> dict[str, Any]:
    target, field = _TARGETS[c.target]
    value = b64(c.value) if isinstance(c.value, bytes) else c.value
    return {"key": b64(c.key), "result": "EQUAL", "target": target, field: value}


def _op(op: Op) -> dict[str, Any]:
    if isinstance(op, Put):
        put: dict[str, Any] = {"key": b64(op.key), "value": b64(op.value)}
        if op.lease:
            put["lease"] = op.lease
        return {"request_put": put}
    assert isinstance(op, Delete)
    if op.prefix:
        key, end = prefix_range(op.key)
        return {"request_delete_range": {"key": key, "range_end": end}}
    return {"request_delete_range": {"key": b64(op.key)}}


def _translate(e: etcd_errors.Etcd3Exception) -> Exception:
    """The membership error for an error etcd answered with."""
    try:
        detail = json.loads(e.detail_text or "{}")
    except ValueError:
        detail = {}
    message, code = str(detail.get("message", e.detail_text)), detail.get("code")
    if "lease not found" in message:
        return LeaseNotFound(message)
    if "compacted" in message:
        return Compacted(message)
    if code in (3, 11):  # InvalidArgument, OutOfRange (a future revision)
        return InvalidRequest(message)
    return MembershipUnavailable(f"etcd: {message}")


def _unsent(e: BaseException | None) -> bool:
    """Whether `e` says the connection was never made (so the request surely was not applied)."""
    while e is not None:
        if isinstance(e, ConnectTimeoutError) or isinstance(getattr(e, "reason", None), ConnectTimeoutError):
            return True
        nested = e.args[0] if e.args and isinstance(e.args[0], BaseException) else None
        e = e.__cause__ or e.__context__ or nested
    return False
