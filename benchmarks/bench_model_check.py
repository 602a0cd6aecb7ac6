"""Benchmark of the model checker: prints a Markdown table (not a timed test).

For N = 2..8 (exhaustive, with and without symmetry reduction) and N = 64, 256, 1024
(random mode), under the light workload (``--workload ticks --worker-failures 0``: see
``LIGHT``), it prints distinct states, generated states, states per second, peak
memory and wall time. A second table walks ``hardened`` and ``scale`` with every fault,
under the default (agent) workload,
(the random-mode evidence of docs/findings.md and docs/model_checker.md) and adds how the
walk's end was judged. Each row runs in a fresh subprocess, which reports its own peak
memory (ru_maxrss). Runs without symmetry reduction are capped (``--max-states``) and marked
"bound" when the cap cut them; nothing is extrapolated.

A third table runs the same configurations three ways in one run and prints their
rates side by side: the checker of a pinned commit (:data:`PINNED`, extracted with
``git archive``, interpreted), this tree interpreted, and this tree compiled
(``--native``, see ``model_check/native.py``), with the ratio of the last to the first
and whether all three counted the same states (they must: the search is the same).

    python benchmarks/bench_model_check.py            # full tables (tens of minutes)
    python benchmarks/bench_model_check.py --quick    # N = 2..5 and N = 64 only
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVERY_FAULT = (
    "--crash=3",
    "--restart-new=2",
    "--cas-unknown=2",
    "--store-down=2",
    "--skew=4",
    "--steps=3000",
    "--seed=1",
)
"""The faulty walks' flags (the same as in docs/findings.md)."""
LIGHT = ("--workload=ticks", "--worker-failures=0")
"""The speed table's workload: the light one the table was first measured with (today's
default, torch's agent workload, finds finding 6 in upstream within a few moves, so its
rows would time a counterexample instead of a whole space)."""
FAULTY_WALKS = (("hardened", 64), ("hardened", 256), ("scale", 64), ("scale", 1024))
FAULTY_WALKS_QUICK = (("hardened", 64), ("scale", 64))
UNREDUCED_CAP = 150_000
"""Unique-state cap for runs without symmetry reduction."""
ROW_TIMEOUT_S = 900
"""Wall-clock limit per row."""
PINNED = "3a2bc49e6a48d2988403f8266d35593be293bd39"
"""The commit whose checker the comparison table runs as "old": the last one before the
compiled build (``--native``)."""
COMPARED = (
    ("light N=6, no symmetry", (*LIGHT, "--nodes=6", "--no-symmetry", "--max-states=60000")),
    ("light N=8", (*LIGHT, "--nodes=8")),
    (
        "hardened N=4 --crash 1",
        ("--protocol=hardened", "--nodes=4", "--crash=1", "--max-states=40000"),
    ),
    ("scale N=3 --crash 1", ("--protocol=scale", "--nodes=3", "--crash=1", "--max-states=40000")),
    ("random N=256", (*LIGHT, "--mode=random", "--nodes=256", "--steps=2000", "--seed=1")),
)
"""The comparison table's configurations: the speed table's light rows, and the faulty
searches the exhaustive runs of docs/model_checker.md are made of (capped, so a row takes
seconds to a minute)."""
COMPARED_QUICK = (
    ("light N=5", (*LIGHT, "--nodes=5")),
    (
        "hardened N=3 --crash 1",
        ("--protocol=hardened", "--nodes=3", "--crash=1", "--max-states=3000"),
    ),
)


def run_row(
    args: list[str] | tuple[str, ...],
    timeout_s: float = ROW_TIMEOUT_S,
    source: Path = ROOT,
    native: bool = False,
) -> dict[str, object]:
    """One run of the checker under ``source`` (a tree holding ``spec`` and
    ``model_check``), in a fresh interpreter that imports nothing else of this checkout."""
    env = dict(os.environ, PYTHONPATH=str(source))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "model_check", "--json", "--quiet"]
        + (["--native"] if native else [])
        + list(args),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
        cwd=source,
    )
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"model_check {args} failed ({proc.returncode}): {proc.stderr}")
    doc: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["wall"] = wall
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    ns = parser.parse_args(argv)
    exhaustive = range(2, 6) if ns.quick else range(2, 9)
    randoms = (64,) if ns.quick else (64, 256, 1024)
    print("| mode | N | symmetry | distinct | generated | states/s | peak MiB | wall s | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in exhaustive:
        for sym in (True, False):
            args = [*LIGHT, f"--nodes={n}"]
            args.append("--max-states=0" if sym else f"--max-states={UNREDUCED_CAP}")
            if not sym:
                args.append("--no-symmetry")
            doc = run_row(args)
            note = "bound" if doc["result"] == "bounded" else ""
            if doc["violation"]:
                note = f"violation {doc['violation']['name']}"  # type: ignore[index]
            _print(doc, "exhaustive", n, "on" if sym else "off", note)
    for n in randoms:
        doc = run_row([*LIGHT, "--mode=random", f"--nodes={n}", "--steps=2000", "--seed=1"])
        _print(doc, "random (2000 steps)", n, "-", "")
    print()
    print(f"Random walks with every fault (`{' '.join(EVERY_FAULT)}`):")
    print()
    print("| protocol | N | violation | walk ends checked | undecided | longest continuation |")
    print("|---|---|---|---|---|---|")
    walks = FAULTY_WALKS_QUICK if ns.quick else FAULTY_WALKS
    for protocol, n in walks:
        doc = run_row(["--mode=random", f"--protocol={protocol}", f"--nodes={n}", *EVERY_FAULT])
        ends = doc["walk_ends"]
        assert isinstance(ends, dict)
        violation = doc["violation"]
        name = "none" if not violation else violation["name"]  # type: ignore[index]
        print(
            f"| {protocol} | {n} | {name} | {ends['checked']} | {ends['undecided']} | "
            f"{ends['longest_continuation_moves']} of {ends['continuation_bound_moves']} moves, "
            f"{float(doc['wall']):.1f} s wall, {float(doc['peak_rss_mib']):.0f} MiB |",  # type: ignore[arg-type]
            flush=True,
        )
    print()
    compare(COMPARED_QUICK if ns.quick else COMPARED)
    return 0


def pinned_tree(where: Path) -> Path:
    """The ``spec`` and ``model_check`` packages of :data:`PINNED`, extracted under
    ``where``."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PINNED, "spec", "model_check"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"bench_model_check: cannot read commit {PINNED[:12]} for the comparison "
            f"table ({proc.stderr.decode(errors='replace').strip()}); run it in a git "
            "checkout holding that commit (git fetch)"
        )
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(where / "pinned", filter="data")
    return where / "pinned"


def compare(rows: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    """The comparison table: each configuration under the pinned checker, this one
    interpreted and this one compiled."""
    print(f"The same searches, old and new (old: commit {PINNED[:7]}, interpreted):")
    print()
    print(
        "| configuration | distinct | generated | old states/s | interpreted states/s "
        "| --native states/s | ratio | same counts |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = pinned_tree(Path(tmp))
        for name, args in rows:
            docs = [
                run_row(args, source=old_tree),
                run_row(args),
                run_row(args, native=True),
            ]
            rates = [_rate(d) for d in docs]
            same = len({(d["states"], d["unique"], d["result"]) for d in docs}) == 1
            print(
                f"| {name} | {docs[0]['unique']} | {docs[0]['states']} | {rates[0]:.0f} | "
                f"{rates[1]:.0f} | {rates[2]:.0f} | {rates[2] / rates[0]:.2f}x | "
                f"{'yes' if same else 'NO'} |",
                flush=True,
            )


def _rate(doc: dict[str, object]) -> float:
    """Generated states per second of search (the run's own measure, startup excluded)."""
    sec = float(doc["wall_seconds"])  # type: ignore[arg-type]
    return int(doc["states"]) / sec if sec > 0 else float("nan")  # type: ignore[call-overload]


def _print(doc: dict[str, object], mode: str, n: int, sym: str, note: str) -> None:
    rate = _rate(doc)
    print(
        f"| {mode} | {n} | {sym} | {doc['unique']} | {doc['states']} | {rate:.0f} | "
        f"{float(doc['peak_rss_mib']):.0f} | {float(doc['wall']):.1f} | {note} |",  # type: ignore[arg-type]
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
