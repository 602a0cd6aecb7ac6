"""Every Markdown table in the docs is well formed: each row has as many cells as its header.

A row pasted into the wrong table (a five-column row in a two-column table) renders as a
silently truncated row, and mkdocs does not complain; this test does.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_SPAN = re.compile(r"`[^`]*`")
CELL_BAR = re.compile(r"(?<!\\)\|")


def cells(line: str) -> int:
    """Cells in one table row; bars inside code spans or escaped do not separate cells."""
    bare = CODE_SPAN.sub("x", line.strip())
    return len(CELL_BAR.split(bare)) - 2


def table_problems(text: str) -> list[str]:
    problems: list[str] = []
    header: int | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|"):
            header = None
            continue
        count = cells(line)
        if header is None:
            header = count
        elif count != header:
            problems.append(f"line {number}: {count} cells, its table has {header}: {line[:70]}")
    return problems


def test_cell_counting_sees_through_code_spans_and_escapes() -> None:
    assert cells("| a | b |") == 2
    assert cells("| `a | b` | c |") == 2
    assert cells(r"| a \| b | c |") == 2
    assert table_problems("| a | b |\n|---|---|\n| 1 | 2 | 3 |\n") == [
        "line 3: 3 cells, its table has 2: | 1 | 2 | 3 |"
    ]
    assert table_problems("| a |\n|---|\n\n| a | b |\n|---|---|\n") == []


def test_every_docs_table_row_has_its_headers_cell_count() -> None:
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    assert len(pages) > 5
    found = {
        str(page.relative_to(ROOT)): problems
        for page in pages
        if (problems := table_problems(page.read_text(encoding="utf-8")))
    }
    assert not found, f"malformed Markdown tables: {found}"
