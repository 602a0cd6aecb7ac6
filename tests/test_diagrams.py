"""The committed diagrams are what the tables generate (no graphviz needed here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model_check import diagrams
from spec.state import NodeId, RendezvousState
from spec.tables import Atom, row
from spec.variants import UPSTREAM, VARIANTS
from spec.vocabulary import Action, Op


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return diagrams.generate()


def test_committed_diagrams_are_fresh(generated: dict[str, str]) -> None:
    stale = diagrams.stale_files(diagrams.DOCS, generated)
    assert not stale, f"diagrams are stale: run {diagrams.COMMAND} (stale: {stale})"


def test_every_source_has_an_svg_rendered_from_it() -> None:
    problems = diagrams.svg_problems()
    assert not problems, f"diagrams are stale: run {diagrams.COMMAND} (SVGs: {problems})"


def test_generation_is_deterministic_and_covers_every_variant_and_op(
    generated: dict[str, str],
) -> None:
    first = generated
    assert diagrams.generate() == first
    for name in VARIANTS:
        slug = diagrams._slug(name)
        for suffix in ("shared-lifecycle", "node-lifecycle", *(op.value for op in Op)):
            assert f"diagrams/{slug}-{suffix}.dot" in first
    assert list(first) == sorted(first)


def test_decision_diagram_lists_rows_in_order_with_guards() -> None:
    table = UPSTREAM.table(Op.JOIN)
    dot = diagrams.decision_dot(UPSTREAM, table)
    positions = []
    for index, r in enumerate(table.rows):
        label = f"{r.name}:\\n" + r.guard_text().replace(" and ", "\\nand ")
        assert label in dot
        assert r.then.value in dot
        positions.append(dot.index(f"row{index} ["))
    assert positions == sorted(positions)


def test_a_changed_table_makes_the_committed_diagrams_stale() -> None:
    changed = UPSTREAM.derive(
        "upstream",
        description=UPSTREAM.description,
        rows={(Op.CLOSE, 0): row("refuse", Atom.CLOSED, then=Action.ERROR_CLOSED)},
    )
    expected = diagrams.generate({"upstream": changed})
    stale = diagrams.stale_files(diagrams.DOCS, expected)
    assert "diagrams/upstream-close.dot" in stale
    assert "diagrams/upstream-join.dot" not in stale


def test_stale_check_reports_missing_changed_and_leftover_files(
    tmp_path: Path, generated: dict[str, str]
) -> None:
    expected = generated
    for rel, text in expected.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert diagrams.stale_files(tmp_path, expected) == []
    (tmp_path / "diagrams" / "upstream-join.dot").write_text("digraph {}\n", encoding="utf-8")
    (tmp_path / "diagrams" / "old.dot").write_text("digraph {}\n", encoding="utf-8")
    (tmp_path / "diagrams.md").unlink()
    assert diagrams.stale_files(tmp_path, expected) == [
        "diagrams.md",
        "diagrams/old.dot",
        "diagrams/upstream-join.dot",
    ]


def test_check_command_reports_stale_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "diagrams").mkdir()
    assert diagrams.main(["--check", "--docs", str(tmp_path)]) == 1
    assert f"diagrams are stale: run {diagrams.COMMAND}" in capsys.readouterr().out


def test_lifecycle_edges_come_from_the_effects() -> None:
    shared, node = diagrams._observe(UPSTREAM)
    # The last participant leaving a complete round opens the next one.
    assert diagrams.Edge("complete", "next round", "remove_from_participants") in shared
    assert diagrams.Edge("complete", "next round", "sanitize (prune)") in shared
    # Nothing leaves "closed".
    assert {e.target for e in shared if e.source == "closed"} == {"closed"}
    # A late node queues up; a node in a full complete round stands by.
    assert diagrams.Edge("joining", "waiting", "queue_for_next_round") in node
    assert diagrams.Edge("joining", "redundant", "stand_by") in node


def test_phase_classification() -> None:
    a = NodeId("a", 1)
    open_ = RendezvousState.build(participants={a: 0}, last_heartbeats={a: 0})
    assert diagrams.shared_phase(open_) is diagrams.SharedPhase.OPEN
    assert diagrams.shared_phase(open_.evolve(deadline=5)) is diagrams.SharedPhase.LAST_CALL
    assert diagrams.shared_phase(open_.evolve(complete=True)) is diagrams.SharedPhase.COMPLETE
    closed = open_.evolve(complete=True, closed=True)
    assert diagrams.shared_phase(closed) is diagrams.SharedPhase.CLOSED
    assert diagrams.phase_after(open_, open_.evolve(round=1)) is diagrams.SharedPhase.NEXT_ROUND


PAGE_WIDTH_PT = 900
"""Widest drawing that stays readable on the diagrams page: the page hides its table of
contents, leaving about 940 CSS px (705 pt) at a 1280 px window, so a 900 pt drawing is
shown at 0.78 of its size, and its 12 pt labels at about 12.5 px."""


def test_every_diagram_is_readable_at_page_width() -> None:
    # Left to right, the lifecycles were up to 1,133 pt wide: shown at half size, 6 px text.
    widths = {}
    for svg in sorted(diagrams.DOCS.joinpath(diagrams.DIAGRAM_DIR_NAME).glob("*.svg")):
        head = svg.read_text(encoding="utf-8")[:2000]
        m = re.search(r'<svg width="(\d+)pt"', head)
        assert m, svg
        widths[svg.name] = int(m[1])
    assert widths and max(widths.values()) <= PAGE_WIDTH_PT, {
        k: w for k, w in widths.items() if w > PAGE_WIDTH_PT
    }
    for source in diagrams.generate().values():
        assert "fontsize=9" not in source and "fontsize=11" not in source
    page = diagrams.generate()["diagrams.md"]
    assert page.startswith("---\nhide:\n  - toc\n---\n")  # the drawings get the page's width
    # Each drawing links to its full-size SVG.
    assert "[![upstream: Shared-state lifecycle](diagrams/upstream-shared-lifecycle.svg)]" in page
    row = "| `join.join_open_round` | `add_to_participants` | "
    row += "joining → participant, waiting → participant |"
    assert row in page
