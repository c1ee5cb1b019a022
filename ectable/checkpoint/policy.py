"""Which rows each checkpoint writes, which checkpoints a restore reads, which can be deleted (Check-N-Run's
policies), as pure functions of the checkpoints taken so far.

- `full`: every row, every time.
- `incremental` (consecutive): the rows modified since the previous checkpoint; the first is full.
  A restore reads the one before it as it would be restored, then it.
- `differential`: the rows modified since the last full one (the baseline); the first is full. A
  restore reads the baseline and the last differential one.
- `intermittent`: differential, with a new full baseline whenever the next differential one is
  estimated to hold `threshold` of the rows a full one would or more (so a restore never reads
  much more than 1 + `threshold` full checkpoints). The estimate follows the history and errs
  high, so the baseline comes one checkpoint before the threshold is crossed, not one after. If
  each interval between checkpoints touches row i with some probability p_i, the same in every
  interval, the share c_k of rows a differential holds after k intervals grows by less each
  time (c_{k+1} - c_k = mean(p (1 - p)^k) shrinks with k), so:
  after two or more differentials, the last one's rows plus its growth over the one before;
  after one, holding share c of a full one's rows, 2c - c^2 of them (the growth if every row
  were equally likely, the most it can be: c_2 = 2 c_1 - mean(p^2) and mean(p^2) >= c_1^2).
  The shares are of the rows a full checkpoint holds, which is every row once each has been
  written (after a first epoch); before that, a full one holds only the rows written so far,
  that number grows, and the estimate may come out low.

A checkpoint is described by a `Taken` record: its number, its kind ("full", "incremental",
"differential"), the rows it wrote and the rows a full one would have written.
"""
from __future__ import annotations

from typing import NamedTuple

from ..errors import InvalidRequest

POLICIES = ("full", "incremental", "differential", "intermittent")
KINDS = ("full", "incremental", "differential")


class Taken(NamedTuple):
    """A checkpoint taken: its number (ascending), kind, rows written, and rows of a full one then."""

    number: int
    kind: str
    rows: int
    total: int


class Policy(NamedTuple):
    """A policy by name, with the threshold of `intermittent` (share of a full checkpoint's rows)."""

    name: str = "intermittent"
    threshold: float = 0.5

    def get_config(self) -> dict:
        return {"name": self.name, "threshold": self.threshold}

    @classmethod
    def from_config(cls, config) -> "Policy":
        """A policy from its config dict or name; InvalidRequest naming what is wrong."""
        if isinstance(config, str):
            config = {"name": config}
        if not isinstance(config, dict) or set(config) - {"name", "threshold"}:
            raise InvalidRequest(f"a checkpoint policy is a name or {{name, threshold}}, got {config!r}")
        policy = cls(**config)
        if policy.name not in POLICIES:
            raise InvalidRequest(f"checkpoint policy must be one of {POLICIES}, got {policy.name!r}")
        if isinstance(policy.threshold, bool) or not isinstance(policy.threshold, (int, float)) \
                or not 0 < policy.threshold <= 1:
            raise InvalidRequest(f"an intermittent policy's threshold is a share in (0, 1], got {policy.threshold!r}")
        return policy


def next_kind(policy: Policy, taken: list[Taken]) -> str:
    """The kind of the next checkpoint under `policy`, after the checkpoints `taken` (oldest first)."""
    if policy.name == "full" or not taken:
        return "full"
    if policy.name == "incremental":
        return "incremental"
    if policy.name == "differential":
        return "differential"
    estimate = next_differential(taken)
    if estimate is None:
        return "differential"
    return "full" if estimate >= policy.threshold * taken[-1].total else "differential"


def next_differential(taken: list[Taken]) -> float | None:
    """The rows the next differential checkpoint is estimated to hold at most (see `intermittent`), or None
    if none has been taken since the last full one."""
    diffs = [t for t in _since_baseline(taken) if t.kind == "differential"]
    if not diffs:
        return None
    last, total = diffs[-1].rows, diffs[-1].total
    if len(diffs) > 1:
        return last + max(last - diffs[-2].rows, 0)
    return 2 * last - last * last / total if total else 2 * last


def restore_chain(taken: list[Taken], number: int | None = None) -> list[Taken]:
    """The checkpoints a restore to checkpoint `number` (default: the last) reads, in the order to apply
    them; InvalidRequest if there is no such checkpoint or no full one before it."""
    at = len(taken) - 1 if number is None else next((n for n, t in enumerate(taken) if t.number == number), -1)
    if at < 0:
        raise InvalidRequest(f"no checkpoint {'at all' if number is None else number} to restore")
    chain = [taken[at]]
    while chain[0].kind != "full":  # an incremental one needs the one before; a differential one, its baseline
        kind = chain[0].kind
        at = at - 1 if kind == "incremental" else max((n for n in range(at) if taken[n].kind == "full"), default=-1)
        if at < 0:
            raise InvalidRequest(f"checkpoint {chain[-1].number} has no full checkpoint before it")
        chain.insert(0, taken[at])
    return chain


def deletable(taken: list[Taken], keep: int) -> list[Taken]:
    """The checkpoints that no restore to any of the last `keep` checkpoints reads (oldest first)."""
    if keep < 1:
        raise InvalidRequest(f"keep at least one checkpoint, got keep={keep!r}")
    needed = {t.number for kept in taken[-keep:] for t in restore_chain(taken, kept.number)}
    return [t for t in taken if t.number not in needed]


def _since_baseline(taken: list[Taken]) -> list[Taken]:
    """The last full checkpoint and every one after it (all of them if none is full)."""
    start = max((n for n, t in enumerate(taken) if t.kind == "full"), default=0)
    return taken[start:]
