"""No credential of a provider is written anywhere, including those its client obtains while
the run goes on: Bedrock's temporary AWS keys from the web-identity exchange, Vertex AI's
bearer token from the metadata server, Foundry's Entra token, and the key and gateway
header values from Secrets.

The provider's endpoint here is a careless one: its error answers quote the request's
headers, credentials and all (some gateways and proxies do). The runner is a real process
tracing into a real OpenTelemetry Collector; its logs, its saved State, its termination
message and every span are then searched for each credential's bytes."""

from __future__ import annotations

import json
from pathlib import Path

from alpineagents.redaction import MASK
from alpineagents.testing import error, reply, tool_use
from alpineagents.testing.provider_wire import QUOTE
from tests.bench.otel_collector import Collector
from tests.bench.runner_process import RunnerProcess, Workspace
from tests.providers.conftest import Cloud


def test_an_error_quoting_the_request_writes_no_credential_anywhere(
    cloud: Cloud, tmp_path: Path, runners: list[RunnerProcess], otel_collector: Collector
) -> None:
    for wire in cloud.wires:
        wire.quotes_requests = True
    cloud.model.add(
        reply("Checking.", tool_use("shell", {"command": "echo checked"})),
        error(400, "prompt is too long"),
    )
    workspace = Workspace(tmp_path, cloud.model, runners)
    manifest = workspace.manifest(
        model=cloud.model_id, provider=cloud.spec, tools=["shell"], prompt="Check."
    )

    runner = workspace.run(manifest, **cloud.env, **otel_collector.env)

    assert runner.process.returncode != 0, runner.stderr
    assert cloud.refused() == []
    spans = otel_collector.wait_for_spans(f"chat {cloud.model_id}", count=2)
    (failed,) = [e for e in workspace.store.load("job").history if e.kind == "model_error"]
    # The refusal was saved, reported and traced with its quote, the credentials masked.
    assert QUOTE in failed.text and MASK in failed.text
    assert MASK in json.dumps(runner.message)
    assert any(MASK in json.dumps(span.events) for span in spans)

    credentials = cloud.secrets()
    assert credentials, f"{cloud.name}: no credential was given or obtained"
    written = {
        "the State": "\n".join(p.read_text() for p in workspace.runs.rglob("*") if p.is_file()),
        "the logs": runner.stdout + runner.stderr,
        "the termination message": json.dumps(runner.message),
        "the traces": otel_collector.text(),
    }
    for where, text in written.items():
        for credential in credentials:
            assert credential not in text, f"a {cloud.name} credential is in {where}"
