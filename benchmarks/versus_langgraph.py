"""Our Agent with FileStore next to LangGraph's savers: bytes stored, save time per step, load.

All runs are the conversation of :mod:`benchmarks.conversation`, in one process, ours and
theirs alternating. See :mod:`benchmarks.langgraph_peer` for how LangGraph is set up.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alpineagents import FileStore, State

from . import langgraph_peer as peer
from .conversation import check_loaded, run_ours
from .measure import Spread, median_seconds


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def save_seconds_per_step(saves: list[tuple[int, float]], steps: int) -> float:
    """Save time of the whole run over its steps (the first save and the answer's included)."""
    return sum(took for _, took in saves) / steps


@dataclass
class StepFigures:
    """Bytes after ``steps`` steps and save time per step, ours and each peer's."""

    steps: int
    ours_bytes: Spread = field(default_factory=Spread)
    ours_save_ms: Spread = field(default_factory=Spread)
    peer_bytes: dict[str, Spread] = field(default_factory=dict)
    peer_save_ms: dict[str, Spread] = field(default_factory=dict)
    ratio_bytes: dict[str, Spread] = field(default_factory=dict)  # theirs / ours
    ratio_save: dict[str, Spread] = field(default_factory=dict)  # theirs / ours: >1 ours faster
    notes: list[str] = field(default_factory=list)

    def add_peer(self, name: str, size: int, per_step: float) -> None:
        self.peer_bytes.setdefault(name, Spread()).add(size)
        self.peer_save_ms.setdefault(name, Spread()).add(per_step * 1000)
        self.ratio_bytes.setdefault(name, Spread()).add(size / self.ours_bytes.values[-1])
        self.ratio_save.setdefault(name, Spread()).add(
            per_step * 1000 / self.ours_save_ms.values[-1]
        )


def steps_and_bytes(work: Path, steps: int, repeats: int, postgres_url: str | None) -> StepFigures:
    """Per repeat: ours (FileStore) then LangGraph DeltaChannel on SqliteSaver.

    The peers that rewrite the whole conversation at each checkpoint (SqliteSaver and
    PostgresSaver with the usual ``add_messages`` list), and Postgres with DeltaChannel,
    run in the first repeat only: they are slow to build and their byte counts do not vary.
    """
    figures = StepFigures(steps)
    for repeat in range(repeats):
        folder = work / f"ours-{repeat}"
        run = run_ours("conversation", steps, FileStore(folder))
        figures.ours_bytes.add(folder_bytes(folder))
        figures.ours_save_ms.add(save_seconds_per_step(run.saves, steps) * 1000)
        peers: list[tuple[str, bool, str]] = [("SqliteSaver + DeltaChannel", True, "sqlite")]
        if repeat == 0:
            peers.insert(0, ("SqliteSaver", False, "sqlite"))
            if postgres_url is not None:
                peers += [("PostgresSaver", False, "postgres")]
                peers += [("PostgresSaver + DeltaChannel", True, "postgres")]
        for name, delta, kind in peers:
            label = f"{repeat}-{'delta' if delta else 'list'}"
            with _saver(kind, work / f"peer-{label}.db", postgres_url, label) as (saver, size):
                peer_run = peer.run_peer(steps, delta=delta, saver=saver, durability="sync")
                per_step = save_seconds_per_step(peer_run.saves, steps)
            figures.add_peer(name, size(), per_step)
    if postgres_url is None:
        figures.notes.append("PostgresSaver not measured: no PostgreSQL server could be started.")
    return figures


@contextlib.contextmanager
def _saver(kind: str, path: Path, postgres_url: str | None, label: str) -> Iterator[Any]:
    if kind == "sqlite":
        with peer.sqlite_saver(path) as saver:
            yield saver, lambda: peer.sqlite_bytes(path)
    else:
        from .postgres_server import fresh_database

        assert postgres_url is not None
        url = fresh_database(postgres_url, f"bench_{label.replace('-', '_')}")
        with peer.postgres_saver(url) as saver:
            yield saver, lambda: peer.postgres_bytes(url)


@dataclass
class LoadFigures:
    """Full load (ours) next to ``get_state`` (theirs), per conversation length."""

    ours_ms: dict[int, Spread] = field(default_factory=dict)
    peer_ms: dict[tuple[str, int], Spread] = field(default_factory=dict)
    ratio: dict[tuple[str, int], Spread] = field(default_factory=dict)  # theirs / ours


def _load(folder: Path, state_id: str) -> State:
    return FileStore(folder).load(state_id)


def loads(work: Path, sizes: list[int], repeats: int) -> LoadFigures:
    """``FileStore.load`` (a fresh store object each time) vs ``graph.get_state``.

    SqliteSaver's thread is written with ``durability="exit"`` (one checkpoint at the
    end): ``get_state`` reads the newest checkpoint only, so the checkpoints before it
    change nothing but the file's size, and building 3,000 steps of full-list
    checkpoints would write gigabytes. The DeltaChannel thread is written step by step,
    as its ``get_state`` replays the writes of the checkpoints before the newest.
    """
    figures = LoadFigures()
    for size in sizes:
        run = run_ours(f"load-{size}", size, None)
        store_folder = work / f"load-ours-{size}"
        FileStore(store_folder).save(run.state)
        saved: State = run.state
        graphs = {}
        stack = contextlib.ExitStack()
        with stack:
            for name, delta, durability in (
                ("SqliteSaver", False, "exit"),
                ("SqliteSaver + DeltaChannel", True, None),
            ):
                saver = stack.enter_context(
                    peer.sqlite_saver(work / f"load-{size}-{'delta' if delta else 'list'}.db")
                )
                peer.run_peer(size, delta=delta, saver=saver, durability=durability)
                graphs[name] = peer.build_graph(delta, peer.PeerRun(size), saver)
            for _ in range(repeats):
                ours, loaded = median_seconds(functools.partial(_load, store_folder, saved.id), 3)
                check_loaded(loaded, saved)
                figures.ours_ms.setdefault(size, Spread()).add(ours * 1000)
                for name, graph in graphs.items():
                    theirs, _ = median_seconds(
                        functools.partial(peer.get_state, graph, "bench", size), 3
                    )
                    figures.peer_ms.setdefault((name, size), Spread()).add(theirs * 1000)
                    figures.ratio.setdefault((name, size), Spread()).add(theirs / ours)
    return figures
