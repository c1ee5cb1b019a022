"""`python -m ectable.testing.sim [--code xor rs] [--seeds A:B | --seed N] [--ops N]`: run seeds, print
each failure with the command that replays it, and a summary; exit 1 if any seed failed."""
from __future__ import annotations

import argparse
import os
import sys
import time

from .scenario import run


def main(argv=None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order is part of a run: fix it
        os.execve(sys.executable, [sys.executable, "-m", "ectable.testing.sim", *(argv or sys.argv[1:])],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    parser = argparse.ArgumentParser(prog="python -m ectable.testing.sim", description=__doc__)
    parser.add_argument("--code", nargs="+", default=["xor", "rs"], choices=["xor", "rs"])
    parser.add_argument("--seeds", default="0:100", help="a range A:B of seeds (B excluded)")
    parser.add_argument("--seed", type=int, help="one seed (prints its whole outcome)")
    parser.add_argument("--trace", action="store_true", help="print every request, fault and decision (with --seed)")
    parser.add_argument("--ops", type=int, default=60, help="client requests per seed")
    args = parser.parse_args(argv)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first, last = (int(x) for x in args.seeds.split(":"))
        seeds = list(range(first, last))
    started, failed, runs, events, sim_seconds = time.monotonic(), [], 0, 0, 0.0
    totals: dict = {}
    for code in args.code:
        for seed in seeds:
            outcome = run(seed, code, args.ops, trace=args.trace)
            runs, events, sim_seconds = runs + 1, events + outcome.events, sim_seconds + outcome.sim_seconds
            for key, n in outcome.counts.items():
                totals[key] = totals.get(key, 0) + n
            if args.seed is not None:
                print(f"seed {seed} {code}: {'ok' if outcome.ok else 'FAILED'}; {outcome.shape}")
                print(f"  {outcome.events} events, {outcome.sim_seconds:.1f} simulated s, digest {outcome.digest}, "
                      f"{outcome.counts}")
            if not outcome.ok:
                failed.append(outcome)
                print(f"FAILED seed {seed} ({code}): {outcome.shape}\n{outcome.message}\n  replay: {outcome.replay}",
                      flush=True)
    print(f"{runs} seeds, {len(failed)} failed, {events} events, {sim_seconds:.0f} simulated s in "
          f"{time.monotonic() - started:.1f} s; {totals}")
    for outcome in failed:
        print(f"  replay: {outcome.replay}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
