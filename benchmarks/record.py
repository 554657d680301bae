"""Each section's last findings, kept as a record, and ``RESULTS.md`` written from them all.

A section's run writes ``results/sections/NAME.json`` (the record: its rows with their
verdicts, its detail tables, and when, where and by which command it was measured) and
``results/sections/NAME.md`` (the same as a page). ``RESULTS.md`` is rendered from every
section's record, so a section not run in a pass keeps the figures of its own last run,
and its rows say from when. Nothing on either page is typed by hand.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import REPO
from .results_page import LATENCY_SAMPLES, Page, Row

__all__ = ["Provenance", "Row", "SectionRecord", "load", "render", "save", "targets"]

RECORDS = Path("results") / "sections"
"""Where the records and section pages go, under the folder of ``RESULTS.md``."""


@dataclass
class Provenance:
    """How, when and where a section was measured."""

    command: str
    commit: str
    began: float  # time.time()
    minutes: float
    cpus: int
    machine: str
    load_start: str
    load_end: str

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.began))

    def cell(self) -> str:
        """The row's last column: the command, the commit, the date, the machine's CPUs
        and its load average (1 / 5 / 15 min) at the start and the end."""
        return (
            f"`{self.command}` at {self.commit}, {self.date}, {self.cpus} CPUs, load "
            f"{self.load_start} → {self.load_end}"
        )


@dataclass
class SectionRecord:
    """One section's findings as its last run left them."""

    section: str
    provenance: Provenance
    rows: dict[str, Row] = field(default_factory=dict)
    details: list[list[str]] = field(default_factory=list)
    peer_wins: list[str] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, section: str, provenance: Provenance, page: Page) -> SectionRecord:
        return cls(
            section,
            provenance,
            dict(page.rows),
            list(page.sections),
            list(page.peer_wins),
            list(page.not_measured),
        )

    @property
    def measured_anything(self) -> bool:
        return any(row.met is not None for row in self.rows.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SectionRecord:
        data: dict[str, Any] = json.loads(text)
        return cls(
            data["section"],
            Provenance(**data["provenance"]),
            {key: Row(**row) for key, row in data["rows"].items()},
            [list(lines) for lines in data["details"]],
            list(data["peer_wins"]),
            list(data["not_measured"]),
        )


def commit() -> str:
    """This checkout's commit, marked when the code measured differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "operator", "benchmarks/*.py", "charts"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit (no git checkout)"
    return f"{head} with uncommitted changes" if changed else head


def save(record: SectionRecord, folder: Path) -> None:
    """Write the section's record and its page under ``folder`` (the page's folder)."""
    where = folder / RECORDS
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{record.section}.json").write_text(record.to_json(), encoding="utf-8")
    (where / f"{record.section}.md").write_text(section_page(record), encoding="utf-8")


def load(folder: Path, section: str) -> SectionRecord | None:
    """The section's last record under ``folder``, or None if it never ran there."""
    path = folder / RECORDS / f"{section}.json"
    if not path.exists():
        return None
    return SectionRecord.from_json(path.read_text(encoding="utf-8"))


_HEAD = ["what", "measured", "samples", "goal", "verdict", "measured by"]


def _cells(row: Row, provenance: str) -> str:
    measured = row.measured + (f" ({row.setting})" if row.setting else "")
    cells = [row.what, measured, row.samples or "-", row.goal, row.verdict, provenance]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _table_head() -> list[str]:
    return ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]


def section_page(record: SectionRecord) -> str:
    """The section's own page: when and how it was measured, its rows, its details."""
    p = record.provenance
    lines = [
        f"# Benchmark section `{record.section}`",
        "",
        f"Written by `{p.command}` at commit {p.commit} on {p.date} in {p.minutes:.1f} min. "
        f"Machine: {p.machine}; load average {p.load_start} at the start, {p.load_end} at "
        "the end (the machine is shared).",
        "",
        *_table_head(),
        *(_cells(row, p.date) for row in record.rows.values()),
        "",
    ]
    lines += [f"- Not measured: {text}" for text in record.not_measured]
    lines += [f"- {text}" for text in record.peer_wins]
    for part in record.details:
        lines += ["", *part]
    return "\n".join(lines).rstrip() + "\n"


def render(
    records: dict[str, SectionRecord | None],
    section_rows: dict[str, list[str]],
    order: list[str],
    ran: list[str],
    earlier: dict[str, str] | None = None,
) -> str:
    """``RESULTS.md`` from every section's record (None: never run); ``ran``: this pass's;
    ``earlier``: a page, by section, of what a section measured before it had a record."""
    earlier = earlier or {}
    rows: dict[str, tuple[Row, str]] = {}
    for section, keys in section_rows.items():
        record = records.get(section)
        for key in keys:
            if record is not None and key in record.rows:
                rows[key] = (record.rows[key], record.provenance.cell())
            else:
                before = earlier.get(section)
                never = Row(
                    f"`{key}`",
                    f"no record yet; its earlier page: [{before}]({before})" if before else "-",
                    "-",
                    None,
                    samples=f"section `{section}` has no record yet",
                )
                rows[key] = (never, f"`python -m benchmarks {section}`")
    shown = [rows[key] for key in order if key in rows]
    shown += [rows[key] for key in rows if key not in order]
    verdicts = [row.verdict for row, _ in shown]
    met = sum(1 for row, _ in shown if row.counts_as_met)
    lines = [
        "# Benchmark results",
        "",
        "Written by `python -m benchmarks [SECTION ...] [--quick]` from each section's record "
        f"(`benchmarks/{RECORDS}/SECTION.json`, with the section's page beside it): every row, "
        "its figures and its verdict come from the code that measured them. A section not "
        "run in a pass keeps the figures of its own last run: each row names the command, "
        "commit, date and machine that measured it. A latency goal (a p50 or p95) is judged "
        f'over at least {LATENCY_SAMPLES} samples, or its verdict is "too few samples"; a '
        "reliability goal counts every pass, failed passes included. Figures are measured "
        "with the chart's defaults unless the row names the setting that differs.",
        "",
        f"This pass ran: {', '.join(f'`{s}`' for s in ran) or 'no section'}.",
        "",
        "## Targets",
        "",
        *_table_head(),
        *(_cells(row, where) for row, where in shown),
        "",
        f"{met} of {len(shown)} targets met; "
        f"{sum(1 for v in verdicts if v == 'not met')} not met, "
        f"{sum(1 for v in verdicts if v.startswith('too few'))} with too few samples, "
        f"{sum(1 for v in verdicts if v == 'not measured')} not measured.",
        "",
        "## Sections",
        "",
        "| section | last measured by | machine | minutes |",
        "|---|---|---|---:|",
    ]
    for section in section_rows:
        record = records.get(section)
        if record is None:
            lines.append(f"| `{section}` | never (no record) | - | - |")
            continue
        p = record.provenance
        lines.append(f"| `{section}` | {p.cell()} | {p.machine} | {p.minutes:.1f} |")
    present = [r for r in records.values() if r is not None]
    wins = [text for r in present for text in r.peer_wins]
    if wins:
        lines += ["", "## Where LangGraph wins or the comparison flatters us", ""]
        lines += [f"- {text}" for text in wins]
    missing = [text for r in present for text in r.not_measured]
    if missing:
        lines += ["", "## Not measured", ""]
        lines += [f"- {text}" for text in missing]
    for record in present:
        for part in record.details:
            lines += ["", *part]
        if record.details:
            lines += ["", f"(Section `{record.section}`, {record.provenance.date}.)"]
    return "\n".join(lines).rstrip() + "\n"


VERDICTS = ("**met**", "not met", "not measured", "too few samples")


def targets(page: str) -> list[dict[str, str]]:
    """The targets table of a ``RESULTS.md`` (or a section page) read back: one dict a row,
    by column. Raises ValueError where the table is not as :func:`render` writes it."""
    lines = page.splitlines()
    head = "| " + " | ".join(_HEAD) + " |"
    if head not in lines:
        raise ValueError("no targets table")
    rows = []
    for line in lines[lines.index(head) + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != len(_HEAD):
            raise ValueError(f"a row of {len(cells)} cells, not {len(_HEAD)}: {line}")
        row = dict(zip(_HEAD, cells, strict=True))
        if not row["verdict"].startswith(VERDICTS):
            raise ValueError(f"a verdict not computed by Row.verdict: {line}")
        rows.append(row)
    return rows
