"""Workloads: the tables of a training run and the ids each iteration touches.

- `criteo` (SPEC section 5): 26 tables whose sizes spread log-uniformly from tens of rows to
  millions and add up to ~10M rows (`scale` multiplies them), dim 64, batches of 2048
  samples with one id per table, ids Zipf-skewed (exponent 1.1, hot rows scattered over the
  table by a multiplicative permutation) so that about 1% of rows take about 90% of accesses.
- `movielens`: MovieLens-100K's users and items tables (read from the `recbole==1.2.1`
  wheel, as in the demo), batches of 2048 ratings in a shuffled order, epoch after epoch.
- `zipf`: one table of 2M rows (`scale` multiplies it), batches of 20,000 Zipf ids.

    python -m bench.workloads [--scale 0.1]     # prints the measured skew and unique rows per batch
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from ectable.arrays import unique
from .common import report

TABLES, TOTAL_ROWS, BATCH, DIM, ALPHA = 26, 10_000_000, 2048, 64, 1.1
_PRIMES = (1_000_003, 998_244_353, 2_147_483_647, 4_294_967_291)


@dataclass
class Workload:
    """Tables ({name: rows}) and, per iteration, the ids touched in each ({name: ids})."""
    name: str
    sizes: dict
    batches: list

    def __post_init__(self):
        longest = max((ids.size for b in self.batches for ids in b.values()), default=1)
        self._pool = np.random.default_rng(3).standard_normal((longest, DIM)).astype(np.float32)

    def gradients(self, batch: dict) -> dict:
        """{table: (ids, gradients)} for one batch; gradients are views of one seeded array."""
        return {t: (ids, self._pool[:ids.size]) for t, ids in batch.items()}

    def ids_per_batch(self) -> float:
        return float(np.mean([sum(ids.size for ids in b.values()) for b in self.batches]))

    def unique_per_batch(self) -> float:
        return float(np.mean([sum(unique(ids).size for ids in b.values()) for b in self.batches]))

    def describe(self) -> str:
        return (f"{self.name}: {len(self.sizes)} table(s), {sum(self.sizes.values()):,} rows, dim {DIM}, "
                f"{self.ids_per_batch():,.0f} ids per batch ({self.unique_per_batch():,.0f} unique)")


def criteo_like_sizes(scale: float = 1.0, seed: int = 0) -> dict[str, int]:
    """{table name: rows}: 26 log-uniform sizes adding up to ~10M rows times `scale`."""
    rng = np.random.default_rng(seed)
    raw = np.exp(rng.uniform(math.log(10), math.log(4e6), TABLES))
    sizes = np.maximum(4, np.round(raw / raw.sum() * TOTAL_ROWS * scale)).astype(np.int64)
    return {f"c{i:02d}": int(n) for i, n in enumerate(sizes)}


def zipf_ids(rng, rows: int, n: int, alpha: float = ALPHA) -> np.ndarray:
    """`n` ids of a table of `rows` rows: Zipf ranks (continuous inverse CDF, truncated at `rows`)
    mapped to ids by a multiplicative permutation, so hot rows are spread over stripes and nodes."""
    u = rng.random(n)
    ranks = np.floor((1 + u * (rows ** (1 - alpha) - 1)) ** (1 / (1 - alpha))).astype(np.int64) - 1
    ranks = np.minimum(ranks, rows - 1)
    mult = next(p for p in _PRIMES if math.gcd(p, rows) == 1)
    return (ranks * (mult % rows) + 7) % rows


def criteo_like_batches(sizes: dict[str, int], batches: int, seed: int = 1, batch: int = BATCH):
    """`batches` batches: {table: ids} with one id per sample per table."""
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        yield {name: zipf_ids(rng, rows, batch) for name, rows in sizes.items()}


def criteo(iters: int, scale: float = 1.0, seed: int = 1) -> Workload:
    sizes = criteo_like_sizes(scale)
    return Workload(f"criteo-like x{scale:g}", sizes, list(criteo_like_batches(sizes, iters, seed)))


def movielens(iters: int, scale: float = 1.0, seed: int = 1) -> Workload:
    """MovieLens-100K's (user, item) pairs; `scale` is ignored (the data set has one size)."""
    from ectable.demo import movielens as ratings
    users, items, _, source = ratings()
    order = np.concatenate([np.random.default_rng(seed + e).permutation(users.size)
                            for e in range(-(-iters * BATCH // users.size))])
    batches = [{"users": users[order[i * BATCH:(i + 1) * BATCH]], "items": items[order[i * BATCH:(i + 1) * BATCH]]}
               for i in range(iters)]
    name = "movielens-100k" if source.startswith("MovieLens") else "movielens-shaped synthetic"
    return Workload(name, {"users": int(users.max()) + 1, "items": int(items.max()) + 1}, batches)


def zipf(iters: int, scale: float = 1.0, seed: int = 0, per_batch: int = 20_000) -> Workload:
    rows = int(2_000_000 * scale)
    rng = np.random.default_rng(seed)
    return Workload(f"zipf 1 table x{scale:g}", {"t": rows},
                    [{"t": (rng.zipf(ALPHA, per_batch) - 1) % rows} for _ in range(iters)])


WORKLOADS = {"criteo": criteo, "movielens": movielens, "zipf": zipf}


def profile_args(description: str | None = None) -> argparse.Namespace:
    """The options of the per-iteration profiles (`node_time`, `client_time`): workload, scale, iterations, runs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", default="criteo", choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2)
    return parser.parse_args()


def measure(sizes: dict[str, int], batches: int = 200, seed: int = 1) -> dict:
    """Measured skew (share of accesses that went to the hottest 1% of all rows) and unique rows per batch."""
    counts = {name: np.zeros(rows, dtype=np.int64) for name, rows in sizes.items()}
    per_batch = []
    for b in criteo_like_batches(sizes, batches, seed):
        per_batch.append(sum(unique(ids).size for ids in b.values()))
        for name, ids in b.items():
            np.add.at(counts[name], ids, 1)
    allc = np.sort(np.concatenate(list(counts.values())))[::-1]
    top = max(1, allc.size // 100)
    return {"rows": int(allc.size), "top1pct_share": float(allc[:top].sum() / allc.sum()),
            "unique_rows_per_batch": float(np.mean(per_batch)),
            "unique_rows_per_table_batch": float(np.mean(per_batch) / len(sizes))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    sizes = criteo_like_sizes(args.scale)
    m = measure(sizes, args.batches)
    print(f"criteo-like at scale {args.scale}: {len(sizes)} tables, {m['rows']:,} rows "
          f"(smallest {min(sizes.values())}, largest {max(sizes.values()):,}), batches of {BATCH} samples")
    ml = movielens(49)
    out = [["rows", m["rows"]], ["share of accesses to the hottest 1% of rows", round(m["top1pct_share"], 3)],
           ["unique rows per batch (all tables)", round(m["unique_rows_per_batch"])],
           ["unique rows per table per batch", round(m["unique_rows_per_table_batch"])],
           [f"{ml.name}: rows (users + items)", sum(ml.sizes.values())],
           [f"{ml.name}: unique rows per batch of {BATCH} ratings", round(ml.unique_per_batch())]]
    report("workload_criteo_like", ["measure", "value"], out, {"sizes": sizes, "batches": args.batches, "scale": args.scale})


if __name__ == "__main__":
    main()
