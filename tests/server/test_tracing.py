from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from streamer.app import App
from streamer.core.errors import ConfigError
from streamer.engine.fake import ScriptedEngine
from streamer.server.tracing import NO_TRACING, otel_tracer
from tests.helpers import WORDS, chunks, config, exchange, pcm16, speech


def test_without_otel_spans_cost_nothing_and_import_nothing() -> None:
    assert not NO_TRACING.enabled
    with NO_TRACING.span("streamer.server.session", {"streamer.session_id": "x"}) as span:
        span.set("streamer.close_code", 1000)  # no-op


def test_asking_for_otel_without_the_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'streamer\[otel\]'"):
        otel_tracer()


@pytest.fixture
def recorded() -> Any:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


async def test_a_span_per_session_and_per_batch(recorded: Any) -> None:
    provider, exporter = recorded
    tracer = otel_tracer(provider)
    assert tracer.enabled
    async with App(config(), ScriptedEngine(WORDS), tracer=tracer) as srv:
        messages, code = await exchange(srv, [*chunks(pcm16(speech())), json.dumps({"type": "end"})])
    assert code == 1000
    session_id = messages[0]["session_id"]
    spans = exporter.get_finished_spans()
    (session,) = [s for s in spans if s.name == "streamer.server.session"]
    assert session.attributes["streamer.session_id"] == session_id
    assert session.attributes["streamer.path"] == "/v1/listen"
    assert session.attributes["streamer.close_code"] == 1000
    batches = [s for s in spans if s.name == "streamer.batch"]
    assert batches
    for batch in batches:
        assert batch.attributes["streamer.windows"] >= 1
        assert batch.attributes["streamer.audio_seconds"] > 0
        assert tuple(batch.attributes["streamer.streams"]) == (f"{session_id}/0",)
        # batches run inside the session's lifetime
        assert session.start_time <= batch.start_time <= batch.end_time <= session.end_time


async def test_an_exception_is_recorded_on_the_span(recorded: Any) -> None:
    provider, exporter = recorded
    tracer = otel_tracer(provider)
    with pytest.raises(RuntimeError), tracer.span("work"):
        raise RuntimeError("boom")
    (span,) = exporter.get_finished_spans()
    assert not span.status.is_ok
    assert [e.name for e in span.events] == ["exception"]
