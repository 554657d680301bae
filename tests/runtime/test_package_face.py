"""The package's face: the public names, and what importing one part loads.

The operator imports the runtime's contract and stores, never the agent; these tests run
each import in a fresh interpreter, since this one has loaded everything already.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import alpineagents
from tests.paths import REPO

PACKAGE_ROOT = REPO / "operator"
LIBRARY_PAGE = REPO / "docs" / "library.md"


def _modules_loaded_by(statement: str) -> set[str]:
    """Our modules in ``sys.modules`` after ``statement`` runs in a fresh interpreter."""
    probe = (
        f"{statement}\n"
        "import json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] in ('alpineagents', 'alpineagents_operator'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(PACKAGE_ROOT), "PATH": ""},
    )
    loaded: list[str] = json.loads(done.stdout)
    return set(loaded)


def test_the_contract_loads_one_module_of_ours() -> None:
    assert _modules_loaded_by("import alpineagents.pod_contract") == {
        "alpineagents",
        "alpineagents.pod_contract",
    }


def test_the_operator_package_loads_nothing_of_the_runtime() -> None:
    assert _modules_loaded_by("import alpineagents_operator") == {"alpineagents_operator"}


def test_the_whole_operator_never_loads_the_agent_runner_or_viewer() -> None:
    loaded = _modules_loaded_by("import alpineagents_operator.edge.handlers")
    assert (
        "alpineagents_operator.reconciling.reconciler" in loaded
    )  # the probe did load the operator
    for kept_out in ("alpineagents.agent", "alpineagents.runner", "alpineagents.viewer"):
        assert kept_out not in loaded


def test_a_public_name_loads_only_its_module() -> None:
    loaded = _modules_loaded_by("from alpineagents import Message")
    assert loaded == {"alpineagents", "alpineagents.messages"}


def test_every_public_name_resolves() -> None:
    for name in alpineagents.__all__:
        assert getattr(alpineagents, name) is not None
    assert sorted(dir(alpineagents)) == dir(alpineagents)
    assert set(alpineagents.__all__) <= set(dir(alpineagents))


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        alpineagents.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as error:
        assert "NoSuchThing" in str(error)
    else:
        raise AssertionError("alpineagents.NoSuchThing resolved")


def test_the_public_names_are_the_ones_the_library_page_lists() -> None:
    page = LIBRARY_PAGE.read_text(encoding="utf-8")
    paragraph = page.split("The public names (`alpineagents.__all__`)", 1)[1].split("\n\n")[0]
    listed = re.findall(r"`(\w+)`", paragraph.split(":", 1)[1])
    assert listed == list(alpineagents.__all__)
