"""``docs/reliability.md``: written by the campaign from what it ran.

Each campaign test adds its section to a :class:`ReliabilityReport`; at the end of the
session the report rewrites the runtime part of the page. Everything from the line
``OPERATOR_MARKER`` on belongs to the operator-side campaign (the real node), which
appends there; it is kept as it is.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from tests.campaign.kill_fuzz import Totals
from tests.paths import REPO

PAGE = REPO / "docs" / "reliability.md"
OPERATOR_MARKER = "<!-- operator-campaign: the operator-side campaign writes below this line -->"
OPERATOR_PLACEHOLDER = (
    "## On the real node (operator side)\n\n"
    "Not run yet: the operator-side campaign (30 AgentRuns with pod losses, operator kills,\n"
    "a store outage, a silent node, a zombie writer, malformed AgentRuns) writes its\n"
    "results here.\n"
)

SECTION_ORDER = ("Kill fuzzing of the library", "Disk full (FileStore)", "Bad input")

INVARIANTS = (
    ("saved entries only grow", "what was saved is a prefix of what is saved later"),
    ("seqs have no gaps", "the saved seqs are 0, 1, 2, ..."),
    ("two loads are equal", "a State loaded twice from one save is the same State"),
    ("an open call is closed as aborted", "load closes a call in flight with `aborted`"),
    ("no call is started twice", "tool marker files: at most one start per call"),
    ("an aborted call is never started again", "no start marker after its abort"),
    ("an aborted call keeps its aborted result", "the run goes on with that result"),
    ("a call with a saved result ran exactly once", "it is not run again on resume"),
    ("every call has exactly one result", "in the history of every answered run"),
    ("every planned call was made", "every round's calls reached the tools"),
    ("a message is saved once send returned", "notes sent by tools during the run"),
    (
        "Ctrl+C in a run leaves all of it saved, nothing open",
        "the child's State equals the store's, and load adds nothing",
    ),
    ("no dangling tool call reaches the model", "every model request the server received"),
    ("the run ends answered", "every run, resumed after each fault"),
)


@dataclass
class ReliabilityReport:
    """What the campaign tests of one session ran, to be written to :data:`PAGE`."""

    seed: int
    command: str
    kill_fuzz: list[Totals] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)
    bad_input: dict[str, str] = field(default_factory=dict)
    """What a user sees for each bad input (the error message, or what happens)."""

    def add_section(self, title: str, markdown: str) -> None:
        self.sections[title] = markdown

    def saw_bad_input(self, what: str, seen: str, hide: dict[str, str] | None = None) -> None:
        """Record what a user sees for one bad input; ``hide`` replaces the parts that
        change from run to run (temporary folders, bucket names, ports) by a name."""
        for part, name in (hide or {}).items():
            seen = seen.replace(part, name)
        self.bad_input[what] = seen

    def write(self, page: Path = PAGE) -> None:
        """Rewrite the sections this session ran; keep the others and the operator part."""
        produced = self.sections_produced()
        if not produced:
            return
        old = page.read_text(encoding="utf-8") if page.exists() else ""
        operator_part = OPERATOR_MARKER + "\n\n" + OPERATOR_PLACEHOLDER
        if OPERATOR_MARKER in old:
            operator_part = old[old.index(OPERATOR_MARKER) :]
            old = old[: old.index(OPERATOR_MARKER)]
        sections = _sections(old)
        sections.update(produced)
        order = [t for t in SECTION_ORDER if t in sections] + [
            t for t in sections if t not in SECTION_ORDER
        ]
        body = "\n".join(f"## {title}\n\n{sections[title].strip()}\n" for title in order)
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(
            self.header() + "\n" + body + "\n" + operator_part.rstrip() + "\n", encoding="utf-8"
        )

    def sections_produced(self) -> dict[str, str]:
        produced = {}
        if self.kill_fuzz:
            produced["Kill fuzzing of the library"] = "\n".join(self._kill_fuzz())
        produced.update(self.sections)
        if self.bad_input:
            rows = [f"| {what} | {_cell(seen)} |" for what, seen in sorted(self.bad_input.items())]
            produced["Bad input"] = "\n".join(
                [
                    "Each bad input gets a clear error naming the thing (or is handled safely),",
                    "and the other States of the store still load and list as they were.",
                    "",
                    "| input | what the user sees |",
                    "|---|---|",
                    *rows,
                ]
            )
        return produced

    def header(self) -> str:
        lines = [
            "# Reliability: the fault campaign",
            "",
            "Written by the campaign itself (`tests/runtime/test_campaign.py`), the runtime half of",
            "the fault campaign: real processes, real signals, a real filesystem running out of space,",
            "and the scripted model server recording every request. Do not edit by hand: each",
            "run rewrites the sections it ran and keeps the others.",
            "",
            f"- Seed: **{self.seed}**. Run again: `{self.command}`",
            f"- Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "- The seed fixes every run's plan and the order of fault kinds and instants;",
            "  which step of a run an instant hits depends on the machine's speed.",
            "",
        ]
        return "\n".join(lines)

    def _kill_fuzz(self) -> list[str]:
        lines = [
            "Each run has 2-3 rounds; each round makes the model call a tool 2-3 times at",
            "once (0-150 ms of work each; one call in four sends a message while the run",
            "is live). A child process (forked from a server that has imported the library)",
            "runs or resumes the State; at a random instant it gets SIGKILL or SIGINT (a",
            "fifth of the instants fall in its first 30 ms, two fifths within 60 ms after its",
            "first tool started, the rest anywhere over the duration of a whole run), and the",
            "next child resumes, until every round is answered. After every child the store",
            "is checked; after every run, its whole history.",
            "",
            "| store | SIGKILLs | Ctrl+Cs (in `agent.run` / outside) | children | runs answered"
            " | calls | calls aborted at a kill | model requests taken back | tool starts"
            " | model requests checked | sends checked |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t in self.kill_fuzz:
            lines.append(
                f"| {t.store} | {t.sigkills} | {t.ctrl_cs} ({t.ctrl_c_in_run} / "
                f"{t.ctrl_c_outside_run}) | {t.children} | {t.runs_answered} | "
                f"{t.calls_answered} | {t.calls_aborted} | {t.requests_aborted} | "
                f"{t.tool_starts} | {t.model_requests_checked} | {t.sends_checked} |"
            )
        lines += ["", "What held (times checked, per store):", ""]
        stores = " | ".join(t.store for t in self.kill_fuzz)
        lines += [f"| invariant | what it means | {stores} |"]
        lines += ["|---|---|" + "---|" * len(self.kill_fuzz)]
        for name, meaning in INVARIANTS:
            counts = " | ".join(str(t.held[name]) for t in self.kill_fuzz)
            lines.append(f"| {name} | {meaning} | {counts} |")
        lines += ["", "Every check held: a broken one fails the campaign at once.", ""]
        return lines


def _sections(text: str) -> dict[str, str]:
    """The ``## `` sections of a page, by title, in order."""
    sections: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            sections[title] = ""
        elif title is not None:
            sections[title] += line + "\n"
    return sections


def _cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def write_operator_part(header: str, sections: dict[str, str], page: Path = PAGE) -> None:
    """Rewrite the operator side of the page (from :data:`OPERATOR_MARKER` on): ``header``,
    then the ``sections`` this session ran; sections it did not run are kept as they were.
    The runtime part above the marker is kept as it is."""
    old = page.read_text(encoding="utf-8") if page.exists() else ""
    runtime_part, operator_part = old, ""
    if OPERATOR_MARKER in old:
        runtime_part = old[: old.index(OPERATOR_MARKER)]
        operator_part = old[old.index(OPERATOR_MARKER) + len(OPERATOR_MARKER) :]
    kept = {
        title: text
        for title, text in _sections(operator_part).items()
        if title.startswith("Real node: ")
    }
    kept.update(sections)
    body = "\n".join(f"## {title}\n\n{text.strip()}\n" for title, text in kept.items())
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        runtime_part.rstrip() + "\n\n" + OPERATOR_MARKER + "\n\n" + header.strip() + "\n\n" + body,
        encoding="utf-8",
    )
