"""A griffe extension for the API reference: Sphinx roles in docstrings become Markdown.

The docstrings are written for Python readers, with Sphinx's cross-reference roles
(``:class:`NodeId```, ``:func:`~spec.step```, ``:meth:`Store.wait```), which read well in
the source and in ``help()``; mkdocstrings renders Markdown, where a role would show as
raw text. This extension rewrites each role, when mkdocstrings loads a package, into

- a Markdown cross-reference, ``[`NodeId`][spec.state.NodeId]``, when the name resolves
  (from the scope of the object whose docstring it is: its members, its module's imports,
  or a full dotted path) to an object the reference page renders (docs/reference.md's
  ``:::`` lines and their ``members`` options; public, with a docstring); or
- plain code, ```NodeId```, when it does not (a private helper, a constant without a
  docstring, a name of another project), so the build never links to nothing.

``~`` keeps only the last part of the name as the label, as in Sphinx. Loaded by
mkdocs.yml (``plugins: mkdocstrings: handlers: python: options: extensions``);
``scripts/docs.sh`` fails the build if a role is left in the rendered reference.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):`(~?)([^`]+?)`")
"""A Sphinx cross-reference role: ``:kind:`target``` or ``:kind:`~target```."""

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
"""The page whose ``:::`` lines say which objects are rendered (and so can be linked)."""


def rendered_scopes(page: Path = REFERENCE) -> dict[str, set[str] | None]:
    """Each module the reference renders, with the members it is restricted to (None: all).

    Reads the ``::: module`` lines and, below each, an ``options: members:`` list."""
    scopes: dict[str, set[str] | None] = {}
    current: str | None = None
    in_members = False
    for line in page.read_text(encoding="utf-8").splitlines():
        header = re.fullmatch(r":::\s+(\S+)", line.strip())
        if header:
            current, in_members = header[1], False
            scopes[current] = None
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped == "members:":
            in_members = True
            scopes[current] = set()
        elif in_members and stripped.startswith("- "):
            members = scopes[current]
            assert members is not None
            members.add(stripped[2:].strip())
        elif stripped and not line.startswith(" "):
            current, in_members = None, False
    return scopes


def _is_rendered(obj: griffe.Object, scopes: dict[str, set[str] | None]) -> bool:
    """Whether the reference page renders ``obj`` (and so has an anchor for its path)."""
    path = obj.path
    for module, members in scopes.items():
        if path != module and not path.startswith(module + "."):
            continue
        rest = path[len(module) + 1 :].split(".") if path != module else []
        if any(part.startswith("_") and not part.startswith("__") for part in rest):
            return False
        if members is not None and rest and rest[0] not in members:
            return False
        return path == module or obj.has_docstrings
    return False


def _lookup(name: str, scope: griffe.Object, loader: griffe.GriffeLoader) -> Any:
    """The object ``name`` means in the docstring of ``scope``, or None."""
    head, _, tail = name.partition(".")
    candidates: list[str] = []
    here: griffe.Object | None = scope
    while here is not None:  # the object itself, its class, its module, ...
        try:
            candidates.append(here.resolve(head))
            break
        except (griffe.NameResolutionError, ValueError):
            here = here.parent
    candidates.append(head)  # a full dotted path: spec.tables.Table
    for found in candidates:
        path = f"{found}.{tail}" if tail else found
        try:
            obj = loader.modules_collection.get_member(path)
        except (KeyError, ValueError, griffe.AliasResolutionError):
            continue
        try:
            return obj.final_target if obj.is_alias else obj
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
    return None


def rewrite(
    text: str,
    scope: griffe.Object,
    loader: griffe.GriffeLoader,
    scopes: dict[str, set[str] | None],
) -> str:
    """``text`` with every Sphinx role replaced (see the module docstring)."""

    def one(match: re.Match[str]) -> str:
        tilde, target = match[1], match[2].strip()
        label = target.rsplit(".", 1)[-1] if tilde else target
        obj = _lookup(target, scope, loader)
        if obj is not None and _is_rendered(obj, scopes):
            return f"[`{label}`][{obj.path}]"
        return f"`{label}`"

    return ROLE.sub(one, text)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            assert isinstance(member, griffe.Object)
            yield from _objects(member)


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring of a package once it is loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes = rendered_scopes()

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None and ROLE.search(obj.docstring.value):
                obj.docstring.value = rewrite(obj.docstring.value, obj, loader, self.scopes)
