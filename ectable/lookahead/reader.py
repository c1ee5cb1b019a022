"""The lookahead's reader: takes batches from the caller's iterable and prepares them ahead of the
trainer (their unique rows, their keys), in a thread of its own, so that this work overlaps the model."""
from __future__ import annotations

import queue
import threading

from ..errors import Unavailable

END = object()  # the iterable is exhausted


class Reader:
    """Prepared batches of `source`, at most `depth` ahead; `prepare(value)` runs in the reader's thread."""

    def __init__(self, source, prepare, depth: int):
        self._source, self._prepare = source, prepare
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ectable-lookahead-reader", daemon=True)
        self._thread.start()

    def take(self, wait: bool, timeout: float):
        """The next prepared batch, END, or None if none is ready and not `wait`; raises what reading or
        preparing it raised."""
        try:
            item, error = self._queue.get(wait, timeout if wait else None)
        except queue.Empty:
            if wait:
                raise Unavailable(f"the lookahead's batches did not come within {timeout:.0f} s") from None
            return None
        if error is not None:
            raise error
        return item

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            for value in self._source:
                if not self._put((self._prepare(value), None)):
                    return
            self._put((END, None))
        except BaseException as exc:  # noqa: BLE001 - raised to the trainer when it reaches this batch
            self._put((None, exc))

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False
