"""OpenTelemetry tracing, optional: a span per session and per engine batch.

:class:`Tracer` wraps an OpenTelemetry tracer or nothing. Without ``streamer serve --otel`` (or without the
``otel`` extra) every call is a no-op that costs a few attribute lookups, and ``opentelemetry`` is never imported.
With ``--otel``, :func:`otel_tracer` imports it lazily and says how to install it when it is missing.

Spans:

- ``streamer.server.session``: one per WebSocket session (``/v1/listen``, ``/twilio``, ``/v1/realtime``), from the
  handshake to the close; attributes ``streamer.session_id``, ``streamer.path``, ``streamer.close_code``.
- ``streamer.batch``: one per ``engine.decode`` call, on the scheduler's task; attributes ``streamer.windows``,
  ``streamer.audio_seconds`` and ``streamer.streams`` (the ``session/channel`` stream ids it served). A batch serves
  many sessions at once, so it is not a child of any session span: the stream ids join them.

Export: an application that already set a global tracer provider (``opentelemetry-instrument``, or its own SDK
set-up) keeps it. Otherwise :func:`otel_tracer` installs the SDK's provider with OTLP over HTTP when
``opentelemetry-exporter-otlp-proto-http`` is installed (configured by the standard ``OTEL_EXPORTER_OTLP_*`` and
``OTEL_SERVICE_NAME`` variables), else spans printed to stderr as JSON.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from streamer.core.errors import ConfigError

__all__ = ["NO_TRACING", "AttributeValue", "Span", "Tracer", "otel_tracer"]

INSTRUMENTATION_NAME = "streamer"

AttributeValue = str | bool | int | float | Sequence[str]


class Span:
    """The span being recorded, or nothing. :meth:`set` adds an attribute (a no-op when tracing is off)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)


class Tracer:
    """Makes spans with an OpenTelemetry tracer, or does nothing when constructed without one."""

    def __init__(self, otel: Any = None) -> None:
        self._otel = otel

    @property
    def enabled(self) -> bool:
        return self._otel is not None

    @contextlib.contextmanager
    def span(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[Span]:
        """Record ``name`` around the block (as the current span of this task). An exception leaving the block is
        recorded on the span and re-raised."""
        if self._otel is None:
            yield Span()
            return
        with self._otel.start_as_current_span(name, attributes=dict(attributes or {})) as span:
            yield Span(span)


NO_TRACING = Tracer()


def otel_tracer(provider: Any = None) -> Tracer:
    """A :class:`Tracer` on OpenTelemetry: on ``provider`` if given (tests pass an SDK provider with an in-memory
    exporter), else on the global provider, set up first if nobody did (see the module docstring).

    Raises :class:`~streamer.core.errors.ConfigError` when the ``opentelemetry`` packages are missing.
    """
    try:
        from opentelemetry import trace
    except ImportError as error:
        raise ConfigError(
            "--otel needs OpenTelemetry: pip install 'streamer[otel]' (opentelemetry-api and opentelemetry-sdk)"
        ) from error
    if provider is None:
        provider = trace.get_tracer_provider()
        if not _is_configured(provider):
            provider = _sdk_provider()
            trace.set_tracer_provider(provider)
    return Tracer(provider.get_tracer(INSTRUMENTATION_NAME))


def _is_configured(provider: Any) -> bool:
    # the API's default is a proxy (or no-op) provider until an SDK provider is set
    from opentelemetry import trace

    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _sdk_provider() -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as error:
        raise ConfigError("--otel needs the OpenTelemetry SDK: pip install 'streamer[otel]'") from error
    exporter: Any
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError:
        exporter = ConsoleSpanExporter()
    else:
        exporter = OTLPSpanExporter()
    # Resource.create() reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, but its argument wins over them
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "streamer"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
