"""The compiled checker (``--native``): built from the same sources, same output.

The build is made once per source tree (``model_check/native.py``; a few minutes on 2
cores) in the default cache directory, which ``.ci/run`` fills before the tests, so the
tests here and the benchmark smoke test share it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from model_check import native

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("wall_seconds", "peak_rss_mib")
"""The result fields that depend on the machine, not on the search."""


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "model_check", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        timeout=native.BUILD_TIMEOUT_S + 600,
        check=False,
    )


@pytest.fixture(scope="module")
def build() -> Path:
    return native.build(ROOT, log=False)


def test_the_build_compiles_every_hot_module(build: Path) -> None:
    for rel in native.COMPILED:
        stem = Path(rel).with_suffix("")
        built = sorted(build.glob(f"{stem}.*.so"))
        assert len(built) == 1, (rel, sorted(p.name for p in build.rglob("*.so")))
    # The rest runs interpreted, from copies of the same files.
    assert (build / "model_check" / "__main__.py").read_bytes() == (
        ROOT / "model_check" / "__main__.py"
    ).read_bytes()


@pytest.mark.parametrize(
    "args",
    [
        # a search that holds, with a fault, under symmetry reduction
        ("--protocol=hardened", "--nodes=3", "--crash=1", "--max-states=2000"),
        # torch's protocol under the agent workload: finding 6's counterexample
        ("--nodes=3",),
        # compares machine states and stored states by value: compiled with the states'
        # == left to @dataclass (identity under mypyc), this printed a false
        # closed_reopens_empty after 7,978 states
        (
            "--protocol=hardened",
            "--nodes=4",
            "--min-nodes=2",
            "--max-nodes=2",
            "--max-states=12000",
        ),
        # a random walk with every fault
        (
            "--mode=random",
            "--protocol=scale",
            "--nodes=16",
            "--crash=2",
            "--cas-unknown=1",
            "--store-down=1",
            "--skew=2",
            "--steps=400",
            "--seed=7",
        ),
    ],
)
def test_native_runs_give_the_interpreted_result(
    build: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    docs = []
    traces = []
    trace = tmp_path / "trace.json"  # one path: the result names it
    for flag in ([], ["--native"]):
        trace.unlink(missing_ok=True)
        done = _check("--json", "--quiet", f"--trace-out={trace}", *flag, *args)
        assert done.returncode in (0, 1, 3), done.stderr  # holds, violated, bounded
        doc = json.loads(done.stdout)
        for key in TIMING:
            doc.pop(key)
        docs.append((done.returncode, doc))
        traces.append(trace.read_bytes() if trace.exists() else None)
    assert docs[0] == docs[1]
    assert traces[0] == traces[1]


def test_the_child_runs_the_compiled_modules(build: Path) -> None:
    probe = "from model_check import native; print(native.compiled())"
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(build)),
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "True", done.stderr
    assert not native.compiled()  # this interpreter runs the sources


def test_a_native_run_that_imports_the_sources_refuses_to_run(tmp_path: Path) -> None:
    done = _check("--nodes=2", env={native.NATIVE_ENV: str(tmp_path)})
    assert done.returncode == 2
    assert "imported the interpreted modules" in done.stderr
    assert str(tmp_path) in done.stderr


def test_native_inside_a_native_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.NATIVE_ENV, "/some/build")
    with pytest.raises(native.NativeBuildError, match="inside a --native run"):
        native.run(["--nodes=2"])


def test_patch_keeps_the_listed_classes_python_classes() -> None:
    text = (
        '"""doc"""\n\nfrom __future__ import annotations\n\n'
        "@dataclass(frozen=True)\nclass Local:\n    x: int\n\nclass Other:\n    pass\n"
    )
    out = native.patch_source(text, ("Local",), "m.py")
    assert "from __future__ import annotations\nfrom mypy_extensions import mypyc_attr\n" in out
    assert "@mypyc_attr(native_class=False)\n@dataclass(frozen=True)\nclass Local:" in out
    assert "native_class=False)\nclass Other" not in out
    assert native.patch_source(text, (), "m.py") == text


def test_patch_refuses_a_class_that_is_gone() -> None:
    text = "from __future__ import annotations\n\nclass Renamed:\n    pass\n"
    with pytest.raises(native.NativeBuildError, match=r"m\.py: no class Local"):
        native.patch_source(text, ("Local",), "m.py")


def test_every_listed_class_exists_in_its_module() -> None:
    for rel, classes in native.PYTHON_CLASSES.items():
        text = (ROOT / rel).read_text(encoding="utf-8")
        native.patch_source(text, classes, rel)  # raises if one is missing
        assert rel in native.COMPILED


def _filled(cls: Any) -> Any:
    """An instance of the dataclass ``cls`` with every compared field 1."""
    made = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.compare:
            object.__setattr__(made, f.name, 1)
    return made


def test_every_listed_dataclass_defines_its_own_eq() -> None:
    """mypyc compiles ``==`` on a Python class without an ``__eq__`` of its own as
    identity, so each dataclass kept a Python class writes its ``__eq__`` out
    (:func:`spec.state.compared_values`) rather than leaving it to ``@dataclass``."""
    for rel, classes in native.PYTHON_CLASSES.items():
        module = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
        for name in classes:
            cls: Any = getattr(module, name)
            if not dataclasses.is_dataclass(cls):
                continue  # NodeId: a tuple, compared by tuple's own ==
            eq = cls.__dict__["__eq__"]
            assert eq.__code__.co_filename == module.__file__, (rel, name, eq.__code__)
            one, other = _filled(cls), _filled(cls)
            assert one == other and one is not other
            object.__setattr__(other, dataclasses.fields(cls)[0].name, 2)
            assert one != other


def test_the_build_key_follows_the_sources(tmp_path: Path) -> None:
    for package in native.PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package)
    key = native.build_key(tmp_path)
    assert key == native.build_key(ROOT)
    machine = tmp_path / "spec" / "machine.py"
    machine.write_text(machine.read_text(encoding="utf-8") + "\n# edited\n", "utf-8")
    assert native.build_key(tmp_path) != key


def test_without_mypy_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(native.NativeBuildError, match="pip install mypy"):
        native.build_key(ROOT)


def test_without_a_c_compiler_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(native.BUILD_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(native.NativeBuildError, match="apt-get install gcc"):
        native.build(ROOT, log=False)
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind
