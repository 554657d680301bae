"""The docs match the tree: every relative link and image of the README and ``docs/``
resolves, and every module of 150 lines or more is named in ``docs/architecture.md``
(the map the README says covers every module)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_image_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or a heading of the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to what is not there: {broken}"


def test_every_module_of_150_lines_or_more_is_on_the_architecture_map() -> None:
    mapped = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [
        str(module.relative_to(REPO))
        for module in sorted((REPO / "operator").rglob("*.py"))
        if len(module.read_text(encoding="utf-8").splitlines()) >= 150 and module.name not in mapped
    ]
    assert not missing, f"add these to docs/architecture.md: {missing}"


def test_no_page_speaks_of_issue_numbers() -> None:
    """ "Issue 13" means something to us and nothing to a reader."""
    found = [
        f"{page.relative_to(REPO)}: {match.group(0)}"
        for page in PAGES
        for match in re.finditer(r"\b[Ii]ssues? #?\d+", page.read_text(encoding="utf-8"))
    ]
    assert not found, found


def test_every_example_a_page_names_exists() -> None:
    missing = [
        f"{page.relative_to(REPO)}: {name}"
        for page in PAGES
        for name in re.findall(r"\bexamples/[\w./-]*\w", page.read_text(encoding="utf-8"))
        if not (REPO / name).exists()
    ]
    assert not missing, missing


def test_every_picture_in_docs_is_shown_on_a_page() -> None:
    shown = "".join(page.read_text(encoding="utf-8") for page in PAGES)
    unshown = [p.name for p in sorted((REPO / "docs").glob("*.png")) if p.name not in shown]
    assert not unshown, f"link these from a page, or delete them: {unshown}"


def _cli_reference_blocks() -> dict[str, str]:
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    return dict(re.findall(r"## `alpineagents ?([\w-]*)`\n\n```text\n(.*?)\n```", page, re.DOTALL))


def test_the_cli_reference_is_what_help_prints() -> None:
    """docs/cli.md (``python scripts/cli_reference.py``) against each ``--help``, run as
    a user runs it, so the page never names a flag that is gone or misses a new one."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(REPO / "operator")}
    blocks = _cli_reference_blocks()
    printed = subprocess.run(
        [sys.executable, "-m", "alpineagents", "--help"], env=env, capture_output=True, text=True
    ).stdout
    commands = re.findall(r"^    (\w+) ", printed, re.MULTILINE)
    assert sorted(blocks) == sorted(["", *commands]), "run python scripts/cli_reference.py"
    for name, block in blocks.items():
        args = [name, "--help"] if name else ["--help"]
        help_text = subprocess.run(
            [sys.executable, "-m", "alpineagents", *args], env=env, capture_output=True, text=True
        ).stdout
        assert block == help_text.rstrip(), (
            f"alpineagents {name}: run python scripts/cli_reference.py"
        )


def test_every_page_is_in_the_docs_index() -> None:
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [
        p.name
        for p in sorted((REPO / "docs").glob("*.md"))
        if p.name != "README.md" and f"({p.name})" not in index
    ]
    assert not missing, f"add a line for each to docs/README.md: {missing}"
