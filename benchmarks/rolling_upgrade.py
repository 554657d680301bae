"""``helm upgrade`` to a new operator and runner image while 20 runs are going.

Run from the repository root (root, the bench's real node)::

    python -m benchmarks.rolling_upgrade [--runs 20]

This is the suite's scenario (``tests/e2e/test_rolling_upgrade.py``) at the issue's scale:
the test itself runs with ``ALPINEAGENTS_UPGRADE_RUNS`` set, so every assertion it makes
holds for each of the runs: half run on through the upgrade and end on the old image, half
are deleted after it and resume on the new image from the State the old runner saved; none
is lost, no call starts twice, and each run's status names its runner's version and
image. What this adds is the figure: the wall time of the whole scenario and the machine's
load. Results go to ``benchmarks/results/rolling_upgrade.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import date

from . import REPO

RESULTS = REPO / "benchmarks" / "results" / "rolling_upgrade.md"
TEST = "tests/e2e/test_rolling_upgrade.py"


def measure(runs: int) -> tuple[bool, float, tuple[float, float, float], str]:
    """Run the upgrade test with ``runs`` runs: (passed, seconds, load at the end, tail)."""
    env = {
        **os.environ,
        "ALPINEAGENTS_UPGRADE_RUNS": str(runs),
        "ALPINEAGENTS_REQUIRE_INFRA": "1",
        "PYTHONPATH": str(REPO / "operator"),
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    if result.returncode != 0:
        print(result.stdout, file=sys.stderr)  # the whole failure, not just the page's tail
    tail = "\n".join(result.stdout.strip().splitlines()[-3:])
    return result.returncode == 0, seconds, os.getloadavg(), tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    passed, seconds, load, tail = measure(args.runs)
    outcome = (
        f"all {args.runs} runs finished: {args.runs // 2} on the old image, "
        f"{args.runs - args.runs // 2} resumed on the new one; no call started twice"
        if passed
        else "FAILED (see the test's output below)"
    )
    RESULTS.write_text(
        f"# Rolling upgrade under {args.runs} runs\n\n"
        f"Measured by `python -m benchmarks.rolling_upgrade --runs {args.runs}` on "
        f"{date.today().isoformat()}. Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Linux {platform.release()}, Python {platform.python_version()} (shared).\n\n"
        f"| runs | outcome | whole scenario | load (1/5/15 min) at the end |\n"
        f"| ---: | --- | ---: | --- |\n"
        f"| {args.runs} | {outcome} | {seconds:.0f} s | "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} |\n\n"
        "The whole scenario: the cluster and the chart set up, the runs started and held in "
        "their tool call, `helm upgrade --wait` to the second image, half the runs' pods "
        "deleted, every run waited for, and the release upgraded back.\n\n"
        f"```\n{tail}\n```\n"
    )
    print(RESULTS.read_text())
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
