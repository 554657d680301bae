"""The viewer links a run to its trace when a tracing UI's address is configured."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from alpineagents import FileStore, Message, State, tracing
from alpineagents.viewer.command import UsageError, add_arguments, serve
from alpineagents.viewer.service import RunViewer


async def first_update(viewer: RunViewer, state_id: str) -> dict[str, object]:
    updates = viewer.follow(state_id)
    first = await anext(updates)
    await updates.aclose()
    return first.to_json()


async def test_a_run_links_to_its_trace_by_the_id_tracing_gives_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State("nightly", [Message.user("hi")]))
    template = "http://jaeger.example:16686/trace/{trace_id}?uiEmbed=v0"
    linked = await first_update(RunViewer(store, trace_url=template), "nightly")
    trace_id = format(tracing.trace_id_of("nightly"), "032x")
    assert linked["trace_url"] == f"http://jaeger.example:16686/trace/{trace_id}?uiEmbed=v0"
    assert (await first_update(RunViewer(store), "nightly"))["trace_url"] is None


def test_a_trace_address_without_a_place_for_the_id_is_refused(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--trace-url", "http://jaeger.example:16686/", "--no-cluster"])
    with pytest.raises(UsageError, match=r"\{trace_id\}"):
        serve(args, FileStore(tmp_path))
