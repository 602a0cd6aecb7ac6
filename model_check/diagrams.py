"""State and decision diagrams generated from the decision tables.

``python -m model_check.diagrams`` writes graphviz sources for every protocol variant
in :data:`spec.variants.VARIANTS` to ``docs/diagrams/`` and the page ``docs/diagrams.md``
that shows them; ``--render`` also runs graphviz's ``dot`` to write an SVG next to each
source. ``--check`` writes nothing and exits 1 if a committed file is stale.

Three kinds of diagram per variant:

``<variant>-shared-lifecycle.dot``
    The phases of the shared state (open, last call, complete, next round, closed) and
    the actions that move between them.
``<variant>-node-lifecycle.dot``
    What one node goes through while it runs the join operation (joining, participant,
    waiting, redundant, done, the errors).
``<variant>-<op>.dot``
    One per operation: its rows in first-match order, each row's guard and action.

The lifecycle edges are not drawn by hand: they are *observed*. :func:`sample_contexts`
enumerates a bounded set of small concrete situations (three nodes a, b, c; every
assignment of them to the lists; complete or not; closed or not; no, a future or a past
last-call deadline; the acting node's heartbeat fresh or due; the op clock before its
deadline, inside the rollback window or past it; four min/max settings), keeps those that
satisfy every state invariant of :mod:`spec.invariants`, lets each operation's table pick
the row, applies the row's effect and classifies the state before and after
(:func:`shared_phase`, :func:`node_status`). Pruning edges come from running
:func:`spec.effects.sanitize` on the same states with some heartbeats expired. An edge
exists iff some sample produced it, so a change of a row or an effect shows up in the
diagrams (and the stale check fails until they are regenerated).

Everything emitted is sorted; the output does not depend on hash seeds or clocks.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import itertools
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from spec.effects import sanitize
from spec.invariants import check_state
from spec.settings import Settings
from spec.state import NodeId, RendezvousState
from spec.tables import Context, Row, Table
from spec.variants import VARIANTS, Variant
from spec.vocabulary import ACTION_FAILURES, Action, FailKind, Op

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DIAGRAM_DIR_NAME = "diagrams"
COMMAND = "python -m model_check.diagrams --render"
"""The command that regenerates every diagram source and SVG."""
SOURCE_HASH_PREFIX = "<!-- rdzv-dot-source-sha256: "
"""Every rendered SVG carries the hash of the DOT source it was rendered from."""
RENDER_TIMEOUT_S = 60
"""Bound on one ``dot`` run."""

# ---------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------


class SharedPhase(enum.Enum):
    """A coarse phase of the shared state, for the lifecycle diagram."""

    OPEN = "open"
    LAST_CALL = "last call"
    COMPLETE = "complete"
    NEXT_ROUND = "next round"
    CLOSED = "closed"


def shared_phase(state: RendezvousState) -> SharedPhase:
    """Closed wins over everything; a complete round; an open round whose last call
    deadline is set; otherwise an open round. (NEXT_ROUND is a transition target, see
    :func:`phase_after`.)"""
    if state.closed:
        return SharedPhase.CLOSED
    if state.complete:
        return SharedPhase.COMPLETE
    if state.deadline is not None:
        return SharedPhase.LAST_CALL
    return SharedPhase.OPEN


def phase_after(before: RendezvousState, after: RendezvousState) -> SharedPhase:
    """The phase an action leads to: a round number that went up is a *next round*
    (which is an open round, drawn separately so the roll-over is visible)."""
    if not after.closed and after.round > before.round:
        return SharedPhase.NEXT_ROUND
    return shared_phase(after)


class NodeStatus(enum.Enum):
    """Where one node stands while it runs the join operation."""

    IDLE = "idle"
    JOINING = "joining"
    PARTICIPANT = "participant"
    WAITING = "waiting"
    REDUNDANT = "redundant"
    DONE = "done"
    ERROR_CLOSED = "error: closed"
    ERROR_TIMEOUT = "error: timeout"
    ERROR_GRACEFUL_EXIT = "error: graceful exit"


_FAIL_STATUS = {
    FailKind.CLOSED: NodeStatus.ERROR_CLOSED,
    FailKind.TIMEOUT: NodeStatus.ERROR_TIMEOUT,
    FailKind.GRACEFUL_EXIT: NodeStatus.ERROR_GRACEFUL_EXIT,
}


def node_status(state: RendezvousState, node: NodeId) -> NodeStatus:
    """The node's membership while its join runs (not listed: still joining)."""
    if state.is_participant(node):
        return NodeStatus.PARTICIPANT
    if state.is_waiting(node):
        return NodeStatus.WAITING
    if state.is_redundant(node):
        return NodeStatus.REDUNDANT
    return NodeStatus.JOINING


# ---------------------------------------------------------------------------------------
# Bounded enumeration of small concrete situations
# ---------------------------------------------------------------------------------------
ME = NodeId("a", 1)
OTHERS = (NodeId("b", 1), NodeId("c", 1))
WALL = 1_000_000
OP_DEADLINE = 500_000
SAMPLE_SETTINGS = (
    Settings(min_nodes=1, max_nodes=1),
    Settings(min_nodes=1, max_nodes=2),
    Settings(min_nodes=2, max_nodes=2),
    Settings(min_nodes=2, max_nodes=3),
)
_LISTS = ("none", "participant", "waiting", "redundant")


def _states(settings: Settings) -> Iterator[RendezvousState]:
    nodes = (ME, *OTHERS)
    for where in itertools.product(_LISTS, repeat=len(nodes)):
        members = sorted(n for n, w in zip(nodes, where, strict=True) if w == "participant")
        waiting = [n for n, w in zip(nodes, where, strict=True) if w == "waiting"]
        redundant = [n for n, w in zip(nodes, where, strict=True) if w == "redundant"]
        listed = [n for n, w in zip(nodes, where, strict=True) if w != "none"]
        own_beats: tuple[int | None, ...] = (
            (WALL, WALL - settings.keep_alive_interval) if ME in listed else (None,)
        )
        for complete, closed, deadline, own in itertools.product(
            (False, True), (False, True), (None, WALL + 1, WALL - 1), own_beats
        ):
            beats = {n: WALL for n in listed if n != ME}
            if own is not None:
                beats[ME] = own
            ranks = {n: (i if complete else 0) for i, n in enumerate(members)}
            yield RendezvousState.build(
                round=1,
                complete=complete,
                closed=closed,
                deadline=deadline,
                participants=ranks,
                wait_list=waiting,
                redundancy_list=redundant,
                last_heartbeats=beats,
            )


def sample_contexts(variant: Variant) -> Iterator[Context]:
    """Every sampled context that satisfies the state invariants (see module doc)."""
    monos = (
        OP_DEADLINE - 1,
        OP_DEADLINE + 1,
        OP_DEADLINE + variant.rollback_window + 1,
    )
    for settings in SAMPLE_SETTINGS:
        # Announcing variants: not announced; announced and waiting; announced and due.
        announcements: tuple[int | None, ...] = (None,)
        if variant.announces:
            announcements = (None, settings.min_nodes - 1, settings.max_nodes)
        for state in _states(settings):
            if check_state(state, settings):
                continue
            for mono, size in itertools.product(monos, announcements):
                yield Context(
                    node=ME,
                    state=state,
                    settings=settings,
                    mono_now=mono,
                    wall_now=WALL,
                    op_deadline=OP_DEADLINE,
                    rollback_window=variant.rollback_window,
                    announce_size=None if size is None or size < 1 else size,
                    announce_age=None if size is None or size < 1 else 0,
                )


@dataclass(frozen=True, order=True)
class Edge:
    source: str
    target: str
    label: str


def _observe(variant: Variant) -> tuple[set[Edge], set[Edge]]:
    """(shared-lifecycle edges, node-lifecycle edges) observed over the samples."""
    shared: set[Edge] = set()
    node: set[Edge] = set()
    join = variant.table(Op.JOIN)
    for ctx in sample_contexts(variant):
        for op in Op:
            table = variant.table(op)
            index = table.select(ctx)
            action = table.rows[index].then
            after = ctx.state
            if action.folds:
                # Sampled fold: the announcement set holds this node alone.
                fold = variant.folds[action]
                after = fold(ctx.state, ctx.node, (ctx.node,), ctx.settings, ctx.wall_now)
            elif action.mutates:
                effect = variant.effects[action]
                after = effect(ctx.state, ctx.node, ctx.settings, ctx.wall_now)
            if action.mutates:
                shared.add(
                    Edge(
                        shared_phase(ctx.state).value,
                        phase_after(ctx.state, after).value,
                        action.value,
                    )
                )
            if table is not join:
                continue
            before_status = node_status(ctx.state, ctx.node)
            if action is Action.FINISH:
                after_status = NodeStatus.DONE
            elif action in ACTION_FAILURES:
                after_status = _FAIL_STATUS[ACTION_FAILURES[action]]
            else:
                after_status = node_status(after, ctx.node)
            node.add(Edge(before_status.value, after_status.value, table.rows[index].name))
    for settings in SAMPLE_SETTINGS:
        for state in _states(settings):
            if check_state(state, settings):
                continue
            listed = [n for n, _ in state.last_heartbeats]
            for size in range(1, len(listed) + 1):
                for dead in itertools.combinations(listed, size):
                    expired = WALL - settings.heartbeat_expiry - 1
                    beats = {n: (expired if n in dead else t) for n, t in state.last_heartbeats}
                    stale = state.evolve(last_heartbeats=beats)
                    pruned = sanitize(stale, settings, WALL).state
                    shared.add(
                        Edge(
                            shared_phase(stale).value,
                            phase_after(stale, pruned).value,
                            "sanitize (prune)",
                        )
                    )
    return shared, node


# ---------------------------------------------------------------------------------------
# DOT output
# ---------------------------------------------------------------------------------------
FONT = "Helvetica"


def _q(text: str) -> str:
    """A DOT double-quoted string (newlines become centred line breaks)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _header(name: str, rankdir: str) -> list[str]:
    return [
        f"// Generated by `{COMMAND}` from spec/tables.py: do not edit.",
        f"digraph {_q(name)} {{",
        f"  rankdir={rankdir};",
        f'  graph [fontname="{FONT}", labelloc=t, fontsize=16];',
        f'  node [fontname="{FONT}", fontsize=12];',
        f'  edge [fontname="{FONT}", fontsize=12];',
    ]


def _grouped(edges: Iterable[Edge]) -> list[tuple[str, str, list[str]]]:
    groups: dict[tuple[str, str], set[str]] = {}
    for e in edges:
        groups.setdefault((e.source, e.target), set()).add(e.label)
    return [(s, t, sorted(labels)) for (s, t), labels in sorted(groups.items())]


_PHASE_STYLE = {
    SharedPhase.OPEN: "shape=ellipse, style=filled, fillcolor=lightblue",
    SharedPhase.LAST_CALL: "shape=ellipse, style=filled, fillcolor=lightyellow",
    SharedPhase.COMPLETE: "shape=ellipse, style=filled, fillcolor=palegreen",
    SharedPhase.NEXT_ROUND: 'shape=ellipse, style="filled,dashed", fillcolor=white',
    SharedPhase.CLOSED: "shape=doublecircle, style=filled, fillcolor=lightgrey",
}


def shared_lifecycle_dot(variant: Variant, edges: Iterable[Edge]) -> str:
    # Top to bottom: the page is narrower than it is long, and left to right the edge
    # labels side by side made the drawing twice the page's width (6 px text).
    lines = _header(f"{variant.name}: shared-state lifecycle", "TB")
    lines.append(f"  label={_q(f'{variant.name}: shared-state lifecycle')};")
    lines.append("  nodesep=0.5; ranksep=0.6;")  # room between the stacked edge labels
    lines.append('  start [shape=point, label=""];')
    for phase in SharedPhase:
        lines.append(f"  {_q(phase.value)} [{_PHASE_STYLE[phase]}];")
    lines.append(f'  start -> {_q(SharedPhase.OPEN.value)} [label="empty state"];')
    lines.append(
        f"  {_q(SharedPhase.NEXT_ROUND.value)} -> {_q(SharedPhase.OPEN.value)} "
        '[style=dashed, label="round + 1, nobody\\nlisted as participant"];'
    )
    for source, target, labels in _grouped(edges):
        lines.append(f"  {_q(source)} -> {_q(target)} [label={_q(chr(10).join(labels))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _status_style(status: NodeStatus) -> str:
    if status.value.startswith("error"):
        return "shape=octagon, style=filled, fillcolor=lightpink"
    if status is NodeStatus.DONE:
        return "shape=doublecircle, style=filled, fillcolor=palegreen"
    if status is NodeStatus.IDLE:
        return "shape=circle, style=filled, fillcolor=lightgrey"
    return 'shape=box, style="rounded,filled", fillcolor=lightblue'


def node_lifecycle_dot(variant: Variant, edges: Iterable[Edge]) -> str:
    """Top to bottom, each edge labelled with the names of its join rows, in table order;
    a loop (rows that keep the node where it is) is drawn unlabelled, since its names made
    the drawing too wide. The page's table beside it (:func:`node_edges_table`) gives each
    row's action and moves, loops included."""
    join = variant.table(Op.JOIN)
    title = f"{variant.name}: one node's join (edges: join rows)"
    lines = _header(title, "TB")
    lines.append(f"  label={_q(title)};")
    lines.append("  nodesep=0.2;")  # the row names are wide: keep within the page's width
    for status in NodeStatus:
        lines.append(f"  {_q(status.value)} [{_status_style(status)}];")
    lines.append(
        f"  {_q(NodeStatus.IDLE.value)} -> {_q(NodeStatus.JOINING.value)} "
        '[style=dashed, label="next_rendezvous:\\nexit, then join"];'
    )
    lines.append(
        f"  {_q(NodeStatus.DONE.value)} -> {_q(NodeStatus.IDLE.value)} "
        '[style=dashed, label="return rank\\nand world size"];'
    )
    for source, target, labels in _grouped(edges):
        rows = "" if source == target else "\n".join(sorted(labels, key=join.index))
        lines.append(f"  {_q(source)} -> {_q(target)} [label={_q(rows)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def node_edges_table(variant: Variant, edges: Iterable[Edge]) -> list[str]:
    """The Markdown table under a node lifecycle: each join row's action and the moves
    of the node it makes (the diagram's edges carry the row names only)."""
    moves: dict[str, list[str]] = {}
    for source, target, labels in _grouped(edges):
        for label in labels:
            move = f"stays {source}" if source == target else f"{source} → {target}"
            moves.setdefault(label, []).append(move)
    table = variant.table(Op.JOIN)
    out = ["| join row | action | moves the node |", "|---|---|---|"]
    for index, r in enumerate(table.rows):
        where = ", ".join(moves.get(r.name, [])) or "(not observed)"
        out.append(f"| `{table.qualified(index)}` | `{r.then.value}` | {where} |")
    return out


def _action_style(action: Action) -> str:
    if action is Action.FINISH:
        return "fillcolor=palegreen"
    if action in ACTION_FAILURES:
        return "fillcolor=lightpink"
    if action is Action.SYNC:
        return "fillcolor=lightyellow"
    return "fillcolor=lightblue"


def decision_dot(variant: Variant, table: Table) -> str:
    title = f"{variant.name}: {table.op.value} (rows in first-match order)"
    lines = _header(title, "TB")
    lines.append(f"  label={_q(title)};")
    lines.append("  nodesep=0.3; ranksep=0.25;")
    lines.append('  start [shape=point, label=""];')
    previous = "start"
    for index, r in enumerate(table.rows):
        lines.extend(_decision_row(index, r))
        edge_label = "" if previous == "start" else ' [label="no"]'
        lines.append(f"  {previous} -> row{index}{edge_label};")
        previous = f"row{index}"
    lines.append("}")
    return "\n".join(lines) + "\n"


def _decision_row(index: int, r: Row) -> list[str]:
    guard = r.guard_text().replace(" and ", "\nand ")
    action = r.then.value + (f"\n({r.why})" if r.why else "")
    label = f"{r.name}:\n{guard}"
    return [
        f"  row{index} [shape=box, style=rounded, label={_q(label)}];",
        f"  act{index} [shape=box, style=filled, {_action_style(r.then)}, label={_q(action)}];",
        f'  row{index} -> act{index} [label="yes"];',
        f"  {{ rank=same; row{index}; act{index}; }}",
    ]


# ---------------------------------------------------------------------------------------
# The page and the file set
# ---------------------------------------------------------------------------------------
def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in name)


Observed = Mapping[str, tuple[set[Edge], set[Edge]]]
"""Each variant's observed (shared-lifecycle, node-lifecycle) edges, by name."""


def observe_all(variants: Mapping[str, Variant]) -> dict[str, tuple[set[Edge], set[Edge]]]:
    return {name: _observe(variant) for name, variant in variants.items()}


def diagram_sources(
    variants: Mapping[str, Variant] | None = None, observed: Observed | None = None
) -> dict[str, str]:
    """DOT file name -> content, for every variant and diagram."""
    chosen = variants if variants is not None else VARIANTS
    edges = observed if observed is not None else observe_all(chosen)
    out: dict[str, str] = {}
    for name in sorted(chosen):
        variant = chosen[name]
        shared, node = edges[name]
        slug = _slug(variant.name)
        out[f"{slug}-shared-lifecycle.dot"] = shared_lifecycle_dot(variant, shared)
        out[f"{slug}-node-lifecycle.dot"] = node_lifecycle_dot(variant, node)
        for op in Op:
            out[f"{slug}-{op.value}.dot"] = decision_dot(variant, variant.table(op))
    return dict(sorted(out.items()))


def _kinds(slug: str) -> list[tuple[str, str]]:
    return [
        ("Shared-state lifecycle", f"{slug}-shared-lifecycle"),
        ("One node's join", f"{slug}-node-lifecycle"),
        *((f"Decision table: {op.value}", f"{slug}-{op.value}") for op in Op),
    ]


def diagrams_page(
    variants: Mapping[str, Variant], sources: Mapping[str, str], observed: Observed
) -> str:
    """The Markdown page ``docs/diagrams.md`` embedding every SVG (each a link to the
    full-size drawing), without the table of contents beside it, so that the drawings
    get the page's whole width."""
    lines = [
        "---",
        "hide:",
        "  - toc",
        "---",
        "",
        "# Diagrams",
        "",
        f"<!-- Generated by `{COMMAND}`: do not edit. -->",
        "",
        "Every diagram on this page is generated from the decision tables in",
        "`spec/tables.py` and the effects in `spec/effects.py` by",
        "`model_check/diagrams.py`, and rendered with graphviz. Regenerate with",
        "",
        "```sh",
        COMMAND,
        "```",
        "",
        "`tests/test_diagrams.py` fails with *diagrams are stale* when a table or an",
        "effect changed and the committed sources were not regenerated.",
        "",
        "**How the lifecycle edges are derived.** They are observed, not drawn: the",
        "generator enumerates small concrete situations (nodes a, b, c in every",
        "combination of lists; complete or not; closed or not; no, a future or a past",
        "last-call deadline; the acting node's heartbeat fresh or due; its operation",
        "clock before its deadline, in the rollback window or past it; min/max nodes",
        "1/1, 1/2, 2/2 and 2/3), keeps those that satisfy every state invariant, lets",
        "each operation's table choose a row, applies that row's effect and classifies",
        "the state before and after. The shared state is *closed* if closed, else",
        "*complete* if the round is complete, else *last call* if a last-call deadline",
        "is set, else *open*; a transition that increments the round number ends in",
        "*next round* (an open round with a new number). Pruning edges come from",
        "`sanitize` on the same situations with some heartbeats expired. The node",
        "lifecycle labels each edge with the names of the join table's rows that move",
        "the node along it (the table under it gives each row's action, and the rows of",
        "the unlabelled loops, which keep the node where it is); the dashed",
        "edges are the calls around the join operation.",
        "",
        "Colours: blue mutates the shared state, yellow waits, green succeeds, pink",
        "fails. Each drawing links to its full-size SVG.",
        "",
    ]
    order = list(variants)  # the registry's order: the reference variant first
    first = order[0]
    for name in order:
        slug = _slug(name)
        lines += [f"## Variant `{name}`", "", variants[name].description, ""]
        if name != first:
            same = all(
                sources[f"{slug}-{suffix}.dot"].replace(name, "")
                == sources[f"{_slug(first)}-{suffix}.dot"].replace(first, "")
                for suffix in [k[1][len(slug) + 1 :] for k in _kinds(slug)]
            )
            if same:
                changes = variants[name].changes
                lines += [
                    f"Its diagrams are identical to `{first}`'s: what distinguishes it is "
                    "not visible in them" + (":" if changes else "."),
                    "",
                    *(f"- {change}" for change in changes),
                    *([""] if changes else []),
                    "Its diagrams are generated too: "
                    + ", ".join(f"[{title}](diagrams/{stem}.svg)" for title, stem in _kinds(slug))
                    + ".",
                    "",
                ]
                continue
        for title, stem in _kinds(slug):
            image = f"[![{name}: {title}](diagrams/{stem}.svg)](diagrams/{stem}.svg)"
            lines += [f"### {title}", "", image, ""]
            if stem.endswith("-node-lifecycle"):
                lines += [*node_edges_table(variants[name], observed[name][1]), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def generate(variants: Mapping[str, Variant] | None = None) -> dict[str, str]:
    """Every generated text file, as path relative to ``docs/`` -> content."""
    chosen = variants if variants is not None else VARIANTS
    observed = observe_all(chosen)
    sources = diagram_sources(chosen, observed)
    out = {f"{DIAGRAM_DIR_NAME}/{name}": text for name, text in sources.items()}
    out["diagrams.md"] = diagrams_page(chosen, sources, observed)
    return dict(sorted(out.items()))


def stale_files(docs: Path = DOCS, expected: Mapping[str, str] | None = None) -> list[str]:
    """Relative paths (under ``docs``) that are missing, different or left over."""
    wanted = generate() if expected is None else expected
    problems = []
    for rel, text in wanted.items():
        path = docs / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            problems.append(rel)
    diagram_dir = docs / DIAGRAM_DIR_NAME
    if diagram_dir.is_dir():  # leftovers of a removed variant or op
        for path in sorted(diagram_dir.glob("*.dot")):
            rel = f"{DIAGRAM_DIR_NAME}/{path.name}"
            if rel not in wanted:
                problems.append(rel)
    return sorted(problems)


def source_hash(dot_source: str) -> str:
    return hashlib.sha256(dot_source.encode("utf-8")).hexdigest()


def svg_problems(docs: Path = DOCS) -> list[str]:
    """DOT sources whose SVG is missing or was rendered from a different source."""
    problems = []
    for dot_path in sorted((docs / DIAGRAM_DIR_NAME).glob("*.dot")):
        svg = dot_path.with_suffix(".svg")
        stamp = SOURCE_HASH_PREFIX + source_hash(dot_path.read_text(encoding="utf-8"))
        if not svg.is_file() or stamp not in svg.read_text(encoding="utf-8"):
            problems.append(f"{DIAGRAM_DIR_NAME}/{svg.name}")
    return problems


def render_svg(dot_source: str, dot_binary: str) -> str:
    """Run graphviz on one source; stamp the result with the source's hash."""
    done = subprocess.run(
        [dot_binary, "-Tsvg"],
        input=dot_source.encode("utf-8"),
        capture_output=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"dot failed: {done.stderr.decode('utf-8', 'replace')}")
    svg = done.stdout.decode("utf-8")
    stamp = f"{SOURCE_HASH_PREFIX}{source_hash(dot_source)} -->\n"
    head, sep, rest = svg.partition("?>\n")
    return f"{head}{sep}{stamp}{rest}" if sep else stamp + svg


def write(docs: Path = DOCS, *, render: bool) -> list[str]:
    """Write every generated file (and SVGs when ``render``); return what changed."""
    wanted = generate()
    changed = []
    diagram_dir = docs / DIAGRAM_DIR_NAME
    diagram_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(diagram_dir.iterdir()):
        if path.suffix in (".dot", ".svg") and f"{DIAGRAM_DIR_NAME}/{path.stem}.dot" not in wanted:
            path.unlink()
            changed.append(f"removed {DIAGRAM_DIR_NAME}/{path.name}")
    for rel, text in wanted.items():
        path = docs / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(f"wrote {rel}")
    if render:
        dot = shutil.which("dot")
        if dot is None:
            raise RuntimeError(
                "graphviz's dot is not installed; install it (apt-get install graphviz) "
                "or run without --render"
            )
        for problem in svg_problems(docs):
            svg = docs / problem
            source = svg.with_suffix(".dot").read_text(encoding="utf-8")
            svg.write_text(render_svg(source, dot), encoding="utf-8")
            changed.append(f"rendered {problem}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model_check.diagrams",
        description="Generate graphviz diagrams of the decision tables into docs/diagrams/.",
    )
    parser.add_argument("--render", action="store_true", help="also render SVGs with dot")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if anything is stale"
    )
    parser.add_argument(
        "--docs", type=Path, default=DOCS, help="the docs directory (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    docs: Path = args.docs
    if args.check:
        stale = stale_files(docs) + svg_problems(docs)
        for rel in stale:
            print(f"stale: docs/{rel}")
        if stale:
            print(f"diagrams are stale: run {COMMAND}")
            return 1
        print("diagrams are up to date")
        return 0
    try:
        changed = write(docs, render=args.render)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in changed:
        print(line)
    print(f"{len(changed)} file(s) changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
