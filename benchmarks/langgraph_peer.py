"""The same conversation on LangGraph, set up as its documentation shows.

A ``StateGraph`` with an ``agent`` node (the instant model: it returns an ``AIMessage``
calling ``run_command`` with the same ~300-byte input as ours) and the prebuilt
``ToolNode`` with the same tool, routed by ``tools_condition``: LangGraph's ReAct agent
written out, as its tutorials do. The messages channel is either the usual
``Annotated[list, add_messages]`` or the new ``DeltaChannel`` with LangGraph's batch
messages reducer (its docstring's example), which stores each step's new messages instead
of the whole list.

Savers: ``SqliteSaver`` on a file (``check_same_thread=False``, as ``from_conn_string``
opens it; it sets WAL mode itself) and ``PostgresSaver.from_conn_string`` on a loopback
server, each with ``setup()`` called once. The graph runs with LangGraph's default
durability (``"async"``: a checkpoint is written while the next step runs) unless a
caller asks for another.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool as lc_tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from .conversation import FIRST_MESSAGE, command, result
from .measure import mark, since


class ListState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class DeltaState(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]


@lc_tool
def run_command(command: str) -> str:
    """Runs a shell command and returns what it printed."""
    n = int(command.split("service-", 1)[1][:5])
    return result(n)


@dataclass
class PeerRun:
    """One run of the conversation on LangGraph."""

    steps: int
    agent_calls: list[tuple[float, float]] = field(default_factory=list)  # mark() of each turn
    saves: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds) per call
    seconds: float = 0.0

    def step_seconds(self) -> list[float]:
        return [
            (b[0] - a[0]) - (b[1] - a[1])
            for a, b in zip(self.agent_calls, self.agent_calls[1:], strict=False)
        ]


def build_graph(delta: bool, run: PeerRun, checkpointer: BaseCheckpointSaver[Any] | None) -> Any:
    """The compiled ReAct graph; its agent node answers like our instant model."""

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        run.agent_calls.append(mark())
        n = len(run.agent_calls) - 1
        if n < run.steps:
            call = {"name": "run_command", "args": {"command": command(n)}, "id": f"call_{n:020d}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="Every service is green.")]}

    graph = StateGraph(DeltaState if delta else ListState)
    graph.add_node("agent", agent)  # type: ignore[type-var]  # its state is one of two TypedDicts
    graph.add_node("tools", ToolNode([run_command]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def timed_saver(saver: BaseCheckpointSaver[Any], run: PeerRun) -> BaseCheckpointSaver[Any]:
    """``saver`` with ``put`` and ``put_writes`` timed into ``run.saves``."""
    kind = type(saver)

    def timing(name: str) -> Callable[..., Any]:
        original = getattr(kind, name)

        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = mark()
            try:
                return original(self, *args, **kwargs)
            finally:
                run.saves.append((len(run.agent_calls), since(start)))

        return timed

    saver.__class__ = type(
        f"Timed{kind.__name__}", (kind,), {"put": timing("put"), "put_writes": timing("put_writes")}
    )
    return saver


def config(thread: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 2 * steps + 10}


def run_peer(
    steps: int,
    *,
    delta: bool,
    saver: BaseCheckpointSaver[Any] | None,
    thread: str = "bench",
    durability: str | None = None,
) -> PeerRun:
    """Run the conversation for ``steps`` steps (then an answer) on LangGraph."""
    run = PeerRun(steps)
    if saver is not None:
        timed_saver(saver, run)
    graph = build_graph(delta, run, saver)
    options = {} if durability is None else {"durability": durability}
    start = mark()
    final = graph.invoke(
        {"messages": [HumanMessage(FIRST_MESSAGE)]}, config(thread, steps), **options
    )
    run.seconds = since(start)
    check_messages(final["messages"], steps)
    return run


def check_messages(messages: list[Any], steps: int) -> None:
    """Fail loudly unless the messages are the conversation's: 1 + 2 a step + the answer."""
    if len(messages) != 2 * steps + 2 or messages[-1].content != "Every service is green.":
        raise AssertionError(
            f"LangGraph's conversation went wrong: {len(messages)} messages for {steps} steps"
        )
    if steps and messages[-2].content != result(steps - 1):
        raise AssertionError("LangGraph's last tool message is not the tool's result")


def get_state(graph: Any, thread: str, steps: int) -> Any:
    snapshot = graph.get_state({"configurable": {"thread_id": thread}})
    check_messages(snapshot.values["messages"], steps)
    return snapshot


# ------------------------------------------------------------------ savers
@contextlib.contextmanager
def sqlite_saver(path: Path) -> Iterator[SqliteSaver]:
    """A SqliteSaver on a file, as ``SqliteSaver.from_conn_string(path)`` opens it."""
    with SqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()
        yield saver


def sqlite_bytes(path: Path) -> int:
    """Bytes the database takes on disk once its write-ahead log is folded in."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(
        p.stat().st_size for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()
    )


@contextlib.contextmanager
def postgres_saver(url: str) -> Iterator[Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        yield saver


def postgres_bytes(url: str) -> int:
    """Bytes the checkpoint tables take (with their indexes and TOAST)."""
    import psycopg

    with psycopg.connect(url) as connection:
        row = connection.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()
    return int(row[0]) if row else 0
