"""``make simulate``: run many seeds of the simulated world on every core, and report.

    python tests/simulation/run.py --seeds 2000              # the suite's world
    python tests/simulation/run.py --seeds 2000 --all-features  # + issue 27's classes
    python tests/simulation/run.py --seed 0 --all-features --story  # replay one, shrunk

Prints a progress line, then runs/s, steps explored, the (state, transition) pairs of the
transition table covered, the drive's decision points seen, and each class of broken
invariant found: how many runs broke it, the first seed, and its shrunk story.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulation._shrink import shrink
from simulation._world import TRANSITION_PAIRS, Features, RunResult, run_world


def _features(arguments: argparse.Namespace) -> Features:
    if arguments.all_features:
        return Features.everything()
    return Features(
        changed_code=arguments.changed_code,
        per_request_credentials=arguments.per_request_credentials,
        exclusive_orders=arguments.exclusive_orders,
        sdk_keys_honoured=arguments.sdk_keys_honoured,
        new_reference_on_rerun=arguments.broken_shop,
        kinds=tuple(arguments.kinds.split(",")) if arguments.kinds else (),
    )


def _one(job: tuple[int, Features, int]) -> dict[str, Any]:
    seed, features, steps = job
    result = run_world(seed, features, steps=steps)
    return {
        "seed": seed,
        "steps": len(result.choices),
        "violations": [(f"invariant {v.invariant}: {v.kind}", str(v)) for v in result.violations],
        "pairs": result.pairs,
        "decisions": result.decisions,
    }


def _story(result: RunResult, *, verbose: bool = False) -> str:
    """The run's story; without ``verbose``, the boundaries a process merely went on from
    and its clock reads (``HEAD /``) are left out: a crash line says where it stood."""
    lines = [
        line
        for line in result.story
        if verbose or ("HEAD /" not in line and " goes on (" not in line)
    ]
    return "\n".join(f"    {line}" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=500, help="how many seeds (default 500)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--steps", type=int, default=60, help="scheduler steps per run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--all-features", action="store_true")
    parser.add_argument("--changed-code", action="store_true")
    parser.add_argument("--per-request-credentials", action="store_true")
    parser.add_argument(
        "--exclusive-orders", action="store_true", help="one live process per order at a time"
    )
    parser.add_argument(
        "--sdk-keys-honoured", action="store_true", help="SDK code whose uuid4 keys are kept"
    )
    parser.add_argument(
        "--broken-shop",
        action="store_true",
        help="a deliberately broken shop: a run again opens its intent under another reference",
    )
    parser.add_argument("--kinds", help="only these order kinds, comma-separated")
    parser.add_argument("--backend", choices=["sqlite"], default="sqlite")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--story", action="store_true", help="print the (shrunk) story")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--shrink-budget", type=int, default=200, help="replays per shrink")
    parser.add_argument("--verbose", action="store_true", help="every boundary in stories")
    arguments = parser.parse_args(argv)
    logging.getLogger("payonce").setLevel(logging.CRITICAL)
    features = _features(arguments)

    if arguments.seed is not None:
        result = run_world(arguments.seed, features, steps=arguments.steps)
        print(f"seed {arguments.seed}: {len(result.choices)} choices, ", end="")
        print(f"{len(result.violations)} violation(s)")
        for violation in result.violations:
            print(f"  {violation}")
        if result.failed and not arguments.no_shrink:
            result = shrink(result, budget=arguments.shrink_budget)
            print(f"shrunk to {len(result.choices)} choices: {result.choices}")
        if arguments.story:
            print(_story(result, verbose=arguments.verbose))
        return 1 if result.failed else 0

    jobs = [
        (seed, features, arguments.steps)
        for seed in range(arguments.first, arguments.first + arguments.seeds)
    ]
    started = time.perf_counter()
    steps = 0
    pairs: set[tuple[str | None, str]] = set()
    decisions: set[str] = set()
    found: Counter[str] = Counter()
    first: dict[str, tuple[int, str]] = {}
    with multiprocessing.Pool(arguments.jobs) as pool:
        for done, outcome in enumerate(pool.imap_unordered(_one, jobs, chunksize=4), 1):
            steps += outcome["steps"]
            pairs |= outcome["pairs"]
            decisions |= outcome["decisions"]
            for kind, words in outcome["violations"]:
                found[kind] += 1
                if kind not in first or outcome["seed"] < first[kind][0]:
                    first[kind] = (outcome["seed"], words)
            elapsed = time.perf_counter() - started
            print(
                f"\r{done}/{len(jobs)} runs, {done / elapsed:.1f} runs/s, {steps} steps, "
                f"{sum(found.values())} broken",
                end="",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.perf_counter() - started
    print(file=sys.stderr)
    covered = pairs & TRANSITION_PAIRS
    rate = len(jobs) / elapsed
    print(f"runs: {len(jobs)} in {elapsed:.1f} s ({rate:.1f} runs/s, {arguments.jobs} processes)")
    print(f"steps explored: {steps} scheduler choices")
    print(f"(state, transition) pairs covered: {len(covered)} of {len(TRANSITION_PAIRS)}")
    missing = sorted(TRANSITION_PAIRS - covered, key=str)
    named = [f"{state or 'new'} --{transition}" for state, transition in missing]
    print(f"  not covered: {', '.join(named)}")
    print(f"decision points seen (drive commands, by transition): {len(decisions)}")
    if not found:
        print("no invariant broken")
        return 0
    print("broken invariants, by class:")
    for kind, count in found.most_common():
        seed, words = first[kind]
        print(f"- {kind}: {count} of {len(jobs)} runs; first at seed {seed}")
        print(f"  {words}")
        if not arguments.no_shrink:
            failed = run_world(seed, features, steps=arguments.steps)
            shrunk = shrink(failed, budget=arguments.shrink_budget)
            print(f"  shrunk to {len(shrunk.choices)} choices (replay: --seed {seed} --story):")
            print(_story(shrunk, verbose=arguments.verbose))
    return 1


if __name__ == "__main__":
    sys.exit(main())
