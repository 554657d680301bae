"""The OpenTelemetry SDK, set up for runs: the process's tracer provider (its own, never
the global one), ids that follow the State (:func:`trace_id_of`, and the ids a span is
given), the exporter the ``OTEL_*`` variables ask for, batched. The SDK is imported only
here, and only once tracing is on."""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from ..redaction import Redactor

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

__all__ = ["CAPTURE_CONTENT_ENV", "Tracing", "chosen_ids", "made", "trace_id_of"]

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# Our default batch delay: a killed pod loses what waits in the batch, so send often.
_SCHEDULE_DELAY_MS = "1000"

# Ids the next span takes (a trace id for an attempt, a span id for a rebuilt one).
chosen_ids: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "alpineagents_trace_ids", default=(0, 0)
)


class Tracing:
    """The process's tracer and what each span needs (made once, on the first traced run)."""

    def __init__(self, provider: TracerProvider, capture: bool) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("alpineagents")
        self.capture = capture
        self.redactor = Redactor.from_environment() if capture else None
        self.trace = trace
        self.status = Status
        self.error_code = StatusCode.ERROR

    def content(self, value: Any) -> str:
        """Text for a content attribute, secrets masked."""
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return self.redactor.text(text) if self.redactor is not None else text


def made(exporter: SpanExporter | None, processor: SpanProcessor | None) -> Tracing:
    """The process's tracing: a tracer provider of its own (ids that follow the State),
    sending to ``processor``, or to ``exporter`` batched, or as the ``OTEL_*`` variables say."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "alpineagents"}
    )
    provider = TracerProvider(resource=resource, id_generator=_id_generator())
    provider.add_span_processor(processor or _batch(exporter or _exporter_from_environment()))
    capture = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    return Tracing(provider, capture)


def trace_id_of(state_id: str) -> int:
    """The trace id of every attempt of the State ``state_id`` (128 bits of its hash)."""
    return int.from_bytes(hashlib.sha256(state_id.encode()).digest()[:16], "big") or 1


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _StateIds(RandomIdGenerator):
        """Random ids, except those a span of a run must have (see ``chosen_ids``)."""

        def generate_trace_id(self) -> int:
            return chosen_ids.get()[0] or super().generate_trace_id()

        def generate_span_id(self) -> int:
            return chosen_ids.get()[1] or super().generate_span_id()

    return _StateIds()


def _exporter_from_environment() -> SpanExporter:
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={name!r} is not supported by alpineagents: use 'otlp' "
            f"(OTLP/HTTP), 'console' or 'none'"
        )
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol != "http/protobuf":
        # Said at the start, not found out by a collector that never gets a span.
        raise ValueError(
            f"OTLP protocol {protocol!r} is not supported by alpineagents: it sends OTLP over "
            f"HTTP (http/protobuf); set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and point "
            f"the endpoint at the collector's OTLP/HTTP port (4318 by default)"
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as error:
        raise ImportError(
            "tracing is configured (OTEL_* variables) but the OTLP exporter is not "
            "installed: pip install 'alpineagents[otel]'"
        ) from error
    return OTLPSpanExporter()


def _batch(exporter: SpanExporter) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    delay = os.environ.get("OTEL_BSP_SCHEDULE_DELAY") or _SCHEDULE_DELAY_MS
    return BatchSpanProcessor(exporter, schedule_delay_millis=float(delay))
