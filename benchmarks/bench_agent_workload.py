"""The agent-workload findings table (docs/findings.md, findings 6 to 8): prints, for each
failure found from outside, the checker's verdict on the protocol that has it and on the
fixed ``hardened`` and ``scale``, exhaustively, with distinct worlds and wall time.

Each row is one ``python -m model_check --json`` run in a fresh subprocess (the same
runner as ``bench_model_check.py``). The full table takes about an hour on one core; the
quick one (``--quick``) keeps the rows under a minute each.

    python benchmarks/bench_agent_workload.py            # every row
    python benchmarks/bench_agent_workload.py --quick    # the small rows only
    python benchmarks/bench_agent_workload.py --match "1 paused"   # one finding's rows
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model_check import run_row

N2 = ("--nodes", "2")
N3_MAX3 = ("--nodes", "3", "--min-nodes", "2", "--max-nodes", "3")
N3_MAX2 = ("--nodes", "3", "--min-nodes", "2", "--max-nodes", "2")
ROWS: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    # (finding, quick, model_check arguments)
    ("1 paused member", True, (*N2, "--protocol", "upstream")),
    ("1 paused member", True, (*N2, "--protocol", "planted-old-hardened")),
    ("1 paused member", True, (*N2, "--protocol", "planted-old-scale")),
    ("1 paused member", True, (*N2, "--protocol", "hardened")),
    ("1 paused member", True, (*N2, "--protocol", "scale")),
    ("1 paused member", True, (*N3_MAX3, "--protocol", "hardened")),
    ("1 paused member", False, (*N3_MAX3, "--protocol", "scale")),
    ("2 surplus waiter", True, (*N3_MAX2, "--protocol", "upstream")),
    ("2 surplus waiter", True, (*N3_MAX2, "--protocol", "planted-waiters-outlive-completion")),
    ("2 surplus waiter", True, (*N3_MAX2, "--protocol", "hardened")),
    ("2 surplus waiter", False, (*N3_MAX2, "--protocol", "scale")),
    ("3 stale count", True, (*N3_MAX3, "--protocol", "upstream")),
    ("3 stale count", True, (*N3_MAX3, "--protocol", "hardened", "--stale-queries")),
    ("dropped member", True, (*N3_MAX2, "--protocol", "planted-dropped-member-uncounted")),
    (
        "5 dead waiter",
        False,
        (*N3_MAX3, "--protocol", "planted-scale-waiters-outlive-completion", "--crash", "1"),
    ),
    ("5 dead waiter", True, (*N2, "--protocol", "scale", "--crash", "1")),
    ("5 dead waiter", False, (*N3_MAX3, "--protocol", "scale", "--crash", "1")),
)

ROW_TIMEOUT_S = 3600
"""Wall-clock limit per row (the largest rows take about half an hour)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small rows only (default off)")
    parser.add_argument(
        "--match",
        default="",
        help="only the rows whose finding or arguments contain this text (default: every row)",
    )
    ns = parser.parse_args(argv)
    rows = [row for row in ROWS if ns.match in f"{row[0]} {' '.join(row[2])}"]
    if not rows:
        parser.error(
            f"no row matches {ns.match!r}; the findings are: {sorted({r[0] for r in ROWS})}"
        )
    print("| finding | configuration | result | property | moves | distinct worlds | wall s |")
    print("|---|---|---|---|---:|---:|---:|")
    for finding, quick, args in rows:
        if ns.quick and not quick:
            continue
        doc = run_row(list(args), timeout_s=ROW_TIMEOUT_S)
        violation = doc.get("violation")
        name, moves = ("-", "-")
        if isinstance(violation, dict):
            name, moves = str(violation["name"]), str(violation["moves"])
        print(
            f"| {finding} | `{' '.join(args)}` | {doc['result']} | {name} | {moves} "
            f"| {doc['unique']:,} | {float(str(doc['wall'])):.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
