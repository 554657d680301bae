"""A real OpenTelemetry Collector as a fixture: OTLP/HTTP in, a JSON-lines file out.

``otel_collector`` starts our build of the collector (``otelcol`` in tests/bench/testbin.py:
the OTLP receiver and the file exporter only) on loopback for one test;
``node_otel_collector`` starts it on the real node's bridge, where pods reach it. Point a
process at ``otel_collector.env`` (a pod: ``endpoint``) and read what arrived with
``otel_collector.spans()``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.bench.infra import free_port, missing
from tests.bench.server_process import ServerProcess
from tests.bench.testbin import ProvisioningError, binary_path


@dataclass(frozen=True)
class Span:
    """One span as the file exporter wrote it (OTLP JSON), with its attributes decoded."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    attributes: dict[str, Any]
    status: int
    """0 unset, 1 ok, 2 error."""
    events: list[dict[str, Any]]
    raw: dict[str, Any]


class Collector:
    """A running collector and the file its traces go to."""

    def __init__(self, process: ServerProcess, address: str, port: int, output: Path) -> None:
        self.process = process
        self.address = address
        self.port = port
        self.output = output

    @property
    def endpoint(self) -> str:
        """The OTLP/HTTP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
        return f"http://{self.address}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Variables that turn a run's tracing on and send it here."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}

    def text(self) -> str:
        """Everything the file exporter wrote so far."""
        return self.output.read_text() if self.output.exists() else ""

    def spans(self) -> list[Span]:
        """Every span received so far."""
        found = []
        for line in self.text().splitlines():
            if not line.strip():
                continue
            for resource in json.loads(line).get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    found.extend(_span(raw) for raw in scope.get("spans", []))
        return found

    def wait_for_spans(self, wanted: str, count: int = 1) -> list[Span]:
        """Wait until ``count`` spans named ``wanted`` have arrived; return all spans."""
        spans: list[Span] = []

        def arrived() -> bool:
            nonlocal spans
            spans = self.spans()
            return sum(s.name == wanted for s in spans) >= count

        self.process.wait_until(arrived, f"received {count} span(s) {wanted!r}", timeout=120)
        return spans

    def _ready(self) -> bool:
        request = urllib.request.Request(
            f"{self.endpoint}/v1/traces",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def _value(raw: dict[str, Any]) -> Any:
    if "stringValue" in raw:
        return raw["stringValue"]
    if "intValue" in raw:
        return int(raw["intValue"])
    if "doubleValue" in raw:
        return float(raw["doubleValue"])
    if "boolValue" in raw:
        return bool(raw["boolValue"])
    if "arrayValue" in raw:
        return [_value(v) for v in raw["arrayValue"].get("values", [])]
    return None


def _attributes(raw: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in raw}


def _span(raw: dict[str, Any]) -> Span:
    events = [
        {"name": e.get("name"), **_attributes(e.get("attributes", []))}
        for e in raw.get("events", [])
    ]
    return Span(
        trace_id=raw["traceId"],
        span_id=raw["spanId"],
        parent_id=raw.get("parentSpanId", ""),
        name=raw["name"],
        attributes=_attributes(raw.get("attributes", [])),
        status=int(raw.get("status", {}).get("code", 0) or 0),
        events=events,
        raw=raw,
    )


def _config(address: str, port: int, output: Path) -> str:
    return "\n".join(
        [
            "receivers:",
            "  otlp:",
            "    protocols:",
            "      http:",
            f"        endpoint: {address}:{port}",
            "exporters:",
            "  file:",
            f"    path: {output}",
            "    flush_interval: 100ms",
            "service:",
            "  telemetry:",
            "    metrics:",
            "      level: none",  # no metrics server of its own (a fixed port)
            "  pipelines:",
            "    traces:",
            "      receivers: [otlp]",
            "      exporters: [file]",
            "",
        ]
    )


@contextlib.contextmanager
def running_collector(address: str) -> Iterator[Collector]:
    """A collector taking OTLP/HTTP on ``address`` (a free port); stopped and removed after."""
    try:
        binary = binary_path("otelcol")
    except ProvisioningError as error:
        missing(
            "the OpenTelemetry Collector", f"run `python -m tests.bench.testbin otelcol`: {error}"
        )
    workdir = Path(tempfile.mkdtemp(prefix="alpineagents-otelcol-"))
    workdir.chmod(0o700)
    port = free_port()
    config = workdir / "config.yaml"
    config.write_text(_config(address, port, workdir / "traces.jsonl"))
    process = ServerProcess(
        "otelcol", [str(binary), f"--config={config}"], workdir / "otelcol.log", stop_grace=15
    )
    collector = Collector(process, address, port, workdir / "traces.jsonl")
    try:
        process.start()
        process.wait_until(collector._ready, "accepting OTLP/HTTP")
        yield collector
    finally:
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def otel_collector() -> Iterator[Collector]:
    """A started collector on loopback for one test."""
    with running_collector("127.0.0.1") as collector:
        yield collector


@pytest.fixture
def node_otel_collector(real_node: Any) -> Iterator[Collector]:
    """A started collector on the real node's bridge (pods send to its ``endpoint``)."""
    from tests.bench.node_network import NodeSubnet

    with running_collector(NodeSubnet(0).gateway) as collector:
        yield collector
