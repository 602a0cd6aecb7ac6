"""The dependency rules of ARCHITECTURE.md, checked on the source's syntax trees.

spec must stay pure (no clocks, randomness, threads, sockets, OS access, pickle,
logging side effects or our other packages); spec and rdzv never import model_check.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SPEC_FORBIDDEN_MODULES = frozenset(
    {
        "time",
        "datetime",
        "random",
        "secrets",
        "uuid",
        "threading",
        "_thread",
        "multiprocessing",
        "concurrent",
        "asyncio",
        "socket",
        "ssl",
        "select",
        "selectors",
        "os",
        "sys",
        "io",
        "pathlib",
        "shutil",
        "subprocess",
        "signal",
        "pickle",
        "marshal",
        "shelve",
        "logging",
        "warnings",
        "rdzv",
        "model_check",
    }
)
# Calls that read a clock or randomness even when reached through an allowed import.
SPEC_FORBIDDEN_CALLS = frozenset(
    {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "time_ns", "random"}
)


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            found.append((node.lineno, "__import__"))
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


def test_spec_modules_exist() -> None:
    assert len(_modules("spec")) >= 8


@pytest.mark.parametrize("path", _modules("spec"), ids=lambda p: p.name)
def test_spec_imports_nothing_impure(path: Path) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {mod}"
        for line, mod in _imports(path)
        if _top(mod) in SPEC_FORBIDDEN_MODULES or mod == "__import__"
    ]
    assert not bad, "spec must stay pure:\n" + "\n".join(bad)


def _outside_stdlib(path: Path) -> list[str]:
    return [
        f"{path.name}:{line} imports {mod}"
        for line, mod in _imports(path)
        if _top(mod) not in sys.stdlib_module_names and _top(mod) not in {"spec", "__future__"}
    ]


@pytest.mark.parametrize("path", _modules("spec"), ids=lambda p: p.name)
def test_spec_depends_on_the_standard_library_only(path: Path) -> None:
    bad = _outside_stdlib(path)
    assert not bad, "spec may import only the standard library and itself:\n" + "\n".join(bad)


def test_the_stdlib_check_would_catch_a_third_party_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import json\nimport numpy\nfrom spec import state\nfrom redis import Redis\n"
    )
    assert [entry.rsplit(" ", 1)[1] for entry in _outside_stdlib(sample)] == ["numpy", "redis"]


@pytest.mark.parametrize("path", _modules("spec"), ids=lambda p: p.name)
def test_spec_calls_no_clock(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in SPEC_FORBIDDEN_CALLS:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {name}()")
    assert not bad, "spec never reads a clock or randomness:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "path", _modules("spec") + _modules("rdzv"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_spec_and_rdzv_do_not_import_model_check(path: Path) -> None:
    bad = [f"line {line}" for line, mod in _imports(path) if _top(mod) == "model_check"]
    assert not bad, f"{path.relative_to(ROOT)} imports model_check at {bad}"


def test_the_checker_would_catch_a_violation(tmp_path: Path) -> None:
    # Guard against a vacuous test: the scanner must see all three spellings.
    sample = tmp_path / "sample.py"
    sample.write_text("import time\nfrom os import path\nx = __import__('random')\n")
    assert {mod for _, mod in _imports(sample)} == {"time", "os", "__import__"}
