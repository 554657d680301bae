"""``spec.mcpServers`` of an AgentRun: checked, turned into MCPServers, and its secrets.

.. code-block:: yaml

    mcpServers:
      - name: calc                          # a DNS label, unique in the run
        url: http://calc-mcp.tools:8080/mcp # Streamable HTTP ...
        headers:                            # ... its headers, from Secrets only
          - name: Authorization
            secretKeyRef: {name: calc-mcp, key: authorization}
        tools: [add, divide]                # allow-list (default: every tool it lists)
        timeoutSeconds: 60
      - name: files                         # or a stdio server started by the run
        command: [python, -m, files_mcp]
        args: [--root, /work]
        env:
          - {name: LOG_LEVEL, value: info}
          - name: FILES_TOKEN
            secretKeyRef: {name: files-mcp, key: token}

Secret values never appear in the spec: each ``secretKeyRef`` is read from a variable of
the runner's environment (``ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION``; the naming is
the pod contract's :func:`~alpineagents.pod_contract.mcp_secret_variable`), which the
operator sets in the pod from the Secret and a person running ``alpineagents run``
elsewhere exports by hand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .mcp import DEFAULT_TIMEOUT, MCPServer
from .pod_contract import SecretRef, mcp_secret_variable

FIELD = "mcpServers"
MAX_TIMEOUT = 3600.0
_SERVER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MCPSpecError(ValueError):
    """A ``spec.mcpServers`` item the runner cannot use: ``where`` names the field."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class MCPServerSpec:
    """One checked ``spec.mcpServers`` item; its secrets are references, not values."""

    name: str
    url: str | None = None
    headers: tuple[tuple[str, SecretRef], ...] = ()
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str | SecretRef], ...] = ()
    tools: tuple[str, ...] | None = None
    timeout: float = DEFAULT_TIMEOUT


def parse_mcp_servers(spec: Mapping[str, Any], where: str = "spec") -> tuple[MCPServerSpec, ...]:
    """Check ``spec.mcpServers``; raises :class:`MCPSpecError` naming the first bad field."""
    raw = spec.get(FIELD)
    at = f"{where}.{FIELD}"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MCPSpecError(at, "must be a list of servers, each {name, url} or {name, command}")
    servers: list[MCPServerSpec] = []
    for index, item in enumerate(raw):
        server = _server(item, f"{at}[{index}]")
        if any(s.name == server.name for s in servers):
            raise MCPSpecError(f"{at}[{index}].name", f"{server.name!r} is taken; names are unique")
        servers.append(server)
    return tuple(servers)


def mcp_servers(
    specs: Sequence[MCPServerSpec], environ: Mapping[str, str], where: str = "spec"
) -> list[MCPServer]:
    """The MCPServers of checked specs, their secrets read from ``environ``."""
    servers = []
    for index, spec in enumerate(specs):
        at = f"{where}.{FIELD}[{index}]"
        headers = {
            name: _value(ref, environ, f"{at}.headers[{i}]")
            for i, (name, ref) in enumerate(spec.headers)
        }
        env = {
            name: value if isinstance(value, str) else _value(value, environ, f"{at}.env[{i}]")
            for i, (name, value) in enumerate(spec.env)
        }
        servers.append(
            MCPServer(
                spec.name,
                url=spec.url,
                headers=headers,
                command=spec.command[0] if spec.command else None,
                args=[*spec.command[1:], *spec.args],
                env=env,
                allow=spec.tools,
                timeout=spec.timeout,
            )
        )
    return servers


_KINDS: dict[str, Literal["header", "env"]] = {"headers": "header", "env": "env"}
_FIELDS = ("name", "url", "headers", "command", "args", "env", "tools", "timeoutSeconds")


def _server(item: object, at: str) -> MCPServerSpec:
    if not isinstance(item, Mapping):
        raise MCPSpecError(at, "must be a mapping with name and url (or command)")
    unknown = [str(k) for k in item if k not in _FIELDS]
    if unknown:
        raise MCPSpecError(
            f"{at}.{unknown[0]}", f"not a field; the fields are {', '.join(_FIELDS)}"
        )
    name = item.get("name")
    if not isinstance(name, str) or not _SERVER_NAME.match(name):
        raise MCPSpecError(
            f"{at}.name", "required: lowercase letters, digits and '-' (a DNS label), e.g. github"
        )
    url, command = item.get("url"), item.get("command")
    if (url is None) == (command is None):
        raise MCPSpecError(at, "give either url (Streamable HTTP) or command (a stdio server)")
    timeout = item.get("timeoutSeconds", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise MCPSpecError(f"{at}.timeoutSeconds", "must be a number of seconds")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise MCPSpecError(f"{at}.timeoutSeconds", f"must be above 0 and at most {MAX_TIMEOUT:g}")
    tools = None if item.get("tools") is None else tuple(_strings(item, "tools", at, empty=False))
    if url is not None:
        for field in ("command", "args", "env"):
            if item.get(field) is not None:
                raise MCPSpecError(f"{at}.{field}", "is for stdio servers (command), not url")
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            raise MCPSpecError(f"{at}.url", "must be an http:// or https:// URL")
        headers = tuple(
            (name, ref)
            for name, ref in _named_values(item, "headers", at, name, _HEADER_NAME, plain=False)
            if isinstance(ref, SecretRef)
        )
        return MCPServerSpec(name, url=url, headers=headers, tools=tools, timeout=float(timeout))
    if item.get("headers") is not None:
        raise MCPSpecError(f"{at}.headers", "are for url servers, not command")
    return MCPServerSpec(
        name,
        command=tuple(_strings(item, "command", at, empty=False)),
        args=tuple(_strings(item, "args", at)),
        env=tuple(_named_values(item, "env", at, name, _ENV_NAME, plain=True)),
        tools=tools,
        timeout=float(timeout),
    )


def _strings(item: Mapping[str, Any], field: str, at: str, *, empty: bool = True) -> list[str]:
    value = item.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise MCPSpecError(f"{at}.{field}", "must be a list of non-empty strings")
    if not value and not empty:
        raise MCPSpecError(f"{at}.{field}", "must not be empty")
    return list(value)


def _named_values(
    item: Mapping[str, Any],
    field: str,
    at: str,
    server: str,
    pattern: re.Pattern[str],
    *,
    plain: bool,
) -> list[tuple[str, str | SecretRef]]:
    raw = item.get(field, [])
    form = (
        "{name, value} or {name, secretKeyRef: {name, key}}"
        if plain
        else ("{name, secretKeyRef: {name, key}} (header values come from Secrets only)")
    )
    if not isinstance(raw, list):
        raise MCPSpecError(f"{at}.{field}", f"must be a list of {form}")
    found: list[tuple[str, str | SecretRef]] = []
    variables: set[str] = set()
    for index, entry in enumerate(raw):
        here = f"{at}.{field}[{index}]"
        if not isinstance(entry, Mapping):
            raise MCPSpecError(here, f"must be {form}")
        name, value, ref = entry.get("name"), entry.get("value"), entry.get("secretKeyRef")
        if not isinstance(name, str) or not pattern.match(name):
            raise MCPSpecError(f"{here}.name", f"required, and a valid {_KINDS[field]} name")
        if ref is not None and value is None:
            if not isinstance(ref, Mapping) or not all(
                isinstance(ref.get(k), str) and ref.get(k) for k in ("name", "key")
            ):
                raise MCPSpecError(f"{here}.secretKeyRef", "needs the Secret's name and key")
            variable = mcp_secret_variable(server, _KINDS[field], name)
            if variable in variables:
                raise MCPSpecError(f"{here}.name", f"{name!r} is given twice")
            variables.add(variable)
            found.append((name, SecretRef(variable, str(ref["name"]), str(ref["key"]))))
        elif plain and isinstance(value, str) and ref is None:
            found.append((name, value))
        else:
            raise MCPSpecError(here, f"must be {form}")
    return found


def _value(ref: SecretRef, environ: Mapping[str, str], where: str) -> str:
    value = environ.get(ref.variable)
    if value is None:
        raise MCPSpecError(
            where,
            f"{ref.variable} is not set: in a pod the operator sets it from Secret "
            f"{ref.secret!r} key {ref.key!r}; to run elsewhere, export it with that value",
        )
    return value
