"""Run the benchmarks and rewrite ``benchmarks/RESULTS.md`` and its section pages.

From the repository root, with the ``bench`` extra installed (``pip install -e .[bench]``)::

    python -m benchmarks                       # every section, rewrites RESULTS.md
    python -m benchmarks failover drain        # these sections; the others keep their figures
    python -m benchmarks --quick               # every section at its smallest size
    python -m benchmarks floors --out /tmp/b   # RESULTS.md and the records under /tmp/b
    python -m benchmarks --page-only           # RESULTS.md from the records, nothing run

Each section's run writes its record (``results/sections/NAME.json``: its rows, verdicts
computed from the figures, and the command, commit, date and machine) and its page
(``results/sections/NAME.md``); ``RESULTS.md`` is then written from every section's last
record. A section whose servers are missing this time keeps its last record and is listed
as not run. MinIO comes from the test bench (``python -m tests.bench.testbin minio``),
PostgreSQL from the distribution; the sections on the bench's real node (``resume``,
``failover-node``, ``drain``, ``rolling-upgrade``, ``warm-pool``, ``warm-pool-burst``)
need root, and run the whole command under ``flock /tmp/alpineagents-realnode.lock``. A
correctness check that fails (what a load gives back is not what was saved) stops the
run with an error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .measure import load_average, machine, versions
from .record import Provenance, SectionRecord, commit, load, render, save
from .results_page import Page
from .sections import SECTIONS
from .sizes import EARLIER_PAGES, ORDER, SECTION_ROWS, Sizes

RESULTS = REPO / "benchmarks" / "RESULTS.md"


@dataclass
class Options:
    repeats: int
    sizes: Sizes
    sections: list[str]
    out: Path
    command: str


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "sections", nargs="*", metavar="SECTION", help=f"sections to run: {', '.join(SECTIONS)}"
    )
    parser.add_argument("--repeats", type=int, help="repeats of each figure (5; with --quick, 1)")
    parser.add_argument("--quick", action="store_true", help="every section at its smallest size")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SIZE=N",
        help="one size other than the default, e.g. burst_passes=5 (the rows say so)",
    )
    parser.add_argument(
        "--page-only",
        action="store_true",
        help="run nothing: write RESULTS.md from the sections' records as they are",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS.parent,
        help="the folder of RESULTS.md and its results/sections/ (benchmarks/)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; there are {', '.join(SECTIONS)}")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    command = " ".join(["python -m benchmarks", *argv])
    if args.page_only and args.sections:
        parser.error("--page-only runs no section: name none")
    sizes = Sizes.quick() if args.quick else Sizes()
    for setting in args.set:
        name, _, value = setting.partition("=")
        if not isinstance(getattr(sizes, name, None), int) or not value.isdigit():
            numbers = [k for k, v in vars(sizes).items() if isinstance(v, int)]
            parser.error(f"--set {setting}: give SIZE=N, SIZE one of {', '.join(numbers)}")
        setattr(sizes, name, int(value))
    return Options(
        args.repeats,
        sizes,
        [] if args.page_only else args.sections or list(SECTIONS),
        args.out,
        command.replace(str(args.out), "OUT") if args.out != RESULTS.parent else command,
    )


@contextlib.contextmanager
def optional_postgres() -> Iterator[str | None]:
    """PostgreSQL for LangGraph's PostgresSaver, or None (its rows say not measured)."""
    from .postgres_server import PostgresUnavailable, postgres

    try:
        with postgres() as url:
            yield url
    except PostgresUnavailable as error:
        print(f"[benchmarks] no PostgreSQL: {error}", file=sys.stderr)
        yield None


def stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so the servers started here are stopped on the way out


def run_section(name: str, work: Path, options: Options, postgres_url: str | None) -> None:
    """Run one section and save its record (unless it measured nothing and an older
    record exists: a section whose servers are missing keeps its last figures)."""
    page = Page()
    began, load_before = time.time(), load_average()
    SECTIONS[name](page, work, options.repeats, options.sizes, postgres_url)
    provenance = Provenance(
        command=options.command,
        commit=commit(),
        began=began,
        minutes=(time.time() - began) / 60,
        cpus=os.cpu_count() or 0,
        machine=f"{machine()}; {versions()}",
        load_start=load_before,
        load_end=load_average(),
    )
    fresh = SectionRecord.of(name, provenance, page)
    last = load(options.out, name)
    if not fresh.measured_anything and last is not None and last.measured_anything:
        print(
            f"[benchmarks] {name} measured nothing ({'; '.join(page.not_measured)}): "
            f"its record of {last.provenance.date} stays",
            file=sys.stderr,
        )
        return
    save(fresh, options.out)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, stop)
    with tempfile.TemporaryDirectory(prefix="alpineagents-bench-") as folder:
        work = Path(folder)
        postgres = optional_postgres() if "langgraph" in options.sections else None
        with postgres or contextlib.nullcontext(None) as postgres_url:
            for name in options.sections:
                print(f"[benchmarks] {name}", file=sys.stderr, flush=True)
                section_dir = work / name
                section_dir.mkdir()
                run_section(name, section_dir, options, postgres_url)
    records = {name: load(options.out, name) for name in SECTIONS}
    page = render(records, SECTION_ROWS, ORDER, options.sections, EARLIER_PAGES)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / RESULTS.name).write_text(page, encoding="utf-8")
    print(f"[benchmarks] wrote {options.out / RESULTS.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
