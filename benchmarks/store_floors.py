"""What one save costs next to the floor under it: an fsynced append, or one S3 PUT.

Each pair is measured interleaved (save, floor, floor, save, ...) so that both see the
same machine and server; a repeat's figure is the ratio of the two medians.
"""

from __future__ import annotations

import io
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from alpineagents import FileStore, Message, State, Store

from .conversation import result
from .measure import Spread, mark, since

SAVES_PER_REPEAT = 200
HISTORY_BEFORE = 1_000  # entries a State has when its saves are measured


def add_entry(state: State, n: int) -> dict[str, Any]:
    """Add one entry of about 300 bytes to ``state``; return it as the store gets it."""
    entry = state.send(Message.user(result(n)))
    return entry.to_dict()


def line_of(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def grown_state(store: Store, state_id: str, entries: int) -> State:
    """A State with ``entries`` entries saved in ``store`` (50 entries a save)."""
    state = State(state_id, [Message.user("Summarise the nightly builds")])
    store.save(state)
    for n in range(entries - 1):
        add_entry(state, n)
        if n % 50 == 49:
            store.save(state)
    store.save(state)
    return state


def interleaved(
    save: Callable[[int], None],
    floor: Callable[[int], None],
    pairs: int,
    prepare: Callable[[int], None] = lambda n: None,
) -> tuple[list[float], list[float]]:
    """``pairs`` timings of each (see :func:`benchmarks.measure.since`), alternating which
    goes first; ``prepare(n)`` runs untimed before the pair."""
    saves: list[float] = []
    floors: list[float] = []
    for n in range(pairs):
        prepare(n)
        order = (save, floor) if n % 2 == 0 else (floor, save)
        for call in order:
            start = mark()
            call(n)
            (saves if call is save else floors).append(since(start))
    return saves, floors


def against_floor(
    store: Store, state: State, floor: Callable[[bytes, int], None], pairs: int
) -> tuple[list[float], list[float]]:
    """Saves of one new entry each, interleaved with ``floor(line, n)`` of the same line.

    The entry is added to the State (and its line made for the floor) before either is
    timed: what is compared is the save of an entry with the write of its bytes."""
    last = line_of(state.history[-1].to_dict())

    def prepare(n: int) -> None:
        nonlocal last
        last = line_of(add_entry(state, HISTORY_BEFORE + n))

    return interleaved(lambda n: store.save(state), lambda n: floor(last, n), pairs, prepare)


def file_store_vs_append(folder: Path, repeats: int) -> dict[str, Spread]:
    """FileStore.save of one new entry vs one ``write`` + ``fsync`` of its line."""
    figures = {"ratio": Spread(), "save_ms": Spread(), "floor_ms": Spread()}
    for repeat in range(repeats):
        store = FileStore(folder / f"floor-{repeat}")
        state = grown_state(store, "file-floor", HISTORY_BEFORE)
        raw = os.open(folder / f"raw-{repeat}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def append(line: bytes, n: int, raw: int = raw) -> None:
            os.write(raw, line)
            os.fsync(raw)

        try:
            saves, floors = against_floor(store, state, append, SAVES_PER_REPEAT)
        finally:
            os.close(raw)
        check_saved(FileStore(folder / f"floor-{repeat}"), state)
        _add(figures, saves, floors)
    return figures


def minio_vs_put(server: Any, repeats: int) -> dict[str, Spread]:
    """MinioStore.save of one new entry vs one ``put_object`` of its line."""
    from .stores import minio_store

    figures = {"ratio": Spread(), "save_ms": Spread(), "floor_ms": Spread()}
    for _ in range(repeats):
        bucket = server.fresh_bucket()
        store = minio_store(server, bucket)
        raw = cast(
            Any, minio_store(server, bucket)
        ).client  # a client like the store's: same pool kind
        state = grown_state(store, "minio-floor", HISTORY_BEFORE)

        def put(line: bytes, n: int, raw: Any = raw, bucket: str = bucket) -> None:
            raw.put_object(bucket, f"raw/{n:06d}.jsonl", io.BytesIO(line), len(line))

        saves, floors = against_floor(store, state, put, SAVES_PER_REPEAT)
        check_saved(minio_store(server, bucket), state)
        _add(figures, saves, floors)
    return figures


def minio_slowest_save(
    server: Any, steps: int, repeats: int
) -> tuple[dict[str, Spread], dict[str, float]]:
    """The slowest single save of a run to ``steps`` steps (3 one-entry saves a step),
    next to the slowest of one raw ``put_object`` of the same line after each save: the
    server's and the machine's own outliers, in the same run.

    Returns the figures of each repeat, and the *systematic* slowest: each save's
    position (the n-th save of the run) timed by its best repeat, then the slowest
    position over the median. A save slow by design (a merge on its path at that
    length) is slow in every repeat; a stall of the server or the machine falls on
    another position in each repeat, and drops out.
    """
    from .stores import minio_store

    figures = {
        name: Spread()
        for name in ("ratio", "slowest_ms", "median_ms", "put_ratio", "put_slowest_ms")
    }
    runs: list[list[float]] = []
    put_runs: list[list[float]] = []
    for _ in range(repeats):
        bucket = server.fresh_bucket()
        store = minio_store(server, bucket)
        raw = cast(Any, minio_store(server, bucket)).client
        state = State("slowest", [Message.user("Summarise the nightly builds")])
        store.save(state)
        times, puts = [], []
        for n in range(3 * steps):
            line = line_of(add_entry(state, n))
            start = mark()
            store.save(state)
            times.append(since(start))
            start = mark()
            raw.put_object(bucket, f"raw/{n:06d}.jsonl", io.BytesIO(line), len(line))
            puts.append(since(start))
        check_saved(minio_store(server, bucket), state)
        median = statistics.median(times)
        figures["ratio"].add(max(times) / median)
        figures["slowest_ms"].add(max(times) * 1000)
        figures["median_ms"].add(median * 1000)
        figures["put_ratio"].add(max(puts) / statistics.median(puts))
        figures["put_slowest_ms"].add(max(puts) * 1000)
        runs.append(times)
        put_runs.append(puts)
    best = [min(position) for position in zip(*runs, strict=True)]
    put_best = [min(position) for position in zip(*put_runs, strict=True)]
    systematic = {
        "ratio": max(best) / statistics.median(best),
        "slowest_ms": max(best) * 1000,
        "at_step": best.index(max(best)) // 3 + 1,
        "put_ratio": max(put_best) / statistics.median(put_best),
        # Saves in the last tenth of the run over the first tenth: flat if no save
        # grows with the history.
        "growth": statistics.median(best[-len(best) // 10 :])
        / statistics.median(best[: len(best) // 10]),
    }
    return figures, systematic


def check_saved(store: Store, state: State) -> None:
    """What a fresh store loads must be what was saved."""
    loaded = store.load(state.id)
    if loaded.history != state.history:
        raise AssertionError(
            f"{store!r} loaded {len(loaded.history)} entries, {len(state.history)} were saved"
        )


def _add(figures: dict[str, Spread], saves: list[float], floors: list[float]) -> None:
    save, floor = statistics.median(saves), statistics.median(floors)
    figures["ratio"].add(save / floor)
    figures["save_ms"].add(save * 1000)
    figures["floor_ms"].add(floor * 1000)
