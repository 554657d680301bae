"""The fleet benchmark's harness, at its smallest: runner processes on one limited key,
with the shared limiter and by the headers alone, counted and judged as the page says."""

from __future__ import annotations

from pathlib import Path

from benchmarks import REPO, fleet


def test_the_harness_runs_a_fleet_each_way_and_writes_what_it_saw(tmp_path: Path) -> None:
    shared = fleet.run_fleet("shared", 3, 600, REPO, tmp_path, pacer=True)
    assert shared.exit_codes == [0, 0, 0]
    assert len(shared.answered_at) == 3 * fleet.REQUESTS_PER_RUN
    assert shared.requests == len(shared.answered_at) + shared.refused
    assert len(shared.run_spans) == 3 and shared.slowest_ratio >= 1.0
    assert set(shared.shares()) == {"team-a", "team-b"}
    headers = fleet.run_fleet("headers", 3, 600, REPO, tmp_path, pacer=False)
    assert headers.exit_codes == [0, 0, 0]

    page = fleet.page([shared, headers], fleet.BEFORE)
    assert f"| shared | 3 | 600 | 3/3 | {shared.refused}/{shared.requests} = " in page
    assert "| headers | 3 | 600 | 3/3 |" in page
