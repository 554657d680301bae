"""The docs match the tree: every relative link and image of the README and ``docs/``
resolves, and every module of 150 lines or more is named in ``docs/architecture.md``
(the map the README says covers every module)."""

from __future__ import annotations

import re
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
