"""The long-runs benchmark's harness, at its smallest: every setting runs, the page and
the plot are written, and what the runs did is what the page says.

A 12k-token window makes 60 turns of 2 KB tool results pass it, so the settings that
manage the window and the ones that die at it both show in a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import billed_runs, long_runs


def test_the_harness_runs_every_setting_and_writes_the_page(tmp_path: Path) -> None:
    sizes = long_runs.LongRunSizes.quick()
    figures = long_runs.measure(tmp_path / "work", sizes)

    longest = figures.runs[max(sizes.lengths)]
    assert set(longest) == {s.name for s in billed_runs.SETTINGS}
    for name in (billed_runs.OURS.name, billed_runs.OURS_UNCACHED.name):
        assert longest[name].failed_at is None, longest[name].outcome
        assert longest[name].largest_prompt <= sizes.window
    died = longest[billed_runs.LANGCHAIN.name]
    assert died.failed_at is not None and died.failed_at < max(sizes.lengths)
    # The uncached baseline pays its whole prompt.
    assert longest[billed_runs.OURS_UNCACHED.name].ratio == pytest.approx(1.0)
    assert figures.resume is not None and figures.resume.read_fraction is not None
    assert 0.0 < figures.resume.read_fraction <= 1.0

    out, picture = tmp_path / "page.md", tmp_path / "plot.png"
    long_runs.write(figures, out, picture)
    page = out.read_text()
    assert picture.stat().st_size > 0
    assert f"failed at turn {died.failed_at}" in page
    for key_row in long_runs.targets(figures).values():
        assert key_row.what in page


def test_the_model_is_a_function_of_the_request() -> None:
    model = billed_runs.Responder(turns=3)
    first = {"tools": [{"name": "check_service"}], "messages": [{"role": "user", "content": "go"}]}
    after_two = {
        "tools": [{"name": "check_service"}],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_000002"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_000002"}]},
        ],
    }
    asks_summary = {
        **after_two,
        "messages": [
            *after_two["messages"][:-1],
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_000002"},
                    {"type": "text", "text": "Summarize the conversation so far."},
                ],
            },
        ],
    }
    assert model(first) == model(first)
    assert model(first).content[0].id == "toolu_000001"
    assert model(after_two).content == (billed_runs.ANSWER,)
    assert model(asks_summary).content[0].startswith("Summary:")
    assert model({**first, "tools": []}).content[0].startswith("Summary:")
