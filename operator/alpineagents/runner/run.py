"""One run of an AgentRun, start to end: :func:`run_agent_run`.

It turns SIGTERM into a clean stop, opens the store (:func:`open_run_store`), loads the
saved State or starts one from the plan (:func:`open_state`), records the approvals the
spec gives (:func:`record_approvals`), runs the Agent, and reports how it ended: an
:class:`~alpineagents.pod_contract.ExitCode` and the termination message
(:func:`termination_message`), written where Kubernetes reads it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from .. import builtin_tools, tracing
from .. import model as _model
from ..agent import Agent
from ..errors import StateNotFoundError, StoreUnavailableError
from ..liveness import RunningElsewhere, holding_run
from ..messages import Message
from ..pacing import Throttle
from ..pod_contract import (
    ENV_STATE_ID,
    ENV_STORE,
    ExitCode,
    PendingApproval,
    RunOutcome,
    termination_message_json,
    write_termination_message,
)
from ..redaction import Redactor
from ..state import State, error_text
from ..store.base import Store
from ..store.url import open_store, redact
from ..toolsets import ToolsetUnavailable
from .build import build_agent, pacer_for
from .progress import LoggedStore, ProgressLog
from .spec import Approval, RunPlan, SpecError, parse_spec, read_manifest, spec_from_environment
from .startup import StartupMarks

__all__ = [
    "DEFAULT_STORE",
    "TRACE_FLUSH_SECONDS",
    "RunResult",
    "end_process",
    "error_message",
    "install_sigterm_handler",
    "open_run_store",
    "open_state",
    "record_approvals",
    "run_agent_run",
    "termination_message",
]

DEFAULT_STORE = "./.agent-runs"


def open_run_store(url: str | None, environ: Mapping[str, str] | None = None) -> Store:
    """The store at ``url`` (else ``ALPINEAGENTS_STORE``, else ``./.agent-runs``).

    Raises :class:`SpecError` for a URL it cannot use (unknown scheme, missing
    credentials) and :class:`~alpineagents.errors.StoreUnavailableError` when the store
    cannot be reached.
    """
    env = os.environ if environ is None else environ
    location = url or env.get(ENV_STORE) or DEFAULT_STORE
    try:
        return open_store(location, env=dict(env))
    except ImportError as error:
        # Not retryable: the store's client is not installed (or one of its parts).
        missing = (error.name or "").partition(".")[0]
        extra = "encryption" if missing == "cryptography" else "minio"
        raise SpecError(
            "store",
            f"{redact(location)} needs the {extra} extra ({error.name or error} is missing): "
            f"pip install 'alpineagents[{extra}]'",
        ) from None
    except (ValueError, TypeError, LookupError) as error:
        # The URL itself may hold a secret by mistake: it is never shown as given.
        raise SpecError("store", f"{redact(location)}: {error}") from None
    except Exception as error:
        raise StoreUnavailableError(
            f"cannot reach the store {redact(location)}: {error_text(error)}"
        ) from None


def open_state(store: Store, state_id: str, plan: RunPlan) -> tuple[State, list[str]]:
    """The saved State ``state_id`` (resume), or a new one from the plan's messages.

    Also returns the ids of the tool calls the load closed as aborted: calls that were
    running when the last process stopped without saving their result.
    """
    try:
        state = store.load(state_id)
    except StateNotFoundError:
        return State(state_id, plan.messages), []
    closing = state.history[state.loaded_entries :]
    aborted = [e.data["call_id"] for e in closing if e.outcome == "aborted"]
    return state, aborted


def record_approvals(state: State, approvals: Sequence[Approval]) -> list[Approval]:
    """Record each approval for a call that awaits one; return those recorded.

    Answers for other calls (already answered, or from earlier turns) are ignored, so a
    spec can keep every approval it ever gave.
    """
    awaiting = {call.id for call in state.awaiting_approval}
    recorded = []
    for approval in approvals:
        if approval.call_id in awaiting and state.approval(approval.call_id) is None:
            state.approve(approval.call_id, approval.allow, note=approval.note)
            recorded.append(approval)
    return recorded


@dataclass
class RunResult:
    """How a run ended: the exit code, the termination message, and the State if one was opened."""

    exit_code: int
    message: dict[str, Any]
    state: State | None = None

    @property
    def answer(self) -> str | None:
        return self.state.answer if self.state is not None else None


TRACE_FLUSH_SECONDS = 5.0
"""The most a process that ends waits for its last spans to be sent (see :func:`end_process`)."""


def end_process(code: int) -> NoReturn:
    """End this process with ``code`` now that its run reported: send the last spans (for
    at most :data:`TRACE_FLUSH_SECONDS`), flush the logs and the standard streams, and
    exit without Python's own finalization.

    That finalization collects every object the SDKs loaded (about 0.5 s of CPU here,
    nearly all of a stop): a pod's runner stopped by SIGTERM on a busy node, with a small
    CPU request, spent most of its grace period there after its State was saved. Nothing
    is left for it to do: the store's writes are synchronous and done, tool threads are
    daemons, shell commands were killed with their process groups.
    """
    tracing.flush(TRACE_FLUSH_SECONDS)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def install_sigterm_handler() -> Callable[[], None]:
    """Make SIGTERM raise ``SystemExit(143)``, so the run closes its calls and saves.

    Returns a function that puts the previous handler back. Does nothing off the main
    thread (only the main thread can handle signals).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    return lambda: _ignore(signal.signal(signal.SIGTERM, previous))


def run_agent_run(
    manifest: str | os.PathLike[str] | None = None,
    *,
    store_url: str | None = None,
    state_id: str | None = None,
    environ: Mapping[str, str] | None = None,
    log: ProgressLog | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> RunResult:
    """Run or resume one AgentRun, and report how it ended.

    The spec comes from ``manifest`` (an AgentRun YAML file) or else from the file
    ``ALPINEAGENTS_SPEC_FILE`` names or ``ALPINEAGENTS_SPEC``; the store from ``store_url``, ``ALPINEAGENTS_STORE`` or
    ``./.agent-runs``; the id from ``state_id``, ``ALPINEAGENTS_STATE_ID`` or the
    manifest's ``metadata.name``. The termination message is written to
    ``$TERMINATION_MESSAGE_PATH`` (or ``/dev/termination-log`` when it is writable).
    Never raises for a failed run: the result's exit code says what happened.
    """
    marks = StartupMarks()
    marks.mark("imported")
    restore = install_sigterm_handler()
    env = os.environ if environ is None else environ
    redactor = Redactor.from_environment(env)
    run = _Run(env, log, redactor, marks)
    try:
        result = run.execute(manifest, store_url, state_id, workdir)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else ExitCode.SIGTERM
        result = run.result(code, "stopped", f"stopped: {type(stop).__name__}({code})")
    except KeyboardInterrupt:
        result = run.result(ExitCode.INTERRUPTED, "stopped", "stopped: KeyboardInterrupt")
    finally:
        builtin_tools.stop_commands()
    # The report goes to the AgentRun's status and Events: no secret of the pod in it.
    result = RunResult(result.exit_code, redactor.data(result.message), result.state)
    with contextlib.suppress(SystemExit, KeyboardInterrupt):
        where = write_termination_message(result.message, env)
        if run.log is not None:
            run.log.finished(result.exit_code, result.message, where)
    restore()
    return result


class _Run:
    """One run's steps and what they found so far, for the termination message."""

    def __init__(
        self,
        environ: Mapping[str, str],
        log: ProgressLog | None,
        redactor: Redactor,
        marks: StartupMarks,
    ) -> None:
        self.environ = environ
        self.log = log
        self.redactor = redactor
        self.marks = marks
        self.state_id: str | None = None
        self.state: State | None = None
        self.store: LoggedStore | None = None
        self.aborted: list[str] = []

    def execute(
        self,
        manifest: str | os.PathLike[str] | None,
        store_url: str | None,
        state_id: str | None,
        workdir: str | os.PathLike[str] | None,
    ) -> RunResult:
        try:
            plan = self._plan(manifest, state_id)
            for warning in plan.warnings:
                self._note("warning", warning)
            self.store = LoggedStore(
                open_run_store(store_url, self.environ), self.log, self.redactor
            )
            agent = build_agent(plan, workdir=workdir, environ=self.environ)
            assert self.state_id is not None
            agent.pacer = agent.pacer or pacer_for(
                self.environ, self.state_id, plan.priority, agent.provider
            )
            agent.on_throttle = agent.on_throttle or self._throttled
            self.marks.mark("opened")
        except SpecError as error:
            return self.result(ExitCode.NOT_RETRYABLE, "failed", str(error))
        except StoreUnavailableError as error:
            return self.result(ExitCode.RETRYABLE, "retryable", str(error))
        assert self.state_id is not None
        try:
            # Held until the last save: readers tell a lost run from a running one by it.
            with holding_run(self.store.inner, self.state_id):
                return self._run(agent, plan)
        except RunningElsewhere as error:
            return self.result(ExitCode.RETRYABLE, "retryable", str(error))

    def _plan(self, manifest: str | os.PathLike[str] | None, state_id: str | None) -> RunPlan:
        if manifest is not None:
            spec, name = read_manifest(manifest)
            plan = parse_spec(spec, strict=True)
        else:
            name = None
            plan = parse_spec(spec_from_environment(self.environ))
        self.state_id = state_id or self.environ.get(ENV_STATE_ID) or name
        if not self.state_id:
            raise SpecError(
                "id",
                "no State id: pass --id, set ALPINEAGENTS_STATE_ID, or give the manifest a "
                "metadata.name",
            )
        return plan

    def _run(self, agent: Agent, plan: RunPlan) -> RunResult:
        store, state_id = self.store, self.state_id
        assert store is not None and state_id is not None
        try:
            self.state, self.aborted = open_state(store, state_id, plan)
            self.marks.mark("read")
            if self.state.loaded_entries:
                # Fence any older writer (a replaced pod) before this run changes anything;
                # after the load, the claim fails if someone wrote since (MinioStore).
                store.claim(state_id)
                self.marks.mark("claimed")
        except ValueError as error:  # a format this version cannot read, or a damaged record
            return self.result(ExitCode.NOT_RETRYABLE, "failed", error_message(error))
        except Exception as error:
            return self.result(ExitCode.RETRYABLE, "retryable", _store_problem(store, error))
        state = self.state
        if state.answer is None and not _has_credentials(self.environ, plan):
            return self.result(
                ExitCode.NOT_RETRYABLE,
                "failed",
                "ANTHROPIC_API_KEY is not set: export your API key, or run with --offline "
                "for the scripted echo model",
            )
        self._announce(store, state)
        changed = _changed_prompt(state, plan)
        if changed is not None:
            self._note("warning", changed)
        for approval in record_approvals(state, plan.approvals):
            word = "allowed" if approval.allow else "refused"
            self._note("approval", f"{approval.call_id} {word} (spec.approvals)")
        if agent.max_turns is not None:
            # spec.maxTurns counts the AgentRun's turns, across every process that ran it.
            agent.max_turns = max(0, agent.max_turns - state.turns)
        agent.store = store
        try:
            answer = agent.run(state)
        except (SystemExit, KeyboardInterrupt):
            raise
        except Exception as error:
            return self._failed(error)
        if answer is not None:
            return self.result(ExitCode.ANSWERED, "answered")
        if state.stopped == "waiting_for_approval":
            return self.result(ExitCode.WAITING_FOR_APPROVAL, "waiting_for_approval")
        if state.stopped == "max_turns":
            return self.result(ExitCode.MAX_TURNS, "max_turns")
        if state.stopped == "budget_exceeded":
            why = state.history[-1].data.get("error") if state.history else None
            return self.result(
                ExitCode.BUDGET_EXCEEDED,
                "budget_exceeded",
                f"stopped at the budget (spec.budget): {why}; raise it to go on",
            )
        return self.result(
            ExitCode.RETRYABLE, "retryable", f"the run stopped without an answer ({state.stopped})"
        )

    def _failed(self, error: Exception) -> RunResult:
        assert self.store is not None
        if error is self.store.failure:
            return self.result(ExitCode.RETRYABLE, "retryable", _store_problem(self.store, error))
        if _model.sdk_error(error, "APIStatusError"):
            status = int(getattr(error, "status_code", 0))
            if 400 <= status < 500 and status not in (408, 409, 429):
                return self.result(
                    ExitCode.NOT_RETRYABLE, "failed", f"the model refused: {error_text(error)}"
                )
        if _model.sdk_error(error, "APIError"):
            return self.result(
                ExitCode.RETRYABLE, "retryable", f"model unavailable: {error_text(error)}"
            )
        if isinstance(error, ToolsetUnavailable):
            return self.result(ExitCode.RETRYABLE, "retryable", f"tools unavailable: {error}")
        if isinstance(error, TypeError | ValueError):
            # The State, Agent or store do not fit together (e.g. an async-only store).
            return self.result(ExitCode.NOT_RETRYABLE, "failed", error_text(error))
        return self.result(ExitCode.RETRYABLE, "retryable", error_text(error))

    def _announce(self, store: Store, state: State) -> None:
        saved = state.loaded_entries
        startup = self.marks.fields()
        if saved == 0:
            self._note("start", f"{state.id} (a new State) in {store!r}", startup=startup)
            return
        status: str = "answered" if state.answer is not None else state.stopped or "interrupted"
        if state.stopped is None and state.history[saved - 1].kind == "permission":
            status = "answered by a person"
        turns = f"{state.turns} turn" + ("" if state.turns == 1 else "s")
        line = f"{state.id} at seq {saved} ({status}, {turns}) from {store!r}"
        if self.aborted:
            line += f"; closed as aborted: {', '.join(self.aborted)}"
        self._note("resume", line, startup=startup)

    def _throttled(self, state: State, throttle: Throttle) -> None:
        """A line for each wait for the key's capacity: a throttled run says so."""
        why = "refused (429/529), " if throttle.refused else ""
        place = f", place {throttle.position} in line" if throttle.position else ""
        self._note(
            "throttled",
            f"{why}waiting {throttle.seconds:.1f} s for {throttle.limit}{place} "
            f"({throttle.total:.1f} s so far)",
            limit=throttle.limit,
            waitSeconds=round(throttle.seconds, 3),
            waitedSeconds=round(throttle.total, 3),
            position=throttle.position,
        )

    def _note(self, event: str, text: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.note(event, text, state=self.state_id, **fields)

    def result(self, code: int, outcome: RunOutcome, error: str | None = None) -> RunResult:
        message = termination_message(
            outcome=outcome,
            state_id=self.state_id or "",
            state=self.state,
            error=error,
            aborted=self.aborted,
        )
        return RunResult(int(code), message, self.state)


def _changed_prompt(state: State, plan: RunPlan) -> str | None:
    """A warning when the spec's messages are not those the saved State began with: the
    saved State is resumed, and the edit would otherwise be silently ignored."""
    if not state.loaded_entries:
        return None
    saved = [e.data.get("message") for e in state.history[: len(plan.messages)]]
    if saved == [m.to_dict() for m in plan.messages]:
        return None
    first = state.history[0].data.get("message") or {}
    began = Message.from_dict(first).text if first else "?"
    began = began if len(began) <= 60 else began[:57] + "..."
    return (
        f"the spec's prompt is not the one {state.id} began with ({began!r}): this resumes "
        f"the saved State and its prompt; to start anew, alpineagents delete {state.id}, "
        f"or run with --id NEW-ID"
    )


def error_message(error: BaseException) -> str:
    """An error's own words for a user, without Python's class name (``StateFormatError:``
    says nothing to them); the class name only when the error has no words."""
    text = str(error.args[0]) if len(error.args) == 1 else str(error)
    return " ".join(text.split()) or type(error).__name__


def _store_problem(store: Store, error: BaseException) -> str:
    kind = "store unavailable" if isinstance(error, OSError) else "store failed"
    return f"{kind}: {store!r}: {error_text(error)}"


def _has_credentials(environ: Mapping[str, str], plan: RunPlan) -> bool:
    provider = plan.spec.get("provider")
    if isinstance(provider, Mapping) and provider.get("type", "anthropic") != "anthropic":
        return True  # the cloud's own identity: its SDK says what is missing, if anything
    return bool(environ.get("ANTHROPIC_API_KEY") or environ.get("ANTHROPIC_AUTH_TOKEN"))


def _ignore(value: object) -> None:
    return None


def termination_message(
    *,
    outcome: RunOutcome,
    state_id: str,
    state: State | None,
    error: str | None = None,
    aborted: Sequence[str] = (),
) -> dict[str, Any]:
    """The termination message of a run that got as far as ``state`` (see
    :class:`~alpineagents.pod_contract.TerminationMessage`); at most 4096 bytes."""
    saved = state.saved_entries if state is not None else 0
    return termination_message_json(
        outcome=outcome,
        state_id=state_id,
        last_saved_seq=saved - 1 if saved else None,
        turns=state.turns if state is not None else 0,
        usage=state.usage if state is not None else {},
        cost_usd=state.cost_usd if state is not None else 0.0,
        answer=state.answer if state is not None else None,
        error=error,
        pending_approvals=tuple(
            PendingApproval(call.id, call.name, call.input)
            for call in (state.awaiting_approval if state is not None else [])
        ),
        aborted=tuple(aborted),
    )
