"""The watch stream of the etcd backend: one thread per watch reading the v3 gateway's `/watch`
stream, reconnecting from the next revision when the stream breaks; and the JSON codec helpers."""
from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import requests

from .base import Compacted, Event, KeyValue, MembershipUnavailable, Watch

log = logging.getLogger(__name__)


def b64(data: str | bytes) -> str:
    """The gateway's encoding of a key or value (keys are UTF-8)."""
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_range(prefix: str) -> tuple[str, str]:
    """(key, range_end), base64, of every key starting with `prefix` (the empty prefix: every key)."""
    end = bytearray(prefix.encode())
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b64(prefix.encode() or b"\0"), b64(b"\0")
    end[-1] += 1
    return b64(prefix), b64(bytes(end))


def parse_kv(kv: dict[str, Any]) -> KeyValue:
    return KeyValue(unb64(kv["key"]).decode(), unb64(kv.get("value", "")), int(kv.get("mod_revision", 0)),
                    int(kv.get("create_revision", 0)), int(kv.get("version", 0)), int(kv.get("lease", 0)))


def parse_event(event: dict[str, Any]) -> Event:
    kv = event["kv"]
    deleted = event.get("type") == "DELETE"
    return Event("delete" if deleted else "put", unb64(kv["key"]).decode(),
                 b"" if deleted else unb64(kv.get("value", "")), int(kv["mod_revision"]))


def _messages(response: requests.Response) -> Iterator[dict[str, Any]]:
    """The stream's JSON messages, one a line (a message may span HTTP chunks, or share one)."""
    buffer = b""
    for chunk in response.iter_content(chunk_size=None):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


class EtcdWatch(Watch):
    """A watch on etcd: created (and its first stream opened) by the constructor, then read by a thread."""

    def __init__(self, urls: Sequence[str], prefix: str, callback: Callable[[list[Event]], None],
                 start_revision: int | None, timeout: float):
        self._urls, self._url_index = list(urls), 0
        self._range = prefix_range(prefix)
        self._prefix, self._callback, self._timeout = prefix, callback, timeout
        self._next = start_revision if start_revision and start_revision > 0 else None
        self._stop = threading.Event()
        self._calling = threading.Lock()  # held while the callback runs
        self._guard = threading.Lock()  # guards _response
        self._response: requests.Response | None = None
        self._session = requests.Session()
        self._session.trust_env = False  # 127.0.0.1 is never reached through a proxy
        try:
            stream = self._first_open()
        except BaseException:
            self._session.close()
            raise
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True, name=f"etcd-watch {prefix!r}")
        self._thread.start()

    @property
    def stopped(self) -> bool:
        """Cancelled, or ended by the backend (see `error`)."""
        return self._stop.is_set()

    def cancel(self) -> None:
        self._stop.set()
        with self._guard:
            response = self._response
        if response is not None:
            _shutdown(response)
        if threading.current_thread() is not self._thread:
            self._thread.join(self._timeout + 1.0)
            with self._calling:  # a callback still running finishes first
                pass

    def _first_open(self) -> Iterator[dict[str, Any]]:
        """`_open` on each endpoint in turn while the timeout lasts."""
        deadline = time.monotonic() + self._timeout
        for attempt in range(1, len(self._urls) + 1):
            try:
                return self._open()
            except MembershipUnavailable:
                if attempt == len(self._urls) or time.monotonic() >= deadline:
                    raise
        raise MembershipUnavailable("no etcd endpoint")

    def _open(self) -> Iterator[dict[str, Any]]:
        """Create the watch on etcd from `_next` on; its message stream (raises MembershipUnavailable)."""
        key, end = self._range
        create: dict[str, Any] = {"key": key, "range_end": end, "progress_notify": True}
        if self._next is not None:
            create["start_revision"] = self._next
        url = self._urls[self._url_index % len(self._urls)]
        try:
            response = self._session.post(url, json={"create_request": create}, stream=True,
                                          timeout=(self._timeout, self._timeout))
        except requests.RequestException as e:
            self._url_index += 1
            raise MembershipUnavailable(f"cannot watch at {url}: {e}") from e
        try:
            if response.status_code != 200:
                raise MembershipUnavailable(f"watch refused at {url}: {response.status_code} {response.text[:200]}")
            stream = _messages(response)
            first = next(stream).get("result", {})
            if not first.get("created"):
                raise MembershipUnavailable(f"watch not created at {url}: {first}")
            if self._next is None:
                self._next = int(first["header"]["revision"]) + 1
            response.raw.connection.sock.settimeout(None)  # from now on the stream may stay quiet
        except (requests.RequestException, StopIteration, ValueError, AttributeError, OSError) as e:
            response.close()
            self._url_index += 1
            raise MembershipUnavailable(f"watch not created at {url}: {e!r}") from e
        except BaseException:
            response.close()
            raise
        with self._guard:
            if self._stop.is_set():
                response.close()
                raise MembershipUnavailable("watch cancelled")
            self._response = response
        return stream

    def _run(self, stream: Iterator[dict[str, Any]] | None) -> None:
        backoff = 0.05
        try:
            while not self._stop.is_set():
                if stream is None:
                    try:
                        stream = self._open()
                        backoff = 0.05
                    except MembershipUnavailable:
                        self._stop.wait(backoff)
                        backoff = min(1.0, backoff * 2)
                        continue
                try:
                    for message in stream:
                        if not self._handle(message):
                            break
                        backoff = 0.05  # the stream works
                except (requests.RequestException, ValueError, OSError):
                    pass  # the stream broke: open it again from the next revision
                stream = None
                with self._guard:
                    response, self._response = self._response, None
                if response is not None:
                    response.close()
                self._stop.wait(backoff)
                backoff = min(1.0, backoff * 2)
        finally:
            self._session.close()

    def _handle(self, message: dict[str, Any]) -> bool:
        """Deliver one message's events; False to reopen the stream (or stop, with `error` set)."""
        result = message.get("result")
        if result is None:
            return False  # {"error": ...}, e.g. no leader: reconnect
        if result.get("canceled"):
            compacted = int(result.get("compact_revision", 0))
            if compacted:
                self.error = Compacted(f"watch on {self._prefix!r} lost revisions before {compacted}", compacted)
            else:
                self.error = MembershipUnavailable(f"etcd ended the watch: {result.get('cancel_reason', '')}")
            self._stop.set()
            return False
        assert self._next is not None
        events = [e for e in map(parse_event, result.get("events", ())) if e.mod_revision >= self._next]
        if not events:
            if "events" not in result and not result.get("created"):  # a progress notification: caught up
                self._next = max(self._next, int(result["header"]["revision"]) + 1)
            return True
        with self._calling:
            if self._stop.is_set():
                return False
            self._next = events[-1].mod_revision + 1
            try:
                self._callback(events)
            except Exception:  # the owner's bug: keep watching
                log.exception("watch callback on %r failed", self._prefix)
        return True


def _shutdown(response: requests.Response) -> None:
    """Wake the thread blocked reading `response`'s socket."""
    try:
        response.raw.connection.sock.shutdown(socket.SHUT_RDWR)
    except (AttributeError, OSError):
        pass
