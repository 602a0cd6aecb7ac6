"""The checker compiled with mypyc: the same sources, built once, run with ``--native``.

``python -m model_check --native ...`` copies the ``spec`` and ``model_check`` packages
into a build directory, compiles their hot modules (:data:`COMPILED`) to C extension
modules with mypyc, and runs the same command line again in a child interpreter that
imports the packages from there. Nothing is written twice: the compiled modules are
built from copies of the very files the interpreter runs, and the only change made to
the copies is a decorator that keeps a few classes ordinary Python classes
(:data:`PYTHON_CLASSES`). The output is the same, byte for byte; only the speed differs
(``benchmarks/bench_model_check.py`` prints both side by side).

The build directory is named by a digest of the copied sources, the interpreter and the
mypy version (:func:`build_key`), so an edit to any of them builds afresh and an
unchanged tree reuses the build. A build takes a few minutes (mypyc and a C compiler,
``gcc`` or ``cc``, must be installed: ``pip install mypy``). Concurrent builds of the
same tree do not collide: each builds in its own temporary directory and the first to
finish renames it into place.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PACKAGES = ("spec", "model_check")
"""The packages copied into the build directory (the child imports both from there)."""

COMPILED = (
    "spec/__init__.py",
    "spec/vocabulary.py",
    "spec/settings.py",
    "spec/state.py",
    "spec/codec.py",
    "spec/effects.py",
    "spec/variants.py",
    "spec/tables.py",
    "spec/machine.py",
    "spec/invariants.py",
    "spec/wire.py",
    "spec/storage.py",
    "model_check/world.py",
    "model_check/model.py",
    "model_check/canon.py",
    "model_check/explore.py",
)
"""The modules compiled: everything a search step runs (the protocol, the model, the
fingerprints and the search loop). The rest (the command line, the prover, the
diagrams) runs interpreted from the same build directory."""

PYTHON_CLASSES: dict[str, tuple[str, ...]] = {
    "spec/state.py": ("NodeId", "RendezvousState"),
    "spec/machine.py": ("Local",),
    "model_check/world.py": ("Proc",),
}
"""Classes kept as ordinary Python classes in the compiled modules: ``NodeId`` derives
from a named tuple (mypyc compiles no subclass of a built-in type), and the others cache
their hash in, or copy themselves through, their instance dictionary, which a native
class does not have."""

_DECORATOR = "@mypyc_attr(native_class=False)\n"
_IMPORT = "from mypy_extensions import mypyc_attr\n"
NATIVE_ENV = "MODEL_CHECK_NATIVE"
"""Set (to the build directory) in the child a ``--native`` run starts; a child refuses
to start another."""
BUILD_DIR_ENV = "MODEL_CHECK_NATIVE_DIR"
"""Where builds go (default: ``$XDG_CACHE_HOME/rdzv-model-check``, else
``~/.cache/rdzv-model-check``)."""
BUILD_TIMEOUT_S = 1800
"""Longest a build may take before it is given up (it takes a few minutes on 2 cores)."""


class NativeBuildError(RuntimeError):
    """The compiled build could not be made; the message says why and what to do."""


def source_root() -> Path:
    """The directory holding the ``spec`` and ``model_check`` packages being run."""
    return Path(__file__).resolve().parent.parent


def _sources(root: Path) -> list[Path]:
    files: list[Path] = []
    for package in PACKAGES:
        files.extend(sorted((root / package).rglob("*.py")))
    return files


def build_key(root: Path) -> str:
    """A digest of what a build depends on: the copied sources (names and bytes), the
    interpreter and mypy's version."""
    h = hashlib.sha256()
    h.update(sys.version.encode())
    h.update(_mypy_version().encode())
    for path in _sources(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _mypy_version() -> str:
    try:
        return importlib.metadata.version("mypy")
    except importlib.metadata.PackageNotFoundError:
        raise NativeBuildError(
            "--native needs mypyc, which comes with mypy: pip install mypy "
            "(or run without --native)"
        ) from None


def cache_dir() -> Path:
    configured = os.environ.get(BUILD_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rdzv-model-check"


def patch_source(text: str, classes: Sequence[str], name: str) -> str:
    """``text`` with each class of ``classes`` decorated to stay a Python class, and the
    decorator imported after the ``from __future__`` line. Raises if a class is missing,
    so a renamed class cannot silently become native."""
    for cls in classes:
        pattern = re.compile(rf"^((?:@[^\n]*\n)*)class {cls}\b", re.MULTILINE)
        text, count = pattern.subn(lambda m: _DECORATOR + m.group(0), text, count=1)
        if count != 1:
            raise NativeBuildError(f"{name}: no class {cls} to keep as a Python class")
    future = "from __future__ import annotations\n"
    if classes:
        if future not in text:
            raise NativeBuildError(f"{name}: no 'from __future__ import annotations' line")
        text = text.replace(future, future + _IMPORT, 1)
    return text


def build(root: Path | None = None, *, log: bool = True) -> Path:
    """The build directory for the sources under ``root`` (default: these), built first
    if needed. Returns the directory to put first on ``sys.path``."""
    root = source_root() if root is None else root
    key = build_key(root)
    final = cache_dir() / f"native-{key}"
    if (final / "BUILT").exists():
        return final
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise NativeBuildError(
            "--native needs a C compiler (gcc or cc) to build the compiled checker: "
            "apt-get install gcc (or run without --native)"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"native-{key}.", dir=final.parent))
    try:
        for path in _sources(root):
            rel = path.relative_to(root).as_posix()
            dst = work / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text(encoding="utf-8")
            dst.write_text(patch_source(text, PYTHON_CLASSES.get(rel, ()), rel), "utf-8")
        if log:
            print(
                f"model_check: building the compiled checker in {final} "
                "(mypyc; a few minutes, once per source tree)",
                file=sys.stderr,
                flush=True,
            )
        proc = subprocess.run(
            [sys.executable, "-m", "mypyc", *COMPILED],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            env=dict(os.environ, MYPY_FORCE_COLOR="0"),
            check=False,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise NativeBuildError(
                f"mypyc could not build the compiled checker (exit {proc.returncode}):\n"
                f"{tail}\nrun without --native, or report this with the lines above"
            )
        shutil.rmtree(work / "build", ignore_errors=True)
        (work / "BUILT").write_text(key + "\n", encoding="utf-8")
        try:
            work.rename(final)
        except OSError:
            if not (final / "BUILT").exists():
                raise
            # Another build of the same tree finished first: use it.
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final


def run(args: Sequence[str]) -> int:
    """Run ``python -m model_check ARGS`` on the compiled build (built first if needed);
    returns its exit code."""
    if os.environ.get(NATIVE_ENV):
        raise NativeBuildError("--native given inside a --native run")
    where = build(log="--quiet" not in args and "--json" not in args)
    env = dict(os.environ)
    env[NATIVE_ENV] = str(where)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(where), env.get("PYTHONPATH", "")) if p)
    # -P: not the working directory first on sys.path, or a checkout there would be
    # imported instead of the build.
    child = subprocess.Popen([sys.executable, "-P", "-m", "model_check", *args], env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        # The child got the same Ctrl-C (one process group) and reports its partial
        # result; wait for it so its output comes before the shell prompt.
        return child.wait()


def check_child() -> None:
    """Raise if this is the child of a ``--native`` run but runs the interpreted modules
    (a build directory that no longer holds the compiled ones)."""
    where = os.environ.get(NATIVE_ENV)
    if where and not compiled():
        raise NativeBuildError(
            f"a --native run imported the interpreted modules, not the build in {where}; "
            "remove that directory and run again"
        )


def compiled() -> bool:
    """Whether this interpreter runs the compiled modules."""
    from model_check import model

    return not str(model.__file__).endswith(".py")
