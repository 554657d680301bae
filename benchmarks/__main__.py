"""Run every benchmark and rewrite ``benchmarks/RESULTS.md``.

From the repository root, with the ``bench`` extra installed (``pip install -e .[bench]``)::

    python -m benchmarks                 # everything, 5 repeats, rewrites RESULTS.md
    python -m benchmarks --repeats 3
    python -m benchmarks --only floors,cli --out /tmp/partial.md
    python -m benchmarks --quick --out /tmp/quick.md   # small sizes: checks the harness

MinIO comes from the test bench (``python -m tests.bench.testbin minio``), PostgreSQL from
the distribution (``apt-get install postgresql``); a benchmark whose server is missing is
listed as not measured. Sections ``resume`` (the bench's real node: root, and run the
whole command under ``flock /tmp/real-node.lock``, one real node per machine) and
``operator`` (the bench's etcd + kube-apiserver) start a cluster of their own. A correctness check that fails (what a load gives back is not what
was saved) stops the run with an error.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .measure import load_average, machine, versions
from .results_page import Page
from .sections import SECTIONS, not_measured
from .sizes import Sizes

RESULTS = REPO / "benchmarks" / "RESULTS.md"


@dataclass
class Options:
    repeats: int
    sizes: Sizes
    only: list[str]
    out: Path


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each figure (5)")
    parser.add_argument(
        "--only", default="", help=f"comma-separated sections to run: {', '.join(SECTIONS)}"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the harness")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the page")
    args = parser.parse_args(argv)
    only = [name for name in args.only.split(",") if name]
    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; there are {', '.join(SECTIONS)}")
    if (only or args.quick) and args.out == RESULTS:
        parser.error("--only and --quick write a partial page: give --out elsewhere")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return Options(args.repeats, Sizes.quick() if args.quick else Sizes(), only, args.out)


@contextlib.contextmanager
def optional_postgres(page: Page) -> Iterator[str | None]:
    from .postgres_server import PostgresUnavailable, postgres

    try:
        with postgres() as url:
            yield url
    except PostgresUnavailable as error:
        page.not_measured.append(f"LangGraph's PostgresSaver: {error}")
        yield None


def stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so the servers started here are stopped on the way out


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, stop)
    page = Page()
    began, load_before = time.time(), load_average()
    wanted = options.only or list(SECTIONS)
    with tempfile.TemporaryDirectory(prefix="alpineagents-bench-") as folder:
        work = Path(folder)
        with optional_postgres(page) as postgres_url:
            for name in wanted:
                print(f"[benchmarks] {name}", file=sys.stderr, flush=True)
                section_dir = work / name
                section_dir.mkdir()
                SECTIONS[name](page, section_dir, options.repeats, options.sizes, postgres_url)
    not_measured(page)
    took = time.time() - began
    page.header = [
        "# Benchmark results",
        "",
        f"Written by `python -m benchmarks` on {time.strftime('%Y-%m-%d', time.gmtime(began))} "
        f"in {took / 60:.0f} min, {options.repeats} repeats: every figure is the median over "
        "the repeats, with the lowest and highest in brackets. Ratios are taken within one "
        "repeat (ours and the floor or LangGraph measured side by side, interleaved), then "
        "summarised.",
        "",
        f"Machine: {machine()}. Load average {load_before} at the start, {load_average()} "
        "at the end: the machine is shared, so absolute times are noisy; the ratios are what "
        "to read.",
        "",
        f"Versions: {versions()}.",
        "",
        "Conversation: each step is an assistant message calling a tool with a ~300-byte "
        "input and the tool's ~300-byte result; the model answers instantly "
        "(`benchmarks/conversation.py`, `benchmarks/langgraph_peer.py`).",
    ]
    options.out.write_text(page.render(), encoding="utf-8")
    print(f"[benchmarks] wrote {options.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
