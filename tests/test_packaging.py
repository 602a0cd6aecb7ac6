"""The package metadata a package index shows: licence, version, classifiers, README.

setuptools reads pyproject.toml here exactly as a build does (expanding the version from
``rdzv.__version__``), with every warning an error, so a form that warns on every build
(such as the licence table) fails the test.
"""

from __future__ import annotations

import logging
import re
import tomllib
import warnings
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

import rdzv

ROOT = Path(__file__).resolve().parent.parent


def test_setuptools_reads_the_metadata_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("error")
        config = read_configuration(ROOT / "pyproject.toml", expand=True)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    project = config["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    assert project["version"] == rdzv.__version__  # one source, read without importing
    assert any(c.startswith("License ::") for c in project["classifiers"]) is False  # SPDX only
    assert "Typing :: Typed" in project["classifiers"]


def test_the_version_is_written_once() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in doc["project"] and doc["project"]["dynamic"] == ["version"]
    assert doc["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rdzv.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", rdzv.__version__)


def test_the_licence_file_is_bsd_3_clause_of_the_rdzv_authors() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License\n")
    assert re.search(r"^Copyright \(c\) \d{4}, the rdzv authors$", text, re.M)
    assert "Neither the name of the copyright holder nor the names of its" in text


def test_readme_links_work_on_a_package_index() -> None:
    # A package index shows the README away from the repository: a relative link there
    # points nowhere. Links must be absolute (or in-page anchors); paths are named as code.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
    relative = [t for t in targets if not re.match(r"(https?://|mailto:|#)", t)]
    assert relative == [], f"README links that break on a package index: {relative}"


def test_the_changelog_names_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## {rdzv.__version__}\n" in text
