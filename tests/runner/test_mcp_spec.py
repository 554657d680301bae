"""``spec.mcpServers``: checked with errors that name the field, secrets by reference only."""

from __future__ import annotations

from typing import Any

import pytest

from alpineagents.mcp_spec import MCPSpecError, mcp_servers, parse_mcp_servers
from alpineagents.pod_contract import SecretRef, mcp_secret_refs

SPEC: dict[str, Any] = {
    "mcpServers": [
        {
            "name": "calc",
            "url": "http://calc-mcp.tools:8080/mcp",
            "headers": [
                {"name": "Authorization", "secretKeyRef": {"name": "calc-mcp", "key": "token"}}
            ],
            "tools": ["add", "divide"],
            "timeoutSeconds": 20,
        },
        {
            "name": "local-files",
            "command": ["python", "-m", "files_mcp"],
            "args": ["--root", "/work"],
            "env": [
                {"name": "LOG_LEVEL", "value": "info"},
                {"name": "FILES_TOKEN", "secretKeyRef": {"name": "files", "key": "token"}},
            ],
        },
    ]
}
SECRETS = {
    "ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION": "Bearer abc",
    "ALPINEAGENTS_MCP_LOCAL_FILES_ENV_FILES_TOKEN": "xyz",
}


def test_a_spec_becomes_servers_with_their_secrets_from_the_environment() -> None:
    calc, files = mcp_servers(parse_mcp_servers(SPEC), SECRETS)
    assert (calc.name, calc.url, dict(calc.headers)) == (
        "calc",
        "http://calc-mcp.tools:8080/mcp",
        {"Authorization": "Bearer abc"},
    )
    assert (calc.allow, calc.timeout) == (("add", "divide"), 20.0)
    assert (files.command, list(files.args)) == ("python", ["-m", "files_mcp", "--root", "/work"])
    assert dict(files.env) == {"LOG_LEVEL": "info", "FILES_TOKEN": "xyz"}
    assert files.allow is None and files.timeout == 60.0


def test_the_pod_gets_each_secret_reference_as_a_variable() -> None:
    assert mcp_secret_refs(SPEC) == [
        SecretRef("ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION", "calc-mcp", "token"),
        SecretRef("ALPINEAGENTS_MCP_LOCAL_FILES_ENV_FILES_TOKEN", "files", "token"),
    ]
    assert mcp_secret_refs({"mcpServers": [{"name": 3}, "x", {"name": "a", "headers": 5}]}) == []


def test_a_missing_secret_variable_names_it_and_its_secret() -> None:
    with pytest.raises(MCPSpecError) as raised:
        mcp_servers(parse_mcp_servers(SPEC), {})
    assert raised.value.where == "spec.mcpServers[0].headers[0]"
    assert "ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION is not set" in raised.value.problem
    assert "Secret 'calc-mcp' key 'token'" in raised.value.problem


@pytest.mark.parametrize(
    ("server", "where", "problem"),
    [
        ({"url": "http://x/mcp"}, "[0].name", "DNS label"),
        ({"name": "Calc", "url": "http://x/mcp"}, "[0].name", "DNS label"),
        ({"name": "calc"}, "[0]", "give either url"),
        ({"name": "calc", "url": "x", "command": ["y"]}, "[0]", "give either url"),
        ({"name": "calc", "url": "ftp://x"}, "[0].url", "http:// or https://"),
        (
            {"name": "calc", "url": "http://x", "headers": [{"name": "A", "value": "s3cret"}]},
            "[0].headers[0]",
            "from Secrets only",
        ),
        (
            {"name": "calc", "url": "http://x", "headers": [{"name": "A", "secretKeyRef": {}}]},
            "[0].headers[0].secretKeyRef",
            "name and key",
        ),
        ({"name": "calc", "url": "http://x", "command": None, "args": ["a"]}, "[0].args", "stdio"),
        ({"name": "calc", "command": []}, "[0].command", "must not be empty"),
        ({"name": "calc", "url": "http://x", "tools": "add"}, "[0].tools", "list of"),
        ({"name": "calc", "url": "http://x", "timeoutSeconds": 0}, "[0].timeoutSeconds", "above 0"),
        ({"name": "calc", "url": "http://x", "header": []}, "[0].header", "not a field"),
    ],
)
def test_a_bad_server_names_its_field(server: dict[str, Any], where: str, problem: str) -> None:
    with pytest.raises(MCPSpecError) as raised:
        parse_mcp_servers({"mcpServers": [server]})
    assert raised.value.where == f"spec.mcpServers{where}"
    assert problem in raised.value.problem


def test_server_names_are_unique() -> None:
    twice = [{"name": "calc", "url": "http://a"}, {"name": "calc", "url": "http://b"}]
    with pytest.raises(MCPSpecError, match=r"mcpServers\[1\]\.name: 'calc' is taken"):
        parse_mcp_servers({"mcpServers": twice})


def test_the_runs_redactor_masks_the_mcp_secrets() -> None:
    from alpineagents.redaction import Redactor

    redactor = Redactor.from_environment(SECRETS)
    assert redactor.text("sent Bearer abc and xyz") == "sent *** and xyz"  # xyz: too short
