"""The contract between the runner in an agent pod and the operator that starts the pod.

Both sides import it, so each fact is written once:

- the AgentRun API the two speak about (:data:`GROUP`, :data:`VERSION`, :data:`KIND`,
  :data:`PLURAL`) and the id of the State an AgentRun runs (:func:`state_id_for`);
- the environment the operator gives the pod (``ENV_*``);
- how the runner's process ends (:class:`ExitCode`), which tells the operator what to do;
- the warm pool's hand-off (:class:`Assignment`, written under :func:`standby_prefix`):
  what a standby pod (:data:`ENV_STANDBY_ID` set) waits for in the store;
- the termination message: one JSON object of at most :data:`TERMINATION_MESSAGE_LIMIT`
  bytes written to :data:`TERMINATION_MESSAGE_PATH` (:func:`write_termination_message`)
  and read back from the pod's status (:meth:`TerminationMessage.parse`).

It is plain data and stdlib only: the operator imports it without the runtime.
"""

from __future__ import annotations

import enum
import importlib.metadata
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

GROUP = "alpineagents.dev"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AgentRun"
PLURAL = "agentruns"


def state_id_for(namespace: str, name: str, uid: str) -> str:
    """The saved State's id for one AgentRun (the pod gets it as :data:`ENV_STATE_ID`).

    The uid part keeps a new AgentRun from resuming the State of an earlier, deleted one
    that had the same name.
    """
    return f"{namespace}.{name}.{uid[:8]}"


ENV_SPEC_FILE = "ALPINEAGENTS_SPEC_FILE"
"""Path of a file holding the AgentRun's ``.spec`` as JSON (the operator mounts it
read-only from a Secret of the pod's own)."""
ENV_SPEC = "ALPINEAGENTS_SPEC"
"""The AgentRun's ``.spec`` as JSON itself, when :data:`ENV_SPEC_FILE` is not set (older
operators set it; exec refuses one variable over 128 KiB, so a long prompt needs the file)."""
ENV_STORE = "ALPINEAGENTS_STORE"
"""The store URL (see :func:`alpineagents.open_store`)."""
ENV_STATE_ID = "ALPINEAGENTS_STATE_ID"
"""The id of the State the pod runs or resumes."""
ENV_ATTEMPT = "ALPINEAGENTS_ATTEMPT"
"""Which attempt of the AgentRun this pod is (1, 2, ...)."""
ENV_TERMINATION_MESSAGE_PATH = "TERMINATION_MESSAGE_PATH"
"""Where the runner writes its termination message (the container's
``terminationMessagePath``)."""
ENV_ENCRYPTION_KEYS = "ALPINEAGENTS_ENCRYPTION_KEYS"
"""The keyring of an encrypted store (``ID:BASE64`` items, the last one writes; also as
``..._FILE``), see :mod:`alpineagents.store.encrypted`."""
ENV_SECRET_NAMES = "ALPINEAGENTS_SECRET_ENV"
"""Comma-separated names of the pod's variables that come from Secrets: the runner keeps
their values out of its logs, the saved history and the termination message."""
CREDENTIAL_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MINIO_ACCESS_KEY",
    "MINIO_SECRET_KEY",
    ENV_ENCRYPTION_KEYS,
)
"""The runner's own credentials: masked in what it writes, never passed to the model's
commands (also as their ``*_FILE`` forms)."""
ENV_PRICES = "ALPINEAGENTS_PRICES"
"""A price table as JSON, ``{"model id prefix": {"input": USD, "output": USD}}`` per
million tokens (the chart's ``runs.prices``): it overrides the runtime's own."""
ENV_VERSION = "ALPINEAGENTS_VERSION"
"""The image's version (the Dockerfile's ``VERSION`` build argument, also its
``org.opencontainers.image.version`` label): the runner reports it as ``runnerVersion``
(:func:`runner_version`), so a run's status says which image ended it across an upgrade."""
ENV_PACER = "ALPINEAGENTS_PACER"
"""The shared limiter's URL (``http://host:port``, the chart's ``pacing``): the runner asks
it for a turn before each model request (:mod:`alpineagents.pacing`). Unset: the run paces
itself by the model's rate-limit headers."""
ENV_PACER_SHARE = "ALPINEAGENTS_PACER_SHARE"
"""Whose share of the key a run's requests count against at the shared limiter (the
operator sets the run's namespace; weights per share are the limiter's)."""
ENV_PREFIX = "ALPINEAGENTS_"
"""The operator's variables: an AgentRun's ``spec.env`` cannot override these."""
ENV_MCP_PREFIX = "ALPINEAGENTS_MCP_"
"""Variables carrying ``spec.mcpServers`` values kept in Secrets (:func:`mcp_secret_refs`);
the runner's own, never passed to the model's shell commands nor to stdio servers."""

ENV_STANDBY_ID = "ALPINEAGENTS_STANDBY_ID"
"""Set in a standby pod of the warm pool (its own pod uid): the runner waits for an
:class:`Assignment` under :func:`standby_prefix` before it runs anything."""
ENV_STANDBY_DOORBELL = "ALPINEAGENTS_STANDBY_DOORBELL"
"""Set in a standby pod: a file the kubelet rewrites when the pod's labels change (a
``downwardAPI`` volume), as they do when the operator hands the pod a run, after its
:class:`Assignment` is in the store. The runner asks the store as soon as the file changes,
and otherwise seldom: watching a local file costs nothing, a request to the store does."""
STANDBY_LABEL = f"{GROUP}/standby"
"""Label of a warm pool's standby pods (``"true"``); the operator removes it when it hands
the pod a run."""

TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""The termination message's file in a pod (Kubernetes' default)."""
TERMINATION_MESSAGE_LIMIT = 4096
"""Bytes of a termination message the kubelet keeps."""
_TEXT_LIMIT = 1000  # characters of the answer or error in a message

RunOutcome = Literal[
    "answered",
    "failed",
    "retryable",
    "waiting_for_approval",
    "max_turns",
    "budget_exceeded",
    "stopped",
]
"""``outcome`` of a termination message."""


class ExitCode(enum.IntEnum):
    """How the runner's process ends; the operator decides what to do next from it."""

    ANSWERED = 0
    """The model answered; the State is saved and final."""
    NOT_RETRYABLE = 65
    """A retry cannot help: bad spec, unknown tool, the ``agent`` factory does not
    import, a model request the API refuses (4xx), a State saved in an unreadable format."""
    RETRYABLE = 75
    """The model, the store or an MCP server is unavailable, or another error a retry may
    fix."""
    WAITING_FOR_APPROVAL = 76
    """Saved and stopped: tool calls wait for a person's answer (``spec.approvals``)."""
    MAX_TURNS = 77
    """Saved and stopped at ``spec.maxTurns``; final."""
    BUDGET_EXCEEDED = 78
    """Saved and stopped at a limit of ``spec.budget``; raising the budget resumes it."""
    INTERRUPTED = 130
    """Ctrl+C: saved, resumable."""
    KILLED = 137
    """Not the runner's own: SIGKILL (the OOM killer, or the end of the grace period).
    Whatever was not saved before it is lost; the next attempt resumes."""
    SIGTERM = 143
    """SIGTERM (``SystemExit(143)``): saved, resumable."""


@dataclass(frozen=True)
class PendingApproval:
    """A tool call that waits for a person's answer."""

    call_id: str
    name: str = ""
    input: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """``{"callId", "name", "input"}``, as in the message and the AgentRun's status."""
        return {"callId": self.call_id, "name": self.name, "input": dict(self.input)}

    @classmethod
    def parse_all(cls, raw: Any) -> tuple[PendingApproval, ...]:
        """The calls of a ``pendingApprovals`` list; items that are not one are skipped."""
        if not isinstance(raw, list):
            return ()
        calls = []
        for item in raw:
            if isinstance(item, Mapping) and item.get("callId"):
                call_input = item.get("input")
                calls.append(
                    cls(
                        call_id=str(item["callId"]),
                        name=str(item.get("name") or ""),
                        input=dict(call_input) if isinstance(call_input, Mapping) else {},
                    )
                )
        return tuple(calls)


@dataclass(frozen=True)
class TerminationMessage:
    """The runner's termination message, as the operator reads it.

    On the wire: ``{"outcome", "stateId", "lastSavedSeq", "turns", "usage", "costUSD",
    "answer", "error", "pendingApprovals": [{"callId", "name", "input"}], "aborted": [call
    ids]}``
    (and ``"truncated": true`` when :func:`fit_termination_message` cut lists short).
    """

    outcome: str
    state_id: str | None = None
    last_saved_seq: int | None = None
    turns: int | None = None
    usage: Mapping[str, int] | None = None
    answer: str | None = None
    error: str | None = None
    pending_approvals: tuple[PendingApproval, ...] = ()
    aborted: tuple[str, ...] = ()
    cost_usd: float | None = None
    runner_version: str | None = None
    """The version of the runner that wrote it (:func:`runner_version`); None from runners
    older than the field."""

    @classmethod
    def parse(cls, text: str) -> TerminationMessage | None:
        """The message in ``text``, or None if it holds something else (such as the log
        tail kept by ``FallbackToLogsOnError`` after a crash)."""
        try:
            raw = json.loads(text)
        except (ValueError, TypeError):
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("outcome"), str):
            return None
        seq = raw.get("lastSavedSeq")
        turns = raw.get("turns")
        usage = raw.get("usage")
        aborted = raw.get("aborted")
        cost = raw.get("costUSD")
        version = raw.get("runnerVersion")
        return cls(
            outcome=raw["outcome"],
            state_id=raw.get("stateId") if isinstance(raw.get("stateId"), str) else None,
            last_saved_seq=seq if isinstance(seq, int) else None,
            turns=turns if isinstance(turns, int) else None,
            usage=(
                {k: int(v) for k, v in usage.items() if isinstance(v, int)}
                if isinstance(usage, dict)
                else None
            ),
            answer=raw.get("answer") if isinstance(raw.get("answer"), str) else None,
            error=raw.get("error") if isinstance(raw.get("error"), str) else None,
            pending_approvals=PendingApproval.parse_all(raw.get("pendingApprovals")),
            aborted=tuple(str(a) for a in aborted) if isinstance(aborted, list) else (),
            cost_usd=float(cost) if isinstance(cost, int | float) else None,
            runner_version=version if isinstance(version, str) and version else None,
        )


def termination_message_json(
    *,
    outcome: RunOutcome,
    state_id: str,
    last_saved_seq: int | None,
    turns: int,
    usage: Mapping[str, int],
    answer: str | None,
    error: str | None,
    pending_approvals: tuple[PendingApproval, ...] = (),
    aborted: tuple[str, ...] = (),
    cost_usd: float = 0.0,
    version: str | None = None,
) -> dict[str, Any]:
    """The message as the runner writes it, fitted to the limit (see :func:`fit_termination_message`).

    ``version`` (the runner's) defaults to this process's own (:func:`runner_version`)."""
    return fit_termination_message(
        {
            "outcome": outcome,
            "stateId": state_id,
            "lastSavedSeq": last_saved_seq,
            "turns": turns,
            "usage": dict(usage),
            "costUSD": round(cost_usd, 6),
            "answer": _cut(answer, _TEXT_LIMIT),
            "error": _cut(error, _TEXT_LIMIT),
            "pendingApprovals": [call.to_json() for call in pending_approvals],
            "aborted": list(aborted),
            "runnerVersion": _cut(version or runner_version(), 100),
        }
    )


def fit_termination_message(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` cut to :data:`TERMINATION_MESSAGE_LIMIT` bytes of JSON.

    Long tool inputs become ``{"excerpt": "..."}``, texts are cut and long lists end
    early (``"truncated": true``).
    """
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


def write_termination_message(
    message: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> str | None:
    """Write the message to ``$TERMINATION_MESSAGE_PATH``, or to ``/dev/termination-log``
    when that file exists and is writable (in a pod). Returns the path written, if any."""
    env = os.environ if environ is None else environ
    path = env.get(ENV_TERMINATION_MESSAGE_PATH)
    if not path:
        default = TERMINATION_MESSAGE_PATH
        if not (os.path.isfile(default) and os.access(default, os.W_OK)):
            return None
        path = default
    try:
        Path(path).write_text(json.dumps(message, ensure_ascii=False), encoding="utf-8")
    except OSError:
        return None
    return path


def runner_version(environ: Mapping[str, str] | None = None) -> str:
    """This runner's version: :data:`ENV_VERSION` from the image, else the installed
    package's version ("unknown" when neither is there)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_VERSION):
        return env[ENV_VERSION]
    try:
        return importlib.metadata.version("alpineagents")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


ASSIGNMENT_NAME = "assignment.json"
"""The object under :func:`standby_prefix` that hands a standby its run."""


def standby_prefix(standby_id: str) -> str:
    """The keys a standby waits on, under the store's prefix: ``.standby/<pod uid>/``.

    The leading dot keeps it apart from every State's folder (a State id's dots are
    encoded, so no State folder starts with one) and out of ``alpineagents list``.
    """
    if not re.fullmatch(r"[0-9a-z-]{1,64}", standby_id):
        raise ValueError(f"standby id {standby_id!r} is not a pod uid")
    return f".standby/{standby_id}/"


@dataclass(frozen=True)
class Assignment:
    """A run handed to a standby pod: what a run pod gets from its manifest and mounts.

    On the wire: ``{"namespace", "run", "spec", "stateId", "attempt", "store",
    "credentials": {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} |
    null}``. ``credentials`` are the run's own short-lived store credentials (None when
    runs share the store's key, which the standby holds already).
    """

    namespace: str
    run: str
    spec: Mapping[str, Any]
    state_id: str
    attempt: int
    store: str
    credentials: Mapping[str, str] | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The object's content (see the class docstring)."""
        return {
            "namespace": self.namespace,
            "run": self.run,
            "spec": dict(self.spec),
            "stateId": self.state_id,
            "attempt": self.attempt,
            "store": self.store,
            "credentials": dict(self.credentials) if self.credentials is not None else None,
        }

    @classmethod
    def parse(cls, text: str | bytes) -> Assignment:
        """An assignment from its JSON; raises ``ValueError`` for anything else."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("an assignment is a JSON object")
        spec, credentials = raw.get("spec"), raw.get("credentials")
        attempt = raw.get("attempt")
        if not isinstance(spec, dict) or not isinstance(attempt, int) or attempt < 1:
            raise ValueError("an assignment needs spec (an object) and attempt (>= 1)")
        for key in ("namespace", "run", "stateId", "store"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise ValueError(f"an assignment needs {key} (a string)")
        if credentials is not None and not (
            isinstance(credentials, dict) and all(isinstance(v, str) for v in credentials.values())
        ):
            raise ValueError("an assignment's credentials are an object of strings")
        return cls(
            namespace=raw["namespace"],
            run=raw["run"],
            spec=spec,
            state_id=raw["stateId"],
            attempt=attempt,
            store=raw["store"],
            credentials=credentials,
        )


_MCP_SECRET_FIELDS: tuple[tuple[str, Literal["header", "env"]], ...] = (
    ("headers", "header"),
    ("env", "env"),
)


@dataclass(frozen=True)
class SecretRef:
    """A value kept in a Secret, and the pod variable that carries it to the runner."""

    variable: str
    secret: str
    key: str


def mcp_secret_variable(server: str, kind: Literal["header", "env"], name: str) -> str:
    """The variable holding an MCP server's header or env value from a Secret, e.g.
    ``ALPINEAGENTS_MCP_GITHUB_HEADER_AUTHORIZATION`` (the operator sets it in the pod; a
    person running ``alpineagents run`` elsewhere exports it)."""
    parts = (re.sub(r"[^A-Za-z0-9]", "_", part).upper() for part in (server, kind, name))
    return ENV_MCP_PREFIX + "_".join(parts)


def mcp_secret_refs(spec: Mapping[str, Any]) -> list[SecretRef]:
    """Every ``secretKeyRef`` of ``spec.mcpServers`` (headers and stdio env), as pod variables.

    Lenient: items the runner would refuse are skipped (the runner says what is wrong).
    """
    refs: list[SecretRef] = []
    servers = spec.get("mcpServers")
    for server in servers if isinstance(servers, list) else []:
        if not isinstance(server, Mapping) or not isinstance(server.get("name"), str):
            continue
        for field_name, kind in _MCP_SECRET_FIELDS:
            items = server.get(field_name)
            for item in items if isinstance(items, list) else []:
                ref = item.get("secretKeyRef") if isinstance(item, Mapping) else None
                if isinstance(ref, Mapping) and isinstance(item.get("name"), str):
                    variable = mcp_secret_variable(server["name"], kind, item["name"])
                    refs.append(SecretRef(variable, str(ref.get("name")), str(ref.get("key"))))
    return refs


ENV_PROVIDER_PREFIX = "ALPINEAGENTS_PROVIDER_"
"""Variables carrying ``spec.provider`` values kept in Secrets (:func:`provider_secret_refs`):
the runner's own, masked in what it writes and never passed to the model's commands."""
ENV_PROVIDER_CREDENTIALS = ENV_PROVIDER_PREFIX + "CREDENTIALS"
"""``spec.provider.credentials``: a Vertex AI service account key (JSON) or a Foundry key."""


def provider_header_variable(name: str) -> str:
    """The variable holding a ``spec.provider.headers`` value from a Secret, e.g.
    ``ALPINEAGENTS_PROVIDER_HEADER_X_PORTKEY_API_KEY``."""
    return ENV_PROVIDER_PREFIX + "HEADER_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def provider_secret_refs(spec: Mapping[str, Any]) -> list[SecretRef]:
    """Every ``secretKeyRef`` of ``spec.provider`` (its headers and credentials), as pod
    variables. Lenient like :func:`mcp_secret_refs`: the runner says what is wrong."""
    provider = spec.get("provider")
    if not isinstance(provider, Mapping):
        return []
    refs: list[SecretRef] = []
    headers = provider.get("headers")
    for item in headers if isinstance(headers, list) else []:
        ref = item.get("secretKeyRef") if isinstance(item, Mapping) else None
        if isinstance(ref, Mapping) and isinstance(item.get("name"), str):
            variable = provider_header_variable(item["name"])
            refs.append(SecretRef(variable, str(ref.get("name")), str(ref.get("key"))))
    credentials = provider.get("credentials")
    ref = credentials.get("secretKeyRef") if isinstance(credentials, Mapping) else None
    if isinstance(ref, Mapping):
        refs.append(SecretRef(ENV_PROVIDER_CREDENTIALS, str(ref.get("name")), str(ref.get("key"))))
    return refs


def provider_pod_labels(spec: Mapping[str, Any]) -> dict[str, str]:
    """Labels a run's pod needs for its provider's identity: AKS's workload identity
    webhook mounts the Entra token only into pods labelled for it (a Foundry run without a
    key)."""
    provider = spec.get("provider")
    if (
        isinstance(provider, Mapping)
        and provider.get("type") == "foundry"
        and provider.get("credentials") is None
    ):
        return {"azure.workload.identity/use": "true"}
    return {}


def _size(message: Mapping[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False).encode())


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
