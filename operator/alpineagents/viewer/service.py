"""What the viewer's web routes call: plain typed functions over a store and a cluster.

:class:`RunViewer` lists runs, follows one run (a snapshot, then only what is new, read
with ``store.aread_since``), hands out pages of a followed run's rows and whole entries,
and records approvals when they are turned on. Nothing here knows about HTTP; the tests
call it directly.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from alpineagents import State, StateInfo, Store, collection
from alpineagents.liveness import is_running
from alpineagents.state import check_format
from alpineagents.tracing import trace_id_of

from .attempts import RunCounts
from .cluster import Answer, Cluster, ClusterError, ClusterRun
from .row_filter import RowFilter, filtered_page
from .timeline import JSON, ROW_COLUMNS, WAITING_FOR_RESUME, Row, Timeline

FAST_POLL = 0.25  # seconds between two reads of a run that is going
SLOW_POLL = 1.0  # ... of a run that stopped (it may be resumed)
CLUSTER_EVERY = 2.0  # seconds between two reads of a followed run's AgentRun
FIRST_ROWS = 120  # rows of a run's first message: the screenful it opens on, and more
PAGE_LIMIT = 1000  # rows one page request may ask for
COUNT_READS = 8  # histories read at once to count the runs list's attempts


class ViewerError(Exception):
    """A request the viewer cannot do; ``status`` is the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RunListing:
    """One line of the runs list: a saved State, its AgentRun, or both."""

    id: str
    depth: int
    parent_id: str | None = None
    first_message: str | None = None
    updated_at: datetime | None = None
    stopped: str | None = None
    entries: int = 0
    turns: int = 0
    usage: Mapping[str, int] = field(default_factory=dict)
    answer: str | None = None
    children: int = 0
    saved: bool = True
    cluster: ClusterRun | None = None
    process: str | None = None
    """For an open State: ``waiting_for_resume`` when a person answered the calls it
    stopped for, else ``running`` or ``lost`` when its run lock tells (see
    :mod:`alpineagents.liveness`), else None."""
    attempts: int | None = None
    """In store mode (no cluster): how many processes ran it (see
    :mod:`alpineagents.viewer.attempts`); None when unknown."""
    aborted_calls: int | None = None
    """In store mode: its tool calls closed as aborted (a crash or an interrupt)."""

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "depth": self.depth,
            "parent_id": self.parent_id,
            "first_message": self.first_message,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "stopped": self.stopped,
            "entries": self.entries,
            "turns": self.turns,
            "usage": dict(self.usage),
            "answer": self.answer,
            "children": self.children,
            "saved": self.saved,
            "cluster": self.cluster.to_json() if self.cluster else None,
            "process": self.process,
            "attempts": self.attempts,
            "aborted_calls": self.aborted_calls,
        }


def run_listings(
    infos: Sequence[StateInfo], cluster_runs: Sequence[ClusterRun]
) -> list[RunListing]:
    """The runs list: top-level runs most recently updated first, each followed by its
    subagents (nested, oldest first), and AgentRuns whose State is not saved yet."""
    by_id = {info.id: info for info in infos}
    by_state = {run.state_id: run for run in cluster_runs}
    children: dict[str, list[StateInfo]] = {}
    roots: list[StateInfo] = []
    for info in infos:
        if info.parent_id is not None and info.parent_id in by_id and info.parent_id != info.id:
            children.setdefault(info.parent_id, []).append(info)
        else:
            roots.append(info)
    listing: list[RunListing] = []
    unsaved = [run for run in cluster_runs if run.state_id not in by_id]
    for run in sorted(unsaved, key=lambda r: (r.namespace, r.name)):
        listing.append(RunListing(id=run.state_id, depth=0, saved=False, cluster=run))

    def add(info: StateInfo, depth: int, seen: set[str]) -> None:
        kids = sorted(children.get(info.id, []), key=_oldest_first)
        listing.append(_listing(info, depth, len(kids), by_state.get(info.id)))
        for kid in kids:
            if kid.id not in seen:
                add(kid, depth + 1, seen | {kid.id})

    for root in roots:  # infos come most recently updated first
        add(root, 0, {root.id})
    return listing


def _oldest_first(info: StateInfo) -> str:
    return info.updated_at.isoformat() if info.updated_at else ""


def _listing(info: StateInfo, depth: int, children: int, run: ClusterRun | None) -> RunListing:
    usage = info.extra.get("usage")
    return RunListing(
        id=info.id,
        depth=depth,
        parent_id=info.parent_id,
        first_message=info.first_message,
        updated_at=info.updated_at,
        stopped=info.stopped,
        entries=info.entries,
        turns=int(info.extra.get("turns") or 0),
        usage=(
            {k: int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens")}
            if isinstance(usage, Mapping)
            else {}
        ),
        answer=info.answer,
        children=children,
        cluster=run,
    )


@dataclass
class Update:
    """One message of a followed run: rows new or changed since the last one, and the rest.

    The first one (``reset``) holds the last rows (the page opens at the bottom; it asks
    :meth:`RunViewer.page` for the others as they scroll into view, quoting ``follow_id``),
    and what the page shows in its header (``about``); ``gone`` says the State was
    deleted.
    """

    rows: list[Row]
    summary: JSON
    info: JSON
    next_seq: int
    reset: bool = False
    cluster: JSON | None = None
    gone: bool = False
    about: JSON | None = None
    follow_id: str | None = None
    process: str | None = None
    trace_url: str | None = None
    """The run's trace in the tracing UI (first message only, when one is configured)."""

    def to_json(self) -> JSON:
        """The message as the page gets it: rows as lists, their fields named once."""
        return {
            "columns": ROW_COLUMNS,
            "rows": [row.as_list() for row in self.rows],
            "summary": self.summary,
            "info": self.info,
            "next_seq": self.next_seq,
            "reset": self.reset,
            "cluster": self.cluster,
            "gone": self.gone,
            "about": self.about,
            "follow_id": self.follow_id,
            "process": self.process,
            "trace_url": self.trace_url,
        }


class RunViewer:
    """The viewer's functions over one store and, in cluster mode, one cluster.

    ``allow_approvals`` turns on :meth:`approve`; without it the viewer only reads.
    """

    def __init__(
        self,
        store: Store,
        *,
        cluster: Cluster | None = None,
        allow_approvals: bool = False,
        fast_poll: float = FAST_POLL,
        slow_poll: float = SLOW_POLL,
        trace_url: str | None = None,
    ) -> None:
        self.store = store
        self.trace_url = trace_url
        """A tracing UI's address of a trace, ``{trace_id}`` standing for its id (32 hex
        digits, as ``alpineagents.tracing`` makes it from the State id); None: no links."""
        self.cluster = cluster
        self.allow_approvals = allow_approvals
        self.fast_poll = fast_poll
        self.slow_poll = slow_poll
        self._followed: dict[str, tuple[str, Timeline]] = {}
        """The timelines of the runs being followed, by follow id: what pages come from."""
        self._counts: dict[str, RunCounts] = {}
        """Each listed State's attempts and aborted calls so far (store mode): a list
        reads only the entries saved since the last one."""

    def about(self) -> JSON:
        """What the page shows in its header: where it reads, and whether it may write."""
        return {
            "store": repr(self.store),
            "cluster": self.cluster.where if self.cluster else None,
            "approvals": self.allow_approvals,
        }

    def trace_link(self, state_id: str) -> str | None:
        """The address of the run's trace in the tracing UI, if one is configured."""
        if not self.trace_url:
            return None
        return self.trace_url.replace("{trace_id}", format(trace_id_of(state_id), "032x"))

    # ------------------------------------------------------------------ runs
    async def runs(self) -> JSON:
        """Every saved State (subagents under their parent) and, in cluster mode, every
        AgentRun; ``cluster_error`` says why the AgentRuns are missing, if they are."""
        try:
            infos = await self.store.alist()
        except Exception as error:
            raise ViewerError(f"cannot list {self.store!r}: {_text(error)}", 502) from None
        cluster_runs: list[ClusterRun] = []
        cluster_error = None
        if self.cluster is not None:
            try:
                cluster_runs = await asyncio.to_thread(self.cluster.runs)
            except ClusterError as error:
                cluster_error = str(error)
        listings = [
            replace(row, process=await self._open_run(row.id, row.entries))
            if row.saved and row.stopped is None and row.cluster is None
            else row
            for row in run_listings(infos, cluster_runs)
        ]
        if self.cluster is None:
            # The AgentRun's attempt and restarts are not there to tell a crashed run.
            reading = asyncio.Semaphore(COUNT_READS)
            listings = list(
                await asyncio.gather(*(self._with_counts(row, reading) for row in listings))
            )
            listed = {row.id for row in listings}
            for gone in [state_id for state_id in self._counts if state_id not in listed]:
                del self._counts[gone]
        return {
            "runs": [row.to_json() for row in listings],
            "cluster_error": cluster_error,
            **self.about(),
        }

    # ------------------------------------------------------------------ one run
    async def follow(
        self, state_id: str, *, still_wanted: Callable[[], Any] | None = None
    ) -> AsyncIterator[Update]:
        """A snapshot of the run, then an update each time entries are saved.

        Each read asks the store only for entries from the next seq on. Ends when
        ``still_wanted`` (awaited if it returns an awaitable) says False, or the State is
        deleted (a last update with ``gone``). While it goes on, :meth:`page` gives the
        rows of its timeline under the first update's ``follow_id``.
        """
        timeline = Timeline()
        process = await self._process(state_id)
        record = await self._read_since(state_id, 0)
        if record is None:
            raise ViewerError(f"no saved State {state_id!r} in {self.store!r}", 404)
        _check(state_id, record.info)
        run = await self._cluster_run(state_id)
        # The whole history at once: on a thread, so other requests are served meanwhile.
        await asyncio.to_thread(_build, timeline, record.entries)
        follow_id = secrets.token_urlsafe(12)
        self._followed[follow_id] = (state_id, timeline)
        try:
            count = len(timeline.rows)
            yield Update(
                rows=timeline.page(count - FIRST_ROWS, count),
                summary=timeline.summary.to_json(),
                info=dict(record.info),
                next_seq=timeline.next_seq,
                reset=True,
                cluster=run.to_json() if run else None,
                about=self.about(),
                follow_id=follow_id,
                process=process,
                trace_url=self.trace_link(state_id),
            )
            info, cluster_seen = dict(record.info), asyncio.get_running_loop().time()
            shown = run.to_json() if run else None
            while True:
                stopped = timeline.summary.stopped is not None
                await asyncio.sleep(self.slow_poll if stopped else self.fast_poll)
                if still_wanted is not None:
                    wanted = still_wanted()
                    if asyncio.iscoroutine(wanted):
                        wanted = await wanted
                    if not wanted:
                        return
                was = process
                if not stopped:
                    process = await self._process(state_id)
                record = await self._read_since(state_id, timeline.next_seq)
                if record is None:
                    summary = timeline.summary.to_json()
                    yield Update([], summary, info, timeline.next_seq, gone=True)
                    return
                rows = timeline.add(record.entries)
                now = asyncio.get_running_loop().time()
                fresh = shown
                if self.cluster is not None and now - cluster_seen >= CLUSTER_EVERY:
                    cluster_seen = now
                    run = await self._cluster_run(state_id)
                    fresh = run.to_json() if run else None
                if rows or record.info != info or fresh != shown or process != was:
                    info, shown = dict(record.info), fresh
                    yield Update(
                        rows=rows,
                        summary=timeline.summary.to_json(),
                        info=info,
                        next_seq=timeline.next_seq,
                        cluster=shown,
                        process=process,
                    )
        finally:
            del self._followed[follow_id]

    def page(
        self, state_id: str, follow_id: str, start: int, end: int, keep: RowFilter | None = None
    ) -> JSON:
        """Rows ``start`` to ``end`` (positions; widened to whole turns) of the run that
        the follow ``follow_id`` of :meth:`follow` shows, as the page gets rows.

        With a ``keep`` that filters (a search, errors only), the positions are those of
        the rows it keeps; see :func:`~alpineagents.viewer.row_filter.filtered_page`.
        """
        followed = self._followed.get(follow_id)
        if followed is None or followed[0] != state_id:
            raise ViewerError(
                f"{state_id!r} is not followed as {follow_id!r} (any more): reload the page",
                404,
            )
        if start < 0 or end < start or end - start > PAGE_LIMIT:
            raise ViewerError(f"ask for 0 to {PAGE_LIMIT} rows from position 0 or more")
        timeline = followed[1]
        if keep:
            return filtered_page(timeline, keep, start, end)
        return {
            "columns": ROW_COLUMNS,
            "rows": [row.as_list() for row in timeline.page(start, end)],
            "total_rows": len(timeline.rows),
        }

    async def entries(self, state_id: str, seqs: Sequence[int]) -> list[JSON]:
        """The whole saved entries ``seqs`` of a State (text and data), in seq order."""
        if not seqs:
            return []
        if min(seqs) < 0:
            raise ViewerError("seqs are 0 or more")
        record = await self._read_since(state_id, min(seqs))
        if record is None:
            raise ViewerError(f"no saved State {state_id!r} in {self.store!r}", 404)
        wanted = set(seqs)
        found = {int(e["seq"]): dict(e) for e in record.entries if int(e["seq"]) in wanted}
        return [found[seq] for seq in sorted(found)]

    # ------------------------------------------------------------------ approvals
    async def approve(self, state_id: str, answers: Sequence[Answer]) -> str:
        """Answer calls that wait for a person; returns where the answers went.

        For a State an AgentRun runs: into the AgentRun's ``spec.approvals`` (its operator
        resumes the run). Otherwise into the State itself, as ``state.approve`` (the next
        ``alpineagents run`` or ``agent.run`` goes on with them). Give every waiting call
        its answer in one call: a State saved with some answered calls and others still
        waiting would, on its next load, close the answered ones as aborted.
        """
        if not self.allow_approvals:
            raise ViewerError(
                "this viewer is read-only: start it with --allow-approvals to answer calls", 403
            )
        if not answers:
            raise ViewerError("no answers given")
        run = await self._cluster_run(state_id, strict=True)
        if run is not None:
            unknown = [a.call_id for a in answers if a.call_id not in run.pending_approvals]
            if unknown:
                _check_awaiting(await self._load(state_id), unknown)
            assert self.cluster is not None
            try:
                await asyncio.to_thread(self.cluster.approve, run, answers)
            except ClusterError as error:
                raise ViewerError(str(error), 409) from None
            return f"AgentRun {run.namespace}/{run.name} spec.approvals"
        state = await self._load(state_id)
        _check_awaiting(state, [a.call_id for a in answers])
        _check_not_running(state)
        missing = {c.id for c in state.awaiting_approval} - {a.call_id for a in answers}
        if missing:
            raise ViewerError(
                f"answer every waiting call of {state_id!r} at once (also {sorted(missing)}): "
                f"the run goes on only when all have an answer",
                409,
            )
        for answer in answers:
            state.approve(answer.call_id, answer.allow, note=answer.note)
        try:
            await self.store.asave(state)
        except Exception as error:
            raise ViewerError(f"saving the answers failed: {_text(error)}", 502) from None
        return f"State {state_id} in {self.store!r}"

    # ------------------------------------------------------------------ internals
    async def _with_counts(self, row: RunListing, reading: asyncio.Semaphore) -> RunListing:
        """The row with its run's attempts and aborted calls, reading only the entries
        saved since the last list (the first list reads each history once)."""
        if not row.saved:
            return row
        counts = self._counts.get(row.id)
        if counts is None or counts.next_seq > row.entries:  # new, or deleted and made anew
            counts = self._counts[row.id] = RunCounts()
        if counts.next_seq < row.entries:
            async with reading:
                try:
                    record = await self.store.aread_since(row.id, counts.next_seq)
                    if record is not None:
                        counts.add(record.entries)
                except Exception:
                    # The list shows what it can; the run's page says what failed.
                    del self._counts[row.id]
                    return row
        return replace(row, attempts=counts.attempts, aborted_calls=counts.aborted_calls)

    async def _read_since(self, state_id: str, seq: int) -> Any:
        try:
            return await self.store.aread_since(state_id, seq)
        except ValueError as error:
            raise ViewerError(_text(error), 400) from None
        except Exception as error:
            raise ViewerError(f"cannot read {self.store!r}: {_text(error)}", 502) from None

    async def _open_run(self, state_id: str, entries: int) -> str | None:
        """What an open State of the list is: ``waiting_for_resume`` (a person answered
        the calls it stopped for), else what :meth:`_process` tells."""
        try:
            last = await self.store.aread_since(state_id, max(0, entries - 1))
        except Exception:
            last = None  # the list shows what it can; the run's page says what failed
        if last is not None and last.entries:
            entry = last.entries[-1]
            if (
                entry.get("kind") == "permission"
                and (entry.get("data") or {}).get("by") == "person"
            ):
                return WAITING_FOR_RESUME
        return await self._process(state_id)

    async def _process(self, state_id: str) -> str | None:
        # Checked before the read that follows it: a run drops its lock after its last
        # save, so "lost" never hides entries saved before the process ended.
        try:
            running = await asyncio.to_thread(is_running, self.store, state_id)
        except OSError:
            return None
        return None if running is None else "running" if running else "lost"

    async def _load(self, state_id: str) -> State:
        try:
            return await self.store.aload(state_id)
        except LookupError:
            raise ViewerError(f"no saved State {state_id!r} in {self.store!r}", 404) from None
        except ValueError as error:
            raise ViewerError(_text(error), 400) from None

    async def _cluster_run(self, state_id: str, *, strict: bool = False) -> ClusterRun | None:
        if self.cluster is None:
            return None
        try:
            return await asyncio.to_thread(self.cluster.run_of, state_id)
        except ClusterError as error:
            if strict:
                raise ViewerError(str(error), 502) from None
            return None


def _build(timeline: Timeline, entries: Sequence[Mapping[str, Any]]) -> None:
    """Add a whole history to a new timeline; its rows all stay alive, so without the
    collector's passes (see :mod:`alpineagents.collection`)."""
    with collection.paused():
        timeline.add(entries)


def _check(state_id: str, info: Mapping[str, Any]) -> None:
    try:
        check_format(state_id, dict(info))
    except ValueError as error:
        raise ViewerError(str(error), 400) from None


def _check_awaiting(state: State, call_ids: Sequence[str]) -> None:
    waiting = {call.id for call in state.awaiting_approval}
    unknown = [call_id for call_id in call_ids if call_id not in waiting]
    if unknown:
        raise ViewerError(
            f"{', '.join(unknown)} of {state.id!r} does not wait for an answer "
            f"(waiting: {', '.join(sorted(waiting)) or 'none'})",
            409,
        )


def _check_not_running(state: State) -> None:
    # A run that waits for a person has stopped; only people's answers come after that.
    for entry in reversed(state.history):
        if entry.kind == "permission" and entry.data.get("by") == "person":
            continue
        if entry.kind == "stop" and entry.data.get("reason") == "waiting_for_approval":
            return
        break
    raise ViewerError(
        f"{state.id!r} is running (or its process was lost): answers are taken while it "
        f"waits, after it stopped",
        409,
    )


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
