"""The decision table a reader checks in decide's docstring is the one decide walks.

The rows' behaviour is tested in test_decide.py; here, that the docstring's tables and
the data (``DECISION_TABLE``, ``pod_exits.BY_OUTCOME``) name the same rows in the same
order, so a row added to one and not the other fails.
"""

from __future__ import annotations

import importlib
import re

from alpineagents_operator.deciding.decide import DECISION_TABLE, PHASES
from alpineagents_operator.deciding.pod_exits import BY_OUTCOME

# The package's face names the function decide; the tables are its module's.
decide_module = importlib.import_module("alpineagents_operator.deciding.decide")


def _tables(text: str) -> list[list[tuple[str, str]]]:
    """Each reStructuredText simple table of ``text``: its rows' first two columns (a
    cell continued on the next lines joined with spaces), the header left out."""
    lines = text.splitlines()
    borders = [i for i, line in enumerate(lines) if re.fullmatch(r"=+( +=+)+", line)]
    tables = []
    for top, head, bottom in zip(borders[::3], borders[1::3], borders[2::3], strict=True):
        spans = [m.span() for m in re.finditer(r"=+", lines[top])]
        rows: list[list[str]] = []
        for line in lines[head + 1 : bottom]:
            cells = [line[a:b].strip() if b <= len(line) else line[a:].strip() for a, b in spans]
            if cells[0] or not rows:
                rows.append(cells[:2])
            else:
                rows[-1] = [
                    f"{old} {new}".strip() for old, new in zip(rows[-1], cells[:2], strict=True)
                ]
        tables.append([(phase, seen) for phase, seen in rows])
    return tables


def test_the_docstring_names_every_row_decide_walks_in_order() -> None:
    documented, _ = _tables(decide_module.__doc__ or "")
    walked = [(row.phase, row.seen) for row in DECISION_TABLE]
    assert documented == walked


def test_every_phase_label_of_the_table_stands_for_phases() -> None:
    assert {row.phase for row in DECISION_TABLE} == set(PHASES)
    assert all(PHASES[label] for label in PHASES)


def test_the_finished_pods_table_has_a_move_for_every_outcome() -> None:
    _, finished = _tables(decide_module.__doc__ or "")
    assert {outcome for outcome, _ in finished} == set(BY_OUTCOME)
