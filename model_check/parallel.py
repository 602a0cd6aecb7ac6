"""Random mode across worker processes.

``--workers K`` in random mode runs K independent seeded walks in K processes (seed
strings ``"<seed>/<index>"``) and merges their counts in worker order, so the output
depends only on the seed and K. Workers receive the canonical command line (plain
strings) and rebuild the model themselves; no model state crosses a process boundary.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from model_check.explore import Result, simulate
from model_check.model import Move, Violation


def random_worker(job: tuple[list[str], int, int, int]) -> dict[str, Any]:
    """One worker: rebuild the model from ``argv`` and walk ``steps`` moves."""
    from model_check.__main__ import _parser, build_config

    argv, seed, index, steps = job
    cfg, _ = build_config(_parser().parse_args(argv))
    r = simulate(cfg, seed=f"{seed}/{index}", steps=steps)
    return {
        "index": index,
        "states": r.states,
        "unique": r.unique,
        "depth": r.depth,
        "episodes": r.episodes,
        "ends": list(r.ends),
        "settle_moves": r.settle_moves,
        "violation": None if r.violation is None else [r.violation.name, r.violation.message],
        "moves": [[m.kind, m.slot] for m in r.path],
    }


def run_random(steps: int, workers: int, seed: int, argv: list[str]) -> Result:
    per = [steps // workers + (1 if i < steps % workers else 0) for i in range(workers)]
    jobs = [([*argv, "--mode=random"], seed, i, per[i]) for i in range(workers)]
    start = time.monotonic()
    if workers == 1:
        outs = [random_worker(jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            outs = pool.map(random_worker, jobs)
    merged = Result()
    for o in sorted(outs, key=lambda d: int(d["index"])):
        merged.states += o["states"]
        merged.unique += o["unique"]
        merged.depth = max(merged.depth, o["depth"])
        merged.episodes += o["episodes"]
        merged.ends = (merged.ends[0] + o["ends"][0], merged.ends[1] + o["ends"][1])
        merged.settle_moves = max(merged.settle_moves, o["settle_moves"])
        if merged.violation is None and o["violation"] is not None:
            merged.violation = Violation(*o["violation"])
            merged.path = [Move(k, s) for k, s in o["moves"]]
    merged.seconds = time.monotonic() - start
    return merged
