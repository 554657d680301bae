"""Each section of ``python -m benchmarks`` at its smallest size: it runs, measures (its
servers are the test bench's: MinIO, etcd + kube-apiserver, the OpenTelemetry Collector),
and the record and pages it writes read back, every row with a verdict computed by code.

The sections on the bench's real node (``resume``, ``failover-node``, ``drain``,
``rolling-upgrade``, ``warm-pool``, ``warm-pool-burst``) are not run here: each installs the chart on a fresh
node, minutes each, and the suite's e2e tests run those scenarios themselves.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.sizes import ORDER, SECTION_ROWS

from benchmarks import REPO, record

REAL_NODE = {"resume", "failover-node", "drain", "rolling-upgrade", "warm-pool", "warm-pool-burst"}
SMALL = [name for name in SECTION_ROWS if name not in REAL_NODE]


def run(out: Path, *sections: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *sections, "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pass of every section here at its smallest (one process: its imports once)."""
    out = tmp_path_factory.mktemp("benchmarks")
    run(out, *SMALL)
    return out


@pytest.mark.parametrize("section", SMALL)
def test_a_section_at_its_smallest_writes_rows_that_read_back(section: str, written: Path) -> None:
    saved = record.load(written, section)
    assert saved is not None
    assert sorted(saved.rows) == sorted(SECTION_ROWS[section])
    for key, row in saved.rows.items():
        assert row.met is not None, f"{key} not measured: {saved.not_measured}"
        assert row.samples, f"{key} does not say what its figures are over"
    assert "--quick" in saved.provenance.command
    assert saved.provenance.cpus >= 1

    own_page = (written / record.RECORDS / f"{section}.md").read_text()
    assert [r["what"] for r in record.targets(own_page)] == [
        row.what for row in saved.rows.values()
    ]
    table = record.targets((written / "RESULTS.md").read_text())
    assert len(table) == len(ORDER)  # every target, measured or not
    verdicts = {r["what"]: r["verdict"] for r in table}
    assert {row.what: verdicts.get(row.what) for row in saved.rows.values()} == {
        row.what: row.verdict for row in saved.rows.values()
    }


def test_a_section_not_run_keeps_its_figures_and_says_from_when(
    written: Path, tmp_path: Path
) -> None:
    shutil.copytree(written, tmp_path, dirs_exist_ok=True)
    first = (tmp_path / record.RECORDS / "floors.json").read_text()
    run(tmp_path, "loads")

    assert (tmp_path / record.RECORDS / "floors.json").read_text() == first
    kept = record.load(tmp_path, "floors")
    assert kept is not None
    page = (tmp_path / "RESULTS.md").read_text()
    floors = next(r for r in record.targets(page) if r["what"] == kept.rows["file-save"].what)
    assert floors["measured"] == kept.rows["file-save"].measured
    assert kept.provenance.date in floors["measured by"]
    assert "This pass ran: `loads`." in page
    measured = [r for r in record.targets(page) if r["verdict"] != "not measured"]
    assert len(measured) == sum(len(SECTION_ROWS[name]) for name in SMALL)


def test_a_latency_goal_over_too_few_samples_is_not_met() -> None:
    row = record.Row("p95", "1.0 s", "under 5 s", True, "3 trials", judged_over=3)
    assert row.verdict.startswith("too few samples") and not row.counts_as_met
    assert record.Row("p95", "1.0 s", "under 5 s", True, judged_over=20).counts_as_met
    assert record.Row("p95", "9.0 s", "under 5 s", False, judged_over=20).verdict == "not met"
