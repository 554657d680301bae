"""How fast the run viewer opens a run, by history length: 100, 1,000 and 10,000 entries.

Run from the repository root::

    python benchmarks/viewer_open.py [--trials 5]

It saves finished runs of each length in a FileStore (turns of a model request, a reply
calling two tools, and their results, as the Agent writes them), starts ``alpineagents
ui`` as its own process, and opens each run's page in Debian's headless chromium
(Playwright). *Open* is from the navigation's start to the first frame after the page
shows the run's entry count and its rows (the snapshot arrived over Server-Sent Events,
the server built the timeline, the page laid out the rows in view), measured inside the
page with ``performance.now()``. Results go to ``benchmarks/results/viewer_open.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from tests.bench.browser import CHROMIUM_ARGS, ViewerProcess, chromium_path, write_long_run  # noqa: E402

from alpineagents import FileStore  # noqa: E402

LENGTHS = (100, 1_000, 10_000)
OPENED = """n => new Promise(done => {
  const check = () => {
    const run = document.querySelector('.run');
    if (run && run.dataset.entries === String(n) && document.querySelector('.tl-row')) {
      requestAnimationFrame(() => done(performance.now()));
    } else requestAnimationFrame(check);
  };
  check();
})"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    browser_path = chromium_path()
    if browser_path is None:
        raise SystemExit("needs Debian's chromium: apt-get install chromium")
    times: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        store = FileStore(Path(scratch) / "runs")
        for length in LENGTHS:
            write_long_run(store, f"run-{length}", length)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])}
        viewer = ViewerProcess(["--store", str(store.folder), "--no-cluster"], env)
        try:
            with sync_playwright() as playwright:
                context = playwright.chromium.launch_persistent_context(
                    str(Path(scratch) / "profile"),
                    executable_path=browser_path,
                    headless=True,
                    args=CHROMIUM_ARGS,
                    viewport={"width": 1280, "height": 720},
                )
                page = context.new_page()
                page.goto(f"{viewer.url}runs/run-100")  # warm up: the page and the server
                page.evaluate(OPENED, 100)
                for _ in range(args.trials):
                    for length in LENGTHS:
                        page.goto("about:blank")
                        page.goto(f"{viewer.url}runs/run-{length}")
                        times.setdefault(length, []).append(page.evaluate(OPENED, length))
                context.close()
        finally:
            viewer.stop()
    write_results(times, args.trials)


def write_results(times: dict[int, list[float]], trials: int) -> None:
    base = statistics.median(times[LENGTHS[1]])
    lines = [
        "# Run viewer: opening a run, by history length",
        "",
        "Measured by `python benchmarks/viewer_open.py` with Debian's headless chromium",
        "(Playwright) and `alpineagents ui` on a FileStore. *Open*: navigation start to the",
        "first frame after the page shows the run's entry count and its rows, measured in",
        "the page (`performance.now()`). The runs are finished runs as the Agent writes",
        "them: turns of a model request, a reply calling two tools, and their results.",
        "",
        "| entries | trials | median | max | median / median at 1,000 |",
        "|---|---|---|---|---|",
    ]
    for length in LENGTHS:
        median = statistics.median(times[length])
        lines.append(
            f"| {length:,} | {trials} | {median:.0f} ms | {max(times[length]):.0f} ms | "
            f"{median / base:.2f} |"
        )
    lines += [
        "",
        "Only the rows in view are in the page (about 50), so scrolling costs the same at any",
        "length; what grows with the history is reading it, building the timeline on the",
        "server and parsing the snapshot (one JSON message of all rows, without entry data,",
        "which the page fetches when a row is opened).",
        "",
        f"Machine: {platform.machine()}, Linux {platform.release()}, Python "
        f"{platform.python_version()}; 2 cores shared with other test processes.",
        "",
    ]
    out = REPO / "benchmarks" / "results" / "viewer_open.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
