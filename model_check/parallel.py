"""Random mode across worker processes.

``--workers K`` in random mode runs K independent seeded walks in K processes (seed
strings ``"<seed>/<index>"``) and merges their counts in worker order, so the output
depends only on the seed and K. Workers receive the canonical command line (plain
strings) and rebuild the model themselves; no model state crosses a process boundary,
and each walk's result comes back as one JSON document over its own pipe.

The parent waits for two kinds of event per walk, its result and its process's exit,
so it notices a walk whose process dies (the OOM killer's SIGKILL, ``os._exit``, a
crash) instead of waiting for a result that will never come: the run then stops every
other walk and ends with :class:`WorkerDied` (exit code 2, one line on stderr naming
the walk, its seed and how it died).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from model_check.explore import Result, simulate
from model_check.options import _parser, build_config, progress_line
from model_check.world import Move, Violation

Job = tuple[list[str], int, int, int]
"""``(argv, seed, index, steps)``: what one walk needs, all plain values."""

KILL_WALK_ENV = "MODEL_CHECK_TEST_KILL_WALK"
"""Test-only hook: when this environment variable holds a walk's index, that walk's
worker process kills itself with SIGKILL before walking, as the OOM killer would. Read
only in a worker process (never with ``--workers 1``, which walks in the CLI's own
process), so it cannot take the CLI down."""
STOP_GRACE_SECONDS = 5.0
"""How long a walk still running after another one died gets to exit after SIGTERM,
before it is sent SIGKILL (and then again to be reaped)."""
WORKER_DIED_EXIT = 2
"""The CLI's exit code when a walk's process died: the run could not be carried out as
asked (like a missing z3 for ``prove``), and it has no verdict."""


class WorkerDied(SystemExit):
    """A walk's process ended without sending its result; no verdict was reached.

    A ``SystemExit`` with code :data:`WORKER_DIED_EXIT`: :func:`run_random` prints the
    one-line error on stderr before raising it, so the CLI exits without a traceback
    whether it runs as ``python -m model_check`` or as ``rdzv-check``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(WORKER_DIED_EXIT)
        self.message = message


def random_worker(job: Job) -> dict[str, Any]:
    """One worker: rebuild the model from ``argv`` and walk ``steps`` moves, printing
    progress lines on stderr (prefixed ``walk=<index>``) unless ``argv`` has ``--quiet``."""
    argv, seed, index, steps = job
    ns = _parser().parse_args(argv)
    cfg, _ = build_config(ns)

    def progress(stats: dict[str, float]) -> None:
        progress_line({"walk": index, **stats})

    r = simulate(cfg, seed=f"{seed}/{index}", steps=steps, progress=None if ns.quiet else progress)
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


def _walk_in_child(job: Job, out: Connection) -> None:
    """A worker process's entry point: walk, then send the result as JSON bytes."""
    if os.environ.get(KILL_WALK_ENV) == str(job[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    result = random_worker(job)
    out.send_bytes(json.dumps(result, sort_keys=True).encode("utf-8"))
    out.close()


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            return f"was killed by {name} (the kernel's OOM killer sends it when memory runs out)"
        return f"was killed by {name}"
    return (
        f"exited with code {exitcode} without a result (a Python error in the walk prints "
        "its traceback on stderr above)"
    )


def _stop(procs: list[BaseProcess]) -> None:
    """End every process still running: SIGTERM, then SIGKILL after the grace period."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()  # cannot be caught: the process ends at once
            proc.join(STOP_GRACE_SECONDS)


def _receive(conn: Connection) -> dict[str, Any] | None:
    """The walk's result, or None when its process closed the pipe without one."""
    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        return None
    finally:
        conn.close()
    doc = json.loads(data)
    assert isinstance(doc, dict)
    return doc


def _run_processes(jobs: list[Job], seed: int) -> list[dict[str, Any]]:
    """Walk every job in its own spawned process; their results, in job order."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    readers: list[Connection] = []
    try:
        for job in jobs:
            reader, writer = ctx.Pipe(duplex=False)
            try:
                proc = ctx.Process(
                    target=_walk_in_child,
                    args=(job, writer),
                    name=f"model_check walk {job[2]}",
                    daemon=True,
                )
                proc.start()
            except BaseException:
                reader.close()
                raise
            finally:
                writer.close()  # the child holds the only writing end: its exit means EOF
            procs.append(proc)
            readers.append(reader)
        results: dict[int, dict[str, Any] | None] = {}
        open_readers = {reader: i for i, reader in enumerate(readers)}
        running = {proc.sentinel: i for i, proc in enumerate(procs)}
        # Each walk has two events, its result (or EOF) and its process's exit, and every
        # round consumes at least one: at most 2K rounds.
        for _ in range(2 * len(jobs)):
            if not open_readers and not running:
                break
            for ready in wait([*open_readers, *running]):
                if isinstance(ready, int):
                    index = running.pop(ready)
                    procs[index].join()
                    if open_readers.pop(readers[index], None) is not None:
                        # It exited: what it sent is still in the pipe, or the pipe is at EOF.
                        results[index] = _receive(readers[index])
                    if results[index] is None:
                        _raise_died(jobs[index], seed, len(jobs), procs[index].exitcode)
                elif isinstance(ready, Connection) and ready in open_readers:
                    results[open_readers.pop(ready)] = _receive(ready)
        assert not open_readers and not running, "a walk's events were not all seen"
        return [doc for _, doc in sorted(results.items()) if doc is not None]
    finally:
        _stop(procs)
        for reader in readers:
            reader.close()


def _raise_died(job: Job, seed: int, workers: int, exitcode: int | None) -> NoReturn:
    _, _, index, steps = job
    message = (
        f'walk {index} of --workers {workers} (seed "{seed}/{index}", {steps} moves) '
        f"{_how_it_ended(exitcode)}; the other walks were stopped and there is no "
        "result. Rerun with --workers 1 (one process, less memory in all), fewer "
        "--workers or --steps, or with more memory"
    )
    sys.stdout.flush()
    print(f"model_check: error: {message}", file=sys.stderr, flush=True)
    raise WorkerDied(message)


def run_random(
    steps: int, workers: int, seed: int, argv: list[str], *, quiet: bool = False
) -> Result:
    per = [steps // workers + (1 if i < steps % workers else 0) for i in range(workers)]
    walk_argv = [*argv, "--mode=random", *(["--quiet"] if quiet else [])]
    jobs: list[Job] = [(walk_argv, seed, i, per[i]) for i in range(workers)]
    start = time.monotonic()
    # One walk runs in this process; more run one process each.
    outs = [random_worker(jobs[0])] if workers == 1 else _run_processes(jobs, seed)
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
