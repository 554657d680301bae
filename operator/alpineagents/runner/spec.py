"""An AgentRun's spec, checked: :func:`parse_spec` turns it into a :class:`RunPlan`.

The spec comes from a manifest file (:func:`read_manifest`, for ``alpineagents run
FILE.yaml``) or, in a pod, from ``ALPINEAGENTS_SPEC`` (:func:`spec_from_environment`).
Every problem is a :class:`SpecError` naming the field and what to do.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import builtin_tools
from ..mcp_spec import MCPServerSpec, MCPSpecError, parse_mcp_servers
from ..messages import Message
from ..pod_contract import API_VERSION, ENV_SPEC, ENV_SPEC_FILE, KIND
from ..state import error_text
from .long_run_spec import FIELDS as _LONG_RUN_FIELDS
from .long_run_spec import LongRunPlan, parse_long_run

if TYPE_CHECKING:
    import yaml

__all__ = [
    "Approval",
    "RunPlan",
    "SpecError",
    "parse_spec",
    "read_manifest",
    "spec_from_environment",
]


class SpecError(ValueError):
    """A spec, manifest or setting the runner cannot use; names the field and what to do."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


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
    priority: int = 0
    tools: tuple[str, ...] = ()
    agent: str | None = None
    require_approval: tuple[str, ...] = ()
    approvals: tuple[Approval, ...] = ()
    mcp_servers: tuple[MCPServerSpec, ...] = ()
    long_run: LongRunPlan = field(default_factory=LongRunPlan)
    spec: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


_SPEC_FIELDS = (
    "model",
    "prompt",
    "messages",
    "system",
    "maxTurns",
    "maxTokens",
    "priority",
    "tools",
    "agent",
    "requireApproval",
    "approvals",
    "mcpServers",
    "provider",
    *_LONG_RUN_FIELDS,
)
# The rest of the CRD's spec fields (crds/agentrun.yaml; a test keeps the two lists equal).
_OPERATOR_FIELDS = (
    "image",
    "resources",
    "env",
    "envFrom",
    "serviceAccountName",
    "nodeSelector",
    "tolerations",
    "affinity",
    "store",
    "restartPolicy",
    "suspend",
    "onDelete",
    "forkFrom",
    "notify",
    "ttlSecondsAfterFinished",
)
_FIELDS = _SPEC_FIELDS + _OPERATOR_FIELDS
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_spec(spec: object, *, where: str = "spec", strict: bool = False) -> RunPlan:
    """Check an AgentRun ``.spec`` (camelCase fields) and turn it into a :class:`RunPlan`.

    Raises :class:`SpecError` naming the first field that is wrong. Fields only the
    operator reads (``env``, ``resources``, ...) are left to it. A field no AgentRun has
    (``requireApprovals``) is an error naming the closest known field when ``strict``
    (a manifest on a laptop, where no CRD schema refused it first), else a warning in
    ``RunPlan.warnings``. With ``agent`` set, a field unlike any known one is the factory's
    own (it gets the whole spec) unless it is a near-miss of a known one.
    """
    if not isinstance(spec, Mapping):
        raise SpecError(where, "must be a mapping of fields (model, prompt, tools, ...)")
    warnings = []
    for key in spec:
        if key not in _SPEC_FIELDS and key not in _OPERATOR_FIELDS:
            # With a factory agent, a field unlike any known one is the factory's own (it
            # gets the whole spec); only a near-miss of a known field is a mistake then.
            factory = spec.get("agent") is not None
            close = _closest_field(str(key), cutoff=0.85 if factory else 0.6)
            if factory and close is None:
                continue
            hint = f"did you mean {close}?" if close else f"its fields are: {', '.join(_FIELDS)}"
            problem = f"not a field of an AgentRun; {hint}"
            if strict:
                raise SpecError(f"{where}.{key}", problem)
            warnings.append(f"{where}.{key}: {problem}")
    model = spec.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SpecError(f"{where}.model", "required: the Claude model to run, e.g. claude-sonnet-5")
    messages = _parse_messages(spec, where)
    system = _optional(spec, "system", where)
    max_turns = _positive_int(spec, "maxTurns", where)
    max_tokens = _positive_int(spec, "maxTokens", where)
    priority = spec.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise SpecError(
            f"{where}.priority",
            f"must be a whole number (higher goes first when runs wait for the key), not {priority!r}",
        )
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
    try:
        mcp_servers = parse_mcp_servers(spec, where)
    except MCPSpecError as error:
        raise SpecError(error.where, error.problem) from None
    return RunPlan(
        model=model,
        messages=messages,
        system=system,
        max_turns=max_turns,
        max_tokens=max_tokens,
        priority=priority,
        tools=tools,
        agent=agent,
        require_approval=tuple(_names(spec, "requireApproval", where)),
        approvals=_parse_approvals(spec, where),
        mcp_servers=mcp_servers,
        long_run=parse_long_run(spec, where, SpecError),
        spec=dict(spec),
        warnings=tuple(warnings),
    )


def _closest_field(key: str, cutoff: float) -> str | None:
    """The known spec field ``key`` most likely misspells, if any is close."""

    def plain(name: str) -> str:  # require_approval, RequireApproval -> requireapproval
        return name.replace("_", "").replace("-", "").lower()

    same = [name for name in _FIELDS if plain(name) == plain(key)]
    close = same or difflib.get_close_matches(key, _FIELDS, n=1, cutoff=cutoff)
    if not close:
        found = difflib.get_close_matches(
            plain(key), [plain(n) for n in _FIELDS], n=1, cutoff=cutoff
        )
        close = [name for name in _FIELDS if found and plain(name) == found[0]]
    return close[0] if close else None


def _parse_messages(spec: Mapping[str, Any], where: str) -> tuple[Message, ...]:
    prompt, raw = spec.get("prompt"), spec.get("messages")
    if prompt is not None and raw is not None:
        raise SpecError(where, "give either prompt or messages, not both")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecError(f"{where}.prompt", "must be a non-empty string")
        return (Message.user(prompt),)
    if raw is None:
        if spec.get("forkFrom") is not None:
            return ()  # a fork goes on from the entries the operator copied
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
    import yaml  # only for a manifest file: a pod's spec is JSON, and its start is a resume's wait

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
    operator mounts it from a Secret), else in ``ALPINEAGENTS_SPEC`` itself."""
    path = environ.get(ENV_SPEC_FILE)
    if path:
        where = f"{ENV_SPEC_FILE} ({path})"
        try:
            raw = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SpecError(where, f"cannot be read: {error_text(error)}") from None
    else:
        where = ENV_SPEC
        raw = environ.get(ENV_SPEC, "")
        if not raw:
            raise SpecError(
                ENV_SPEC,
                f"not set: give an AgentRun manifest (alpineagents run FILE.yaml), set "
                f"{ENV_SPEC_FILE} to a file holding the spec as JSON, or set {ENV_SPEC} to "
                f"the spec as JSON",
            )
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as error:
        raise SpecError(where, f"not valid JSON: {error}") from None
    if not isinstance(spec, dict):
        raise SpecError(where, "must be a JSON object (the AgentRun's .spec)")
    return spec


def _yaml_problem(error: yaml.YAMLError) -> str:
    import yaml

    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())
