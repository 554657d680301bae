"""Kill fuzzing of the library: SIGKILL and Ctrl+C at random instants, checked after each.

:class:`KillFuzz` starts campaign children (``tests.campaign.child``, forked), lets each
run for a random time, then kills it (SIGKILL) or interrupts it (SIGINT), and starts the
next child on the same State, until the State has answered every round of its plan; then
it starts the next planned run, until the fault budget is spent. After every child it
checks what the store holds (:meth:`KillFuzz.check_state`); at the end of each run, the
whole history (:meth:`KillFuzz.check_answered`); over the whole campaign, every request
the model received (no dangling tool call). A broken invariant fails at once with the
seed and the State it broke on.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import signal
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from alpineagents import State, Store
from alpineagents.testing import ModelServer
from tests.bench import forked
from tests.campaign import child
from tests.campaign.plan import NOTE_PREFIX, RunPlan, plan_run

WAIT = 120.0  # seconds a child may take to end after a fault: a safety net, not a measure
MAX_FAULTS_PER_RUN = 12  # then a run is left to finish, so every run ends answered
# Where fault instants fall: a fifth in a child's first 30 ms (startup, load, the first
# save), two fifths within 60 ms after its first tool started (concurrent tools, their
# results' saves), the rest anywhere over the duration of a whole run.
EARLY_SHARE, TOOL_SHARE = 0.2, 0.4
TOOL_WINDOW = 0.06


@dataclass
class Totals:
    """What a campaign did, and how often each invariant was checked and held."""

    store: str
    seed: int
    sigkills: int = 0
    ctrl_c_in_run: int = 0
    ctrl_c_outside_run: int = 0
    faults_missed: int = 0  # the child had answered and ended before the fault's instant
    children: int = 0
    runs_answered: int = 0
    rounds_answered: int = 0
    calls_answered: int = 0
    calls_aborted: int = 0  # in flight at a kill: closed by load with one aborted result
    requests_aborted: int = 0  # a model request in flight at a kill, taken back by load
    tool_starts: int = 0
    sends_checked: int = 0
    model_requests_checked: int = 0
    compactions: int = 0  # cleared and compaction entries in the runs that answered
    held: Counter[str] = field(default_factory=Counter)
    horizon: float = 0.0

    @property
    def ctrl_cs(self) -> int:
        return self.ctrl_c_in_run + self.ctrl_c_outside_run

    def line(self) -> str:
        return (
            f"{self.store}: {self.sigkills} SIGKILLs, {self.ctrl_cs} Ctrl+Cs "
            f"({self.ctrl_c_in_run} in agent.run), {self.children} children, "
            f"{self.runs_answered} runs answered, {self.calls_aborted} calls aborted, "
            f"{self.requests_aborted} model requests taken back, {self.tool_starts} tool "
            f"starts, {self.model_requests_checked} model requests checked, "
            f"{self.compactions} compactions, seed {self.seed}"
        )


class CampaignFailure(AssertionError):
    """An invariant did not hold."""


class KillFuzz:
    """One campaign over one store (see the module docstring)."""

    def __init__(
        self,
        *,
        kind: str,
        store_url: str,
        open_store: Callable[[], Store],
        child_env: dict[str, str],
        model: ModelServer,
        markers: Path,
        seed: int,
    ) -> None:
        self.kind = kind
        self.store_url = store_url
        self.open_store = open_store
        self.child_env = {**child_env, **model.env, "SSL_CERT_FILE": one_ca_file(markers.parent)}
        self.model = model
        self.markers = markers
        self.seed = seed
        self.instants = random.Random(f"{seed}-instants")
        self.totals = Totals(kind, seed)
        self.checked_requests = 0
        self.aborted_jobs: dict[str, int] = {}  # job -> its start markers when aborted
        self.sent: set[str] = set()

    # ------------------------------------------------------------------ the campaign
    def run(self, sigkills: int, ctrl_cs: int) -> Totals:
        """Deliver at least ``sigkills`` SIGKILLs and ``ctrl_cs`` Ctrl+Cs; return the totals.

        The seed fixes the plan of every run and the order of fault kinds and instants;
        which step of a run an instant hits depends on the machine's speed.
        """
        self.markers.mkdir(parents=True, exist_ok=True)
        self.totals.horizon = self.calibrate()
        faults = ["sigkill"] * sigkills + ["ctrl_c"] * ctrl_cs
        random.Random(f"{self.seed}-faults").shuffle(faults)
        number = 0
        while faults:
            number += 1
            plan = self.plan(str(number))
            delivered = 0
            while True:
                fault = faults[0] if faults and delivered < MAX_FAULTS_PER_RUN else None
                answered, hit = self.cycle(plan, fault)
                if hit:
                    faults.pop(0)
                    delivered += 1
                if answered:
                    self.check_answered(plan)
                    break
        self.check_model_requests()
        return self.totals

    def plan(self, number: str) -> RunPlan:
        return plan_run(random.Random(f"{self.seed}-{number}"), f"{self.kind}-{number}")

    def calibrate(self) -> float:
        """Run three plans without faults; the kill instants spread over their duration."""
        forked.warm_up()  # the forkserver's own start is not part of a run
        took = []
        for number in ("calibration1", "calibration2", "calibration3"):
            plan = self.plan(number)
            started = time.monotonic()
            answered, _ = self.cycle(plan, None)
            if not answered:
                raise CampaignFailure(f"{plan.state_id}: a child without faults did not answer")
            took.append(time.monotonic() - started)
            self.check_answered(plan)
        return 1.2 * sorted(took)[1]

    # ------------------------------------------------------------------ one child
    def cycle(self, plan: RunPlan, fault: str | None) -> tuple[bool, bool]:
        """Start a child on ``plan``, deliver ``fault`` at a random instant, check.

        Returns whether the run answered every round, and whether the fault hit the child
        (it may have answered and ended before the fault's instant).
        """
        before = self._saved_entries(plan.state_id)
        ours, theirs = multiprocessing.Pipe()
        process = forked.start(
            child.main,
            theirs,
            self.store_url,
            plan.to_dict(),
            str(self.markers),
            env=self.child_env,
        )
        theirs.close()
        self.totals.children += 1
        messages: list[tuple[str, Any]] = []
        try:
            ended = False
            if fault is not None:
                anchor, instant = self._instant()
                if anchor == "tool":
                    ended = self._receive(ours, process, messages, WAIT, until="tool")
                if not ended:
                    ended = self._receive(ours, process, messages, instant)
            if not ended and fault is not None:
                # ProcessLookupError: it ended just now and the forkserver, its parent,
                # reaped it before our wait saw it end: the fault missed it, as its exit
                # code will show.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(
                        process.pid or 0, signal.SIGKILL if fault == "sigkill" else signal.SIGINT
                    )
            self._receive(ours, process, messages, WAIT)
            process.join(WAIT)
            if process.is_alive():
                raise CampaignFailure(
                    f"{plan.state_id}: a child did not end {WAIT} s after a {fault}"
                )
        finally:
            if process.is_alive():
                process.kill()
                process.join()
            ours.close()
        return self._after(plan, fault, before, messages, process.exitcode)

    def _instant(self) -> tuple[str, float]:
        """Where a fault's instant counts from ("start" or "tool"), and how long after."""
        share = self.instants.random()
        if share < EARLY_SHARE:
            return "start", self.instants.uniform(0.0, 0.03)
        if share < EARLY_SHARE + TOOL_SHARE:
            return "tool", self.instants.uniform(0.0, TOOL_WINDOW)
        return "start", self.instants.uniform(0.0, self.totals.horizon)

    def _receive(
        self,
        connection: Connection,
        process: BaseProcess,
        into: list[tuple[str, Any]],
        timeout: float,
        *,
        until: str | None = None,
    ) -> bool:
        """Collect the child's messages for ``timeout`` seconds, or until one of kind
        ``until`` arrives; True once the child has ended."""
        deadline = time.monotonic() + timeout
        waiting_on: list[Any] = [connection, process.sentinel]
        while True:
            ready = wait(waiting_on, timeout=max(0.0, deadline - time.monotonic()))
            if connection in ready:
                try:
                    into.append(connection.recv())
                except EOFError:
                    waiting_on.remove(connection)  # it closed its end: it is ending
                else:
                    if until is not None and into[-1][0] == until:
                        return False
                continue
            if process.sentinel in ready:
                while connection in waiting_on and connection.poll():  # sent just before the end
                    try:
                        into.append(connection.recv())
                    except EOFError:
                        break
                return True
            if time.monotonic() >= deadline:
                return False

    def _after(
        self,
        plan: RunPlan,
        fault: str | None,
        before: list[dict[str, Any]],
        messages: list[tuple[str, Any]],
        exitcode: int | None,
    ) -> tuple[bool, bool]:
        answered = any(kind == "answered" for kind, _ in messages)
        interrupted = [info for kind, info in messages if kind == "interrupted"]
        self.sent.update(str(token) for kind, token in messages if kind == "sent")
        hit = True
        if exitcode == -signal.SIGKILL:
            self.totals.sigkills += 1
        elif interrupted:
            if interrupted[0]["in_run"]:
                self.totals.ctrl_c_in_run += 1
            else:
                self.totals.ctrl_c_outside_run += 1
        elif fault == "ctrl_c" and exitcode in (1, 130):  # before the child's own code ran
            self.totals.ctrl_c_outside_run += 1
        elif answered and exitcode == 0:
            hit = False
            self.totals.faults_missed += fault is not None
        else:
            raise CampaignFailure(
                f"{plan.state_id}: a child ended with code {exitcode} after {fault}: {messages}"
            )
        self.check_state(plan, before, interrupted[0] if interrupted else None)
        return answered and exitcode == 0, hit

    # ------------------------------------------------------------------ the checks
    def check_state(
        self, plan: RunPlan, before: list[dict[str, Any]], interrupted: dict[str, Any] | None
    ) -> None:
        """What must hold after any child, killed or not."""
        store = self.open_store()
        record = store.read(plan.state_id)
        entries = list(record.entries) if record is not None else []
        where = f"{self.kind} State {plan.state_id!r} (seed {self.totals.seed})"
        self._hold(entries[: len(before)] == before, "saved entries only grow", where)
        seqs = [int(e["seq"]) for e in entries]
        self._hold(seqs == list(range(len(entries))), "seqs have no gaps", where)
        if record is None:
            return
        first, second = store.load(plan.state_id), store.load(plan.state_id)
        self._hold(first == second, "two loads are equal", where)
        closing = first.history[len(entries) :]
        if interrupted is not None and interrupted["in_run"]:
            # A tool that outlives the run may send a note as the run ends: the run's end
            # saves it after the stop (send returned, so it must be there), and the next
            # load lets it join. Nothing else may follow the stop or be left open.
            after_stop = entries[interrupted["entries"] :]
            self._hold(
                interrupted["saved"] == len(entries) >= interrupted["entries"]
                and all(e.get("kind") == "waiting" for e in after_stop)
                and all(e.kind == "joined" for e in closing)
                and len(closing) == len(after_stop),
                "Ctrl+C in a run leaves all of it saved, nothing open",
                where,
            )
        jobs = _jobs_by_call(first)
        started = self._starts()
        for entry in closing:
            if entry.kind == "model_error":
                self.totals.requests_aborted += 1
            if entry.kind == "tool_result":
                job = jobs[entry.data["call_id"]]
                self._hold(entry.outcome == "aborted", "an open call is closed as aborted", where)
                if job not in self.aborted_jobs:
                    self.totals.calls_aborted += 1
                self.aborted_jobs[job] = started[job]
        for job in plan.jobs:
            self._hold(started[job] <= 1, "no call is started twice", f"{where}, job {job}")
        for job, count in self.aborted_jobs.items():
            if job.startswith(plan.state_id + "-r"):
                self._hold(started[job] == count, "an aborted call is never started again", where)
        saved_text = json.dumps(entries)
        for token in self.sent:
            if token.startswith(plan.state_id + "-r"):
                self._hold(
                    json.dumps(NOTE_PREFIX + token) in saved_text,
                    "a message is saved once send returned",
                    f"{where}, note {token}",
                )
        self.check_model_requests()

    def check_answered(self, plan: RunPlan) -> None:
        """A run that answered every round: each call has exactly one result."""
        state = self.open_store().load(plan.state_id)
        where = f"{self.kind} State {plan.state_id!r} (seed {self.totals.seed})"
        self.totals.compactions += sum(e.kind in ("cleared", "compaction") for e in state.history)
        jobs = _jobs_by_call(state)
        results = Counter(e.data["call_id"] for e in state.history if e.kind == "tool_result")
        self._hold(
            set(results) == set(jobs) and set(results.values()) == {1},
            "every call has exactly one result",
            where,
        )
        self._hold(sorted(jobs.values()) == sorted(plan.jobs), "every planned call was made", where)
        started = self._starts()
        for entry in state.history:
            if entry.kind == "tool_result" and entry.outcome == "ok":
                self._hold(
                    started[jobs[entry.data["call_id"]]] == 1,
                    "a call with a saved result ran exactly once",
                    where,
                )
        for job in plan.jobs:
            if job in self.aborted_jobs:
                outcome = next(
                    e.outcome
                    for e in state.history
                    if e.kind == "tool_result" and jobs[e.data["call_id"]] == job
                )
                self._hold(outcome == "aborted", "an aborted call keeps its aborted result", where)
        self._hold(state.answer is not None, "the run ends answered", where)
        self.totals.runs_answered += 1
        self.totals.rounds_answered += len(plan.rounds)
        self.totals.calls_answered += len(jobs)
        self.totals.sends_checked += sum(
            1 for token in self.sent if token.startswith(plan.state_id + "-r")
        )

    def check_model_requests(self) -> None:
        """No request the model received has a tool call without its result."""
        requests = self.model.requests
        for request in requests[self.checked_requests :]:
            problem = dangling_tool_call(request.body)
            self._hold(problem is None, "no dangling tool call reaches the model", str(problem))
        self.totals.model_requests_checked += len(requests) - self.checked_requests
        self.checked_requests = len(requests)

    def _hold(self, holds: bool, invariant: str, where: str) -> None:
        if not holds:
            raise CampaignFailure(f"{invariant}: broken at {where}")
        self.totals.held[invariant] += 1

    def _starts(self) -> Counter[str]:
        starts = Counter(path.name.split(".", 1)[0] for path in self.markers.iterdir())
        self.totals.tool_starts = sum(starts.values())
        return starts

    def _saved_entries(self, state_id: str) -> list[dict[str, Any]]:
        record = self.open_store().read(state_id)
        return list(record.entries) if record is not None else []


def one_ca_file(folder: Path) -> str:
    """A CA file with one certificate of the system's, for the children's model clients.

    The model server speaks plain HTTP, so no certificate is ever checked; but each run
    builds an ``anthropic`` client, which loads the CA file, and the system's whole bundle
    costs a tenth of a second of CPU each time: hundreds of children would pay minutes.
    """
    bundle = Path(ssl.get_default_verify_paths().openssl_cafile).read_text(encoding="ascii")
    end = "-----END CERTIFICATE-----\n"
    path = folder / "one-ca.pem"
    path.write_text(bundle[bundle.index("-----BEGIN CERTIFICATE-----") : bundle.index(end)] + end)
    return str(path)


def _jobs_by_call(state: State) -> dict[str, str]:
    """The job of every tool call in the State's history, by call id."""
    jobs = {}
    for entry in state.history:
        if entry.kind == "model_reply":
            for block in entry.data["message"]["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    jobs[block["id"]] = str(block["input"]["job"])
    return jobs


def dangling_tool_call(body: Any) -> str | None:
    """Why a Messages API request has a tool_use without its tool_result, or None."""
    messages = body.get("messages") or []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        calls = {b["id"] for b in message["content"] if b.get("type") == "tool_use"}
        if not calls:
            continue
        following = messages[index + 1] if index + 1 < len(messages) else {}
        content = following.get("content") if following.get("role") == "user" else None
        answered = {
            b.get("tool_use_id")
            for b in (content if isinstance(content, list) else [])
            if b.get("type") == "tool_result"
        }
        if calls - answered:
            return f"message {index} calls {sorted(calls - answered)} with no result after it"
    return None
