"""The runner: what an agent pod runs, and ``alpineagents run`` on a laptop.

It turns SIGTERM into a clean stop, reads an AgentRun spec into a :class:`RunPlan`,
builds the Agent, loads the saved State if the store has it (resume) or creates it
from the spec, records the approvals the spec gives, runs it, and reports how it ended:
an :class:`ExitCode` and a termination message (one JSON object, see
:func:`termination_message`) written where Kubernetes reads it.

Each step is a plain function, so the CLI and tests can call them one by one;
:func:`run_agent_run` strings them together.
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import enum
import importlib
import inspect
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal, TextIO

import anthropic
import yaml

from . import builtin_tools
from .agent import Agent
from .messages import Message
from .model import Retry
from .permissions import Decision, Policy
from .state import Entry, State, ToolCall, error_text
from .store import Record, StateInfo, Store

API_VERSION = "alpineagents.dev/v1"
KIND = "AgentRun"
DEFAULT_STORE = "./.agent-runs"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096  # bytes the kubelet keeps of a termination message
ANSWER_EXCERPT = 1000

LogFormat = Literal["text", "json"]


class ExitCode(enum.IntEnum):
    """How the runner's process ends; the operator decides what to do next from it."""

    ANSWERED = 0
    """The model answered; the State is saved and final."""
    NOT_RETRYABLE = 65
    """A retry cannot help: bad spec, unknown tool, the ``agent`` factory does not
    import, a model request the API refuses (4xx), a State saved in an unreadable format."""
    RETRYABLE = 75
    """The model or the store is unavailable, or another error a retry may fix."""
    WAITING_FOR_APPROVAL = 76
    """Saved and stopped: tool calls wait for a person's answer (``spec.approvals``)."""
    MAX_TURNS = 77
    """Saved and stopped at ``spec.maxTurns``; final."""
    INTERRUPTED = 130
    """Ctrl+C: saved, resumable."""
    SIGTERM = 143
    """SIGTERM (``SystemExit(143)``): saved, resumable."""


_OUTCOMES: dict[int, str] = {
    ExitCode.ANSWERED: "answered",
    ExitCode.NOT_RETRYABLE: "failed",
    ExitCode.RETRYABLE: "retryable",
    ExitCode.WAITING_FOR_APPROVAL: "waiting_for_approval",
    ExitCode.MAX_TURNS: "max_turns",
}


class SpecError(ValueError):
    """A spec, manifest or setting the runner cannot use; names the field and what to do."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer; a retry may help."""


# ============================================================================ the plan


@dataclass(frozen=True)
class Approval:
    """A person's answer to a tool call that asked for approval (``spec.approvals[]``)."""

    call_id: str
    allow: bool
    note: str = ""


@dataclass(frozen=True)
class RunPlan:
    """What an AgentRun spec asks for, checked. ``spec`` is the raw spec, for factories."""

    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    max_turns: int | None = None
    max_tokens: int | None = None
    tools: tuple[str, ...] = ()
    agent: str | None = None
    require_approval: tuple[str, ...] = ()
    approvals: tuple[Approval, ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


_SPEC_FIELDS = (
    "model",
    "prompt",
    "messages",
    "system",
    "maxTurns",
    "maxTokens",
    "tools",
    "agent",
    "requireApproval",
    "approvals",
)
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_spec(spec: object, *, where: str = "spec") -> RunPlan:
    """Check an AgentRun ``.spec`` (camelCase fields) and turn it into a :class:`RunPlan`.

    Raises :class:`SpecError` naming the first field that is wrong. Fields the runner does
    not read are left to the operator; one that looks like a misspelt runner field gives a
    warning in ``RunPlan.warnings``.
    """
    if not isinstance(spec, Mapping):
        raise SpecError(where, "must be a mapping of fields (model, prompt, tools, ...)")
    model = spec.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SpecError(f"{where}.model", "required: the Claude model to run, e.g. claude-sonnet-5")
    messages = _parse_messages(spec, where)
    system = _optional(spec, "system", where)
    max_turns = _positive_int(spec, "maxTurns", where)
    max_tokens = _positive_int(spec, "maxTokens", where)
    tools = tuple(_names(spec, "tools", where))
    unknown = [name for name in tools if name not in builtin_tools.NAMES]
    if unknown:
        raise SpecError(
            f"{where}.tools",
            f"unknown tool {unknown[0]!r}; built-in tools are: {', '.join(builtin_tools.NAMES)}",
        )
    agent = _optional(spec, "agent", where)
    if agent is not None and not _IMPORT_PATH.match(agent):
        raise SpecError(
            f"{where}.agent",
            f"{agent!r} is not an import path; write it as package.module:factory",
        )
    warnings = []
    for key in spec:
        if key not in _SPEC_FIELDS:
            close = difflib.get_close_matches(str(key), _SPEC_FIELDS, n=1, cutoff=0.8)
            if close or str(key).lower() in {f.lower() for f in _SPEC_FIELDS}:
                hint = close[0] if close else str(key)
                warnings.append(
                    f"{where}.{key}: not a field the runner reads; did you mean {hint!r}?"
                )
    return RunPlan(
        model=model,
        messages=messages,
        system=system,
        max_turns=max_turns,
        max_tokens=max_tokens,
        tools=tools,
        agent=agent,
        require_approval=tuple(_names(spec, "requireApproval", where)),
        approvals=_parse_approvals(spec, where),
        spec=dict(spec),
        warnings=tuple(warnings),
    )


def _parse_messages(spec: Mapping[str, Any], where: str) -> tuple[Message, ...]:
    prompt, raw = spec.get("prompt"), spec.get("messages")
    if prompt is not None and raw is not None:
        raise SpecError(where, "give either prompt or messages, not both")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecError(f"{where}.prompt", "must be a non-empty string")
        return (Message.user(prompt),)
    if raw is None:
        raise SpecError(where, "needs a prompt (a string) or messages (a list of {role, content})")
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{where}.messages", "must be a non-empty list of {role, content}")
    messages = []
    for index, item in enumerate(raw):
        at = f"{where}.messages[{index}]"
        if not isinstance(item, Mapping):
            raise SpecError(at, "must be a mapping with role and content")
        if item.get("role") not in ("user", "assistant"):
            raise SpecError(f"{at}.role", "must be 'user' or 'assistant'")
        content = item.get("content")
        is_blocks = isinstance(content, list) and all(
            isinstance(b, Mapping) and "type" in b for b in content
        )
        if not (isinstance(content, str) and content) and not (is_blocks and content):
            raise SpecError(f"{at}.content", "must be text or a list of content blocks")
        messages.append(Message.from_dict({"role": item["role"], "content": content}))
    if messages[0].role != "user":
        raise SpecError(f"{where}.messages[0].role", "the first message must be the user's")
    return tuple(messages)


def _optional(spec: Mapping[str, Any], key: str, where: str) -> str | None:
    value = spec.get(key)
    if value is not None and not isinstance(value, str):
        raise SpecError(f"{where}.{key}", f"must be a string, not {type(value).__name__}")
    return value


def _positive_int(spec: Mapping[str, Any], key: str, where: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{where}.{key}", f"must be a whole number of at least 1, not {value!r}")
    return value


def _names(spec: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SpecError(f"{where}.{key}", "must be a list of tool names")
    return list(dict.fromkeys(value))


def _parse_approvals(spec: Mapping[str, Any], where: str) -> tuple[Approval, ...]:
    value = spec.get("approvals")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(f"{where}.approvals", "must be a list of {callId, allow, note}")
    approvals = []
    for index, item in enumerate(value):
        at = f"{where}.approvals[{index}]"
        if not isinstance(item, Mapping):
            raise SpecError(at, "must be a mapping with callId and allow")
        call_id, allow, note = item.get("callId"), item.get("allow"), item.get("note", "")
        if not isinstance(call_id, str) or not call_id:
            raise SpecError(f"{at}.callId", "required: the id of the tool call being answered")
        if not isinstance(allow, bool):
            raise SpecError(f"{at}.allow", "required: true to run the call, false to refuse it")
        if not isinstance(note, str):
            raise SpecError(f"{at}.note", "must be a string")
        approvals.append(Approval(call_id, allow, note))
    return tuple(approvals)


def read_manifest(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str | None]:
    """Read an AgentRun manifest (YAML): its ``spec`` and ``metadata.name``.

    Raises :class:`SpecError` for an unreadable file, bad YAML or a manifest that is not
    an ``alpineagents.dev/v1`` AgentRun.
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(where, f"cannot read it: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise SpecError(where, "is not UTF-8 text") from None
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(where, f"not valid YAML: {_yaml_problem(error)}") from None
    if not isinstance(manifest, Mapping):
        raise SpecError(
            where, f"must be an {KIND} manifest (a mapping with apiVersion, kind, spec)"
        )
    if manifest.get("apiVersion") != API_VERSION:
        raise SpecError(
            f"{where}: apiVersion",
            f"must be {API_VERSION}, not {manifest.get('apiVersion')!r}",
        )
    if manifest.get("kind") != KIND:
        raise SpecError(f"{where}: kind", f"must be {KIND}, not {manifest.get('kind')!r}")
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: spec", "required: a mapping with model, prompt, ...")
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if name is not None and (not isinstance(name, str) or not name):
        raise SpecError(f"{where}: metadata.name", "must be a non-empty string")
    return dict(spec), name


def spec_from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The spec a pod gets as JSON: in the file ``ALPINEAGENTS_SPEC_FILE`` names (the
    operator mounts it from a Secret), else in ``ALPINEAGENTS_SPEC`` itself (what older
    operators set; exec refuses a variable over 128 KiB, so a long prompt needs the file).
    """
    path = environ.get("ALPINEAGENTS_SPEC_FILE")
    if path:
        where = f"ALPINEAGENTS_SPEC_FILE ({path})"
        try:
            raw = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SpecError(where, f"cannot be read: {error_text(error)}") from None
    else:
        where = "ALPINEAGENTS_SPEC"
        raw = environ.get("ALPINEAGENTS_SPEC", "")
        if not raw:
            raise SpecError(
                "ALPINEAGENTS_SPEC",
                "not set: give an AgentRun manifest (alpineagents run FILE.yaml), set "
                "ALPINEAGENTS_SPEC_FILE to a file holding the spec as JSON, or set "
                "ALPINEAGENTS_SPEC to the spec as JSON",
            )
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as error:
        raise SpecError(where, f"not valid JSON: {error}") from None
    if not isinstance(spec, dict):
        raise SpecError(where, "must be a JSON object (the AgentRun's .spec)")
    return spec


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())


# ============================================================================ the store


def open_run_store(url: str | None, environ: Mapping[str, str] | None = None) -> Store:
    """The store at ``url`` (else ``ALPINEAGENTS_STORE``, else ``./.agent-runs``).

    Raises :class:`SpecError` for a URL it cannot use (unknown scheme, missing
    credentials) and :class:`StoreUnavailable` when the store cannot be reached.
    """
    from .store_url import open_store, redact

    env = os.environ if environ is None else environ
    location = url or env.get("ALPINEAGENTS_STORE") or DEFAULT_STORE
    try:
        return open_store(location, env=dict(env))
    except (ValueError, TypeError, LookupError) as error:
        # The URL itself may hold a secret by mistake: it is never shown as given.
        raise SpecError("store", f"{redact(location)}: {error}") from None
    except Exception as error:
        raise StoreUnavailable(
            f"cannot reach the store {redact(location)}: {error_text(error)}"
        ) from None


class _LoggedStore(Store):
    """The runner's view of its store: the same store, logging each entry it saves.

    It also remembers the last error the store raised, so the runner can tell a store
    that went away (retryable) from the run's own errors.
    """

    def __init__(self, inner: Store, log: ProgressLog | None) -> None:
        self.inner = inner
        self.log = log
        self.failure: BaseException | None = None
        self._logged: dict[str, int] = {}

    def write(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        with self._noting_failure():
            self.inner.write(state_id, entries, info, create=create)
        done = self._logged.get(state_id, 0)
        new = [e for e in entries if int(e["seq"]) >= done]  # a retried save resends entries
        if new:
            self._logged[state_id] = int(new[-1]["seq"]) + 1
            if self.log is not None:
                self.log.saved(state_id, new)

    def read(self, state_id: str) -> Record | None:
        with self._noting_failure():
            record = self.inner.read(state_id)
        if record is not None:
            self._logged[state_id] = len(record.entries)
        return record

    def list(self) -> builtins.list[StateInfo]:
        with self._noting_failure():
            return self.inner.list()

    def delete(self, state_id: str) -> None:
        with self._noting_failure():
            self.inner.delete(state_id)

    def same_as(self, other: Store) -> bool:
        if isinstance(other, _LoggedStore):
            other = other.inner
        return other is self.inner or self.inner.same_as(other)

    def claim(self, state_id: str) -> None:
        """Fence older writers of ``state_id`` if the store can (MinioStore can)."""
        claim = getattr(self.inner, "claim", None)
        if callable(claim):
            with self._noting_failure():
                claim(state_id)

    @contextlib.contextmanager
    def _noting_failure(self) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            self.failure = error
            raise

    def __repr__(self) -> str:
        return repr(self.inner)


# ============================================================================ the agent


def build_agent(
    plan: RunPlan,
    *,
    workdir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Agent:
    """The Agent the plan asks for: the built-in tools, or the ``agent`` factory's Agent.

    With ``agent``, the factory is imported and called (with the spec dict if it takes
    one argument); the spec's model is set on its Agent, and the spec's other fields,
    when given, apply on top (tools are added, ``requireApproval`` asks first).
    Raises :class:`SpecError` for anything that does not fit.
    """
    env = os.environ if environ is None else environ
    retry = _retry_from(env)
    tools = builtin_tools.make_tools(plan.tools, workdir=workdir or os.getcwd())
    if plan.agent is None:
        agent = Agent(
            plan.model,
            tools=tools,
            system=plan.system,
            max_tokens=plan.max_tokens or 8192,
            max_turns=plan.max_turns,
            retry=retry,
        )
    else:
        agent = _agent_from_factory(plan.agent, plan.spec)
        agent.model = plan.model
        clash = [t.name for t in tools if t.name in agent.tools]
        if clash:
            raise SpecError(
                "spec.tools",
                f"{clash[0]!r} is also a tool of the Agent from {plan.agent}; list it in one place",
            )
        agent.tools.update({t.name: t for t in tools})
        if plan.system is not None:
            agent.system = plan.system
        if plan.max_tokens is not None:
            agent.max_tokens = plan.max_tokens
        if plan.max_turns is not None:
            agent.max_turns = plan.max_turns
        if retry is not None:
            agent.retry = retry
    if plan.require_approval:
        unknown = [name for name in plan.require_approval if name not in agent.tools]
        if unknown:
            known = ", ".join(sorted(agent.tools)) or "none"
            raise SpecError(
                "spec.requireApproval",
                f"{unknown[0]!r} is not a tool of this agent (its tools: {known})",
            )
        agent.permissions = _asking_first(frozenset(plan.require_approval), agent.permissions)
    return agent


def _asking_first(names: frozenset[str], policy: Policy) -> Policy:
    def decide(call: ToolCall) -> Decision:
        decision = policy(call)
        if decision != "refuse" and call.name in names:
            return "ask"
        return decision

    return decide


def _retry_from(environ: Mapping[str, str]) -> Retry | None:
    raw = environ.get("ALPINEAGENTS_MODEL_RETRIES")
    if raw is None or raw == "":
        return None
    try:
        attempts = int(raw)
    except ValueError:
        attempts = 0
    if attempts < 1:
        raise SpecError(
            "ALPINEAGENTS_MODEL_RETRIES",
            f"must be a whole number of at least 1 (attempts per model request), not {raw!r}",
        )
    return Retry(attempts=attempts)


def _agent_from_factory(path: str, spec: Mapping[str, Any]) -> Agent:
    module_name, _, attribute = path.partition(":")
    # Like `python -m`: the folder a user runs from holds their agent module.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise SpecError(
            "spec.agent",
            f"cannot import {module_name!r} ({error_text(error)}); install it in the image "
            f"or put it on PYTHONPATH",
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise SpecError(
                "spec.agent", f"{module_name!r} has no {attribute!r}; check the name after ':'"
            ) from None
    if not callable(target):
        raise SpecError("spec.agent", f"{path} is not callable; point it at a factory function")
    try:
        agent = target(dict(spec)) if _takes_an_argument(target) else target()
    except Exception as error:
        raise SpecError("spec.agent", f"{path} raised {error_text(error)}") from None
    if not isinstance(agent, Agent):
        raise SpecError(
            "spec.agent", f"{path} returned {type(agent).__name__}, not an alpineagents.Agent"
        )
    return agent


def _takes_an_argument(factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(p.kind in positional for p in parameters)


# ============================================================================ the State


def open_state(store: Store, state_id: str, plan: RunPlan) -> tuple[State, list[str]]:
    """The saved State ``state_id`` (resume), or a new one from the plan's messages.

    Also returns the ids of the tool calls the load closed as aborted: calls that were
    running when the last process stopped without saving their result.
    """
    try:
        state = store.load(state_id)
    except LookupError as error:
        if isinstance(error, KeyError | IndexError):  # a damaged record, not a missing one
            raise
        return State(state_id, plan.messages), []
    closing = state.history[_saved_count(state) :]
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


def _saved_count(state: State) -> int:
    # The State keeps how many of its entries its store has; the runner reports it.
    return state.saved_entries


# ============================================================================ the run


@dataclass
class RunResult:
    """How a run ended: the exit code, the termination message, and the State if one was opened."""

    exit_code: int
    message: dict[str, Any]
    state: State | None = None

    @property
    def answer(self) -> str | None:
        return self.state.answer if self.state is not None else None


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
    restore = install_sigterm_handler()
    env = os.environ if environ is None else environ
    run = _Run(env, log)
    try:
        result = run.execute(manifest, store_url, state_id, workdir)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else ExitCode.SIGTERM
        result = run.result(code, "stopped", f"stopped: {type(stop).__name__}({code})")
    except KeyboardInterrupt:
        result = run.result(ExitCode.INTERRUPTED, "stopped", "stopped: KeyboardInterrupt")
    finally:
        builtin_tools.stop_commands()
    with contextlib.suppress(SystemExit, KeyboardInterrupt):
        where = write_termination_message(result.message, env)
        if run.log is not None:
            run.log.finished(result, where)
    restore()
    return result


class _Run:
    """One run's steps and what they found so far, for the termination message."""

    def __init__(self, environ: Mapping[str, str], log: ProgressLog | None) -> None:
        self.environ = environ
        self.log = log
        self.state_id: str | None = None
        self.state: State | None = None
        self.store: _LoggedStore | None = None
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
            self.store = _LoggedStore(open_run_store(store_url, self.environ), self.log)
            agent = build_agent(plan, workdir=workdir, environ=self.environ)
        except SpecError as error:
            return self.result(ExitCode.NOT_RETRYABLE, "failed", str(error))
        except StoreUnavailable as error:
            return self.result(ExitCode.RETRYABLE, "retryable", str(error))
        return self._run(agent, plan)

    def _plan(self, manifest: str | os.PathLike[str] | None, state_id: str | None) -> RunPlan:
        if manifest is not None:
            spec, name = read_manifest(manifest)
            plan = parse_spec(spec)
        else:
            name = None
            plan = parse_spec(spec_from_environment(self.environ))
        self.state_id = state_id or self.environ.get("ALPINEAGENTS_STATE_ID") or name
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
            if _saved_count(self.state):
                # Fence any older writer (a replaced pod) before this run changes anything;
                # after the load, the claim fails if someone wrote since (MinioStore).
                store.claim(state_id)
        except ValueError as error:  # a format this version cannot read, or a damaged record
            return self.result(ExitCode.NOT_RETRYABLE, "failed", error_text(error))
        except Exception as error:
            return self.result(ExitCode.RETRYABLE, "retryable", _store_problem(store, error))
        state = self.state
        if state.answer is None and not _has_credentials(self.environ):
            return self.result(
                ExitCode.NOT_RETRYABLE,
                "failed",
                "ANTHROPIC_API_KEY is not set: export your API key, or run with --offline "
                "for the scripted echo model",
            )
        self._announce(store, state)
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
        return self.result(
            ExitCode.RETRYABLE, "retryable", f"the run stopped without an answer ({state.stopped})"
        )

    def _failed(self, error: Exception) -> RunResult:
        assert self.store is not None
        if error is self.store.failure:
            return self.result(ExitCode.RETRYABLE, "retryable", _store_problem(self.store, error))
        if isinstance(error, anthropic.APIStatusError):
            status = error.status_code
            if 400 <= status < 500 and status not in (408, 409, 429):
                return self.result(
                    ExitCode.NOT_RETRYABLE, "failed", f"the model refused: {error_text(error)}"
                )
        if isinstance(error, anthropic.APIError):
            return self.result(
                ExitCode.RETRYABLE, "retryable", f"model unavailable: {error_text(error)}"
            )
        if isinstance(error, TypeError | ValueError):
            # The State, Agent or store do not fit together (e.g. an async-only store).
            return self.result(ExitCode.NOT_RETRYABLE, "failed", error_text(error))
        return self.result(ExitCode.RETRYABLE, "retryable", error_text(error))

    def _announce(self, store: Store, state: State) -> None:
        saved = _saved_count(state)
        if saved == 0:
            self._note("start", f"{state.id} (a new State) in {store!r}")
            return
        status = "answered" if state.answer is not None else state.stopped or "interrupted"
        line = f"{state.id} at seq {saved} ({status}, {state.turns} turns) from {store!r}"
        if self.aborted:
            line += f"; closed as aborted: {', '.join(self.aborted)}"
        self._note("resume", line)

    def _note(self, event: str, text: str) -> None:
        if self.log is not None:
            self.log.note(event, text, state=self.state_id)

    def result(self, code: int, outcome: str, error: str | None = None) -> RunResult:
        message = termination_message(
            outcome=outcome,
            state_id=self.state_id or "",
            state=self.state,
            error=error,
            aborted=self.aborted,
        )
        return RunResult(int(code), message, self.state)


def _store_problem(store: Store, error: BaseException) -> str:
    kind = "store unavailable" if isinstance(error, OSError) else "store failed"
    return f"{kind}: {store!r}: {error_text(error)}"


def _has_credentials(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("ANTHROPIC_API_KEY") or environ.get("ANTHROPIC_AUTH_TOKEN"))


def _ignore(value: object) -> None:
    return None


# ============================================================================ reporting


def termination_message(
    *,
    outcome: str,
    state_id: str,
    state: State | None,
    error: str | None = None,
    aborted: Sequence[str] = (),
) -> dict[str, Any]:
    """The termination message: one JSON object of at most 4096 bytes.

    ``{"outcome", "stateId", "lastSavedSeq", "turns", "usage", "answer", "error",
    "pendingApprovals": [{"callId", "name", "input"}], "aborted": [call ids]}``. When it
    would be larger, long tool inputs become ``{"excerpt": "..."}``, texts are cut and
    long lists end early (``"truncated": true``).
    """
    saved = _saved_count(state) if state is not None else 0
    answer = state.answer if state is not None else None
    message: dict[str, Any] = {
        "outcome": outcome,
        "stateId": state_id,
        "lastSavedSeq": saved - 1 if saved else None,
        "turns": state.turns if state is not None else 0,
        "usage": dict(state.usage) if state is not None else {},
        "answer": _cut(answer, ANSWER_EXCERPT),
        "error": _cut(error, ANSWER_EXCERPT),
        "pendingApprovals": [
            {"callId": c.id, "name": c.name, "input": c.input}
            for c in (state.awaiting_approval if state is not None else [])
        ],
        "aborted": list(aborted),
    }
    return _fitted(message)


def _fitted(message: dict[str, Any]) -> dict[str, Any]:
    if _size(message) <= TERMINATION_MESSAGE_LIMIT:
        return message
    for pending in message["pendingApprovals"]:
        text = json.dumps(pending["input"], ensure_ascii=False)
        if len(text) > 200:
            pending["input"] = {"excerpt": text[:199] + "…"}
    for key in ("answer", "error"):
        if _size(message) > TERMINATION_MESSAGE_LIMIT:
            message[key] = _cut(message[key], 300)
    keep = max(len(message["pendingApprovals"]), len(message["aborted"]))
    while _size(message) > TERMINATION_MESSAGE_LIMIT and keep > 0:
        keep //= 2
        message["pendingApprovals"] = message["pendingApprovals"][:keep]
        message["aborted"] = message["aborted"][:keep]
        message["truncated"] = True
    return message


def _size(message: Mapping[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False).encode())


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def write_termination_message(
    message: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> str | None:
    """Write the message to ``$TERMINATION_MESSAGE_PATH``, or to ``/dev/termination-log``
    when that file exists and is writable (in a pod). Returns the path written, if any."""
    env = os.environ if environ is None else environ
    path = env.get("TERMINATION_MESSAGE_PATH")
    if not path:
        default = DEFAULT_TERMINATION_LOG
        if not (os.path.isfile(default) and os.access(default, os.W_OK)):
            return None
        path = default
    try:
        Path(path).write_text(json.dumps(message, ensure_ascii=False), encoding="utf-8")
    except OSError:
        return None
    return path


# ============================================================================ progress


_EVENTS = {
    "message": "message",
    "waiting": "message",
    "joined": "message",
    "model_request": "think",
    "model_reply": "think",
    "model_error": "think",
    "tool_result": "tool",
    "permission": "approval",
    "approval_request": "approval",
    "compaction": "compact",
    "stop": "stop",
}


def entry_event(entry: Entry) -> tuple[str, str]:
    """The step an entry records and a one-line text for it, e.g. ``("tool", "shell ok ...")``."""
    event = _EVENTS.get(entry.kind, entry.kind)
    if entry.kind == "tool_result":
        return event, f"{entry.data.get('name', '?')} {entry.outcome} {entry.text}"
    if entry.kind == "model_error":
        return event, f"failed: {entry.text}"
    if entry.kind == "stop":
        reason = str(entry.data.get("reason"))
        detail = entry.data.get("error")
        return event, f"{reason}: {detail}" if detail else reason
    return event, entry.text


class ProgressLog:
    """One line per step of a run to ``stream``: readable text, or JSON objects.

    Text: ``12:00:01 think claude-sonnet-5 calls shell``; with ``show_seq``, each entry's
    seq comes first. JSON (``format="json"``): one object per line with ``time`` (ISO,
    UTC), ``event``, ``state`` and, for history entries, ``seq``, ``kind``, ``text`` and
    (tool results) ``tool``, ``outcome``, ``callId``.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        format: LogFormat = "text",
        show_seq: bool = False,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.format = format
        self.show_seq = show_seq
        self._lock = threading.Lock()

    def entry(self, state_id: str, entry: Entry) -> None:
        """A line for one history entry."""
        event, text = entry_event(entry)
        if self.format == "json":
            record: dict[str, Any] = {
                "time": entry.time.isoformat(),
                "event": event,
                "state": state_id,
                "seq": entry.seq,
                "kind": entry.kind,
                "text": entry.text,
            }
            if entry.kind == "tool_result":
                record.update(
                    tool=entry.data.get("name"),
                    outcome=entry.outcome,
                    callId=entry.data.get("call_id"),
                )
            self._write(json.dumps(record, ensure_ascii=False))
            return
        seq = f"{entry.seq:>4} " if self.show_seq else ""
        self._write(f"{seq}{_clock(entry.time)} {event} {text}")

    def saved(self, state_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Lines for entries a save just wrote, then one for the save."""
        if not entries:
            return
        for raw in entries:
            self.entry(state_id, Entry.from_dict(dict(raw)))
        first, last = int(entries[0]["seq"]), int(entries[-1]["seq"])
        span = f"seq {first}" if first == last else f"seq {first}-{last}"
        self.note("save", span, state=state_id, firstSeq=first, lastSeq=last)

    def note(self, event: str, text: str, *, state: str | None = None, **fields: Any) -> None:
        """A line of the runner's own (start, resume, approval, save, warning, exit)."""
        now = datetime.now(UTC)
        if self.format == "json":
            record = {"time": now.isoformat(), "event": event, "state": state, "text": text}
            self._write(json.dumps({**record, **fields}, ensure_ascii=False))
        else:
            pad = "     " if self.show_seq else ""
            self._write(f"{pad}{_clock(now)} {event} {text}")

    def finished(self, result: RunResult, written_to: str | None = None) -> None:
        """The last line: how the run ended and its exit code."""
        message = result.message
        outcome = message["outcome"]
        if message["error"]:
            text = f"{outcome} (exit {result.exit_code}): {message['error']}"
        elif message["pendingApprovals"]:
            calls = ", ".join(f"{p['callId']} ({p['name']})" for p in message["pendingApprovals"])
            text = f"{outcome} (exit {result.exit_code}): {calls}"
        else:
            text = f"{outcome} (exit {result.exit_code})"
        self.note(
            "exit",
            text,
            state=message["stateId"] or None,
            exitCode=result.exit_code,
            message=message,
            terminationMessagePath=written_to,
        )

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must not stop the run


def _clock(moment: datetime) -> str:
    return moment.astimezone().strftime("%H:%M:%S")


__all__ = [
    "Approval",
    "ExitCode",
    "ProgressLog",
    "RunPlan",
    "RunResult",
    "SpecError",
    "StoreUnavailable",
    "build_agent",
    "entry_event",
    "install_sigterm_handler",
    "open_run_store",
    "open_state",
    "parse_spec",
    "read_manifest",
    "record_approvals",
    "run_agent_run",
    "spec_from_environment",
    "termination_message",
    "write_termination_message",
]
