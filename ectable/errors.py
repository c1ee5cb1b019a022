"""The exceptions ectable raises: every one is an `Error`."""


class Error(Exception):
    """Base class of every ectable error."""


class InvalidRequest(Error, ValueError):
    """A request was malformed; it changed nothing."""


class AuthenticationFailed(Error):
    """A node refused this process's connection: missing or wrong CURVE keys."""


class Unavailable(Error):
    """Rows cannot be served: more than r slots of their stripe are lost."""


class WritesLost(Error):
    """Writes this client made, acknowledged, are gone: raised once, by its first call after it learned so.
    `rows`: {table: ids} whose rows hold what they held before those writes (write them again)."""

    def __init__(self, message: str, rows: dict | None = None):
        super().__init__(message)
        self.rows = rows or {}


class NodeDown(Error):
    """A node did not answer; the caller may fail over. `position`: which node, where known."""

    position: int | None = None


class StaleCut(Error):
    """Rebuilt parity rows were refused: deltas moved on after their data was read (read again), or,
    with `behind`, deltas the data holds have not reached the node yet (send again shortly)."""

    behind = False


class Replaced(Error):
    """A degraded write met a parity holder that knows the dead position has a replacement (write to it)."""


class HandingOver(Error):
    """The node hands its position over to another (a drain): the map moves it within seconds (retry)."""


class Replaying(Error):
    """A replacement node holds client requests until every writer replayed into it (retry shortly)."""
