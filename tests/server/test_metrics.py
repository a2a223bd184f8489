"""streamer.server.metrics: what ``GET /metrics`` exports, read back with prometheus_client's own parser, after real
actions over real servers (the scripted engine) where the numbers come from the sessions and the scheduler."""

from __future__ import annotations

import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from streamer.app import App
from streamer.core.errors import AtCapacity
from streamer.engine.fake import ScriptedEngine
from streamer.engine.types import StageTimings
from streamer.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics, percentile
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.serve import Server
from tests.helpers import WORDS, chunks, config, exchange, http_get, kinds, pcm16, speech
from tests.server.test_routes import raw_http


def samples(text: str) -> dict[str, list[Sample]]:
    """The exposition ``text``, parsed: every family's samples by the family's name."""
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float:
    """The one sample called ``name`` with exactly these ``labels`` in ``text``."""
    (found,) = [s.value for f in samples(text).values() for s in f if s.name == name and s.labels == labels]
    return found


async def scrape(srv: Server) -> str:
    status, headers, body = await http_get(srv.port, "/metrics")
    assert status == 200 and headers["content-type"] == CONTENT_TYPE_LATEST
    return body


# -- over a real server ---------------------------------------------------------------------------------------------


async def test_a_session_is_counted_by_route_with_its_audio_batches_and_latencies(server: Server) -> None:
    audio = speech()
    messages, code = await exchange(server, [*chunks(pcm16(audio)), '{"type":"end"}'])
    assert code == 1000
    text = await scrape(server)
    assert value(text, "streamer_sessions_total", route="listen") == 1
    assert value(text, "streamer_sessions_total", route="realtime") == 0  # every route's series from the start
    assert value(text, "streamer_admission_rejections_total", route="listen") == 0
    assert value(text, "streamer_active_sessions") == 0
    assert value(text, "streamer_audio_seconds_received_total") == pytest.approx(len(audio) / 16000, abs=1e-3)
    # every message the client read was observed once, in its histogram
    assert value(text, "streamer_final_latency_seconds_count") == kinds(messages).count("final") > 0
    assert value(text, "streamer_partial_latency_seconds_count") == kinds(messages).count("partial")
    batches = value(text, "streamer_batches_total")
    assert batches > 0 and batches == server.metrics.batches.value
    assert value(text, "streamer_windows_total") >= batches
    assert value(text, "streamer_batch_size_count") == batches  # one observation per engine call
    finals_seconds = value(text, "streamer_audio_seconds_transcribed_total")
    assert 0 < finals_seconds <= value(text, "streamer_audio_seconds_received_total")


async def test_the_process_collectors_are_exported(server: Server) -> None:
    text = await scrape(server)
    assert value(text, "process_resident_memory_bytes") > 10 << 20  # at least the interpreter and numpy
    assert value(text, "process_cpu_seconds_total") > 0
    assert value(text, "process_open_fds") >= 3  # stdio, and the listening socket
    (info,) = samples(text)["python_info"]
    assert info.labels["major"] == str(sys.version_info.major)


async def test_metrics_has_exactly_one_content_type(server: Server) -> None:
    status, headers = await raw_http(server.port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200
    assert [v for k, v in headers if k == "content-type"] == [CONTENT_TYPE_LATEST]


async def test_two_servers_in_one_process_keep_separate_counts() -> None:
    async with App(config(), ScriptedEngine(WORDS)) as busy, App(config(), ScriptedEngine(WORDS)) as idle:
        await exchange(busy, [*chunks(pcm16(speech())), '{"type":"end"}'])
        busy_text, idle_text = await scrape(busy), await scrape(idle)
    assert value(busy_text, "streamer_sessions_total", route="listen") == 1
    assert value(idle_text, "streamer_sessions_total", route="listen") == 0
    assert value(busy_text, "streamer_batches_total") > 0 == value(idle_text, "streamer_batches_total")
    assert value(idle_text, "streamer_audio_seconds_received_total") == 0


async def test_sessions_refused_at_capacity_are_counted_by_route() -> None:
    scheduler = Scheduler(ScriptedEngine(WORDS), SchedulerOptions(max_sessions=1), ServerMetrics(("listen", "twilio")))
    scheduler.admit("twilio-1", "twilio")  # the server's runner names the route it admits for
    with pytest.raises(AtCapacity):
        scheduler.admit("listen-2", "listen")
    text = scheduler.metrics.render()
    assert value(text, "streamer_sessions_total", route="twilio") == 1
    assert value(text, "streamer_admission_rejections_total", route="listen") == 1
    assert scheduler.metrics.admission_rejections.value == 1  # the total over routes


def test_the_autoscaler_gauges_are_one_unlabelled_series() -> None:
    # docker/k8s/prometheus-adapter-config.yaml reads each without aggregating: a label would split it per pod
    text = ServerMetrics().render()
    for name in ("streamer_active_sessions", "streamer_queue_depth"):
        assert [(s.name, s.labels) for s in samples(text)[name]] == [(name, {})]


# -- the metrics themselves -----------------------------------------------------------------------------------------


def test_real_time_factor_is_busy_seconds_per_second_received() -> None:
    metrics = ServerMetrics()
    assert value(metrics.render(), "streamer_real_time_factor") == 0  # no audio yet: no division by zero
    metrics.audio_received.inc(10.0)
    metrics.engine_busy_seconds.inc(2.5)
    assert value(metrics.render(), "streamer_real_time_factor") == 0.25
    assert metrics.real_time_factor.read() == 0.25  # what /status reports


def test_stage_timings_and_batches_are_observed_but_cached_windows_are_not() -> None:
    metrics = ServerMetrics()
    metrics.observe_batch(0.2, [StageTimings(0.01, 0.05, 0.1), StageTimings()])  # the second came from the cache
    text = metrics.render()
    assert value(text, "streamer_batch_size_bucket", le="1.0") == 0
    assert value(text, "streamer_batch_size_bucket", le="2.0") == 1
    assert value(text, "streamer_batch_seconds_sum") == pytest.approx(0.2)
    for stage, seconds in (("features", 0.01), ("encoder", 0.05), ("decoder", 0.1)):
        assert value(text, f"streamer_{stage}_seconds_count") == 1
        assert value(text, f"streamer_{stage}_seconds_sum") == pytest.approx(seconds)


def test_gpu_memory_has_no_sample_without_a_gpu_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    import streamer.engine

    metrics = ServerMetrics()
    monkeypatch.setattr(metrics.gpu_memory, "function", lambda: None)
    text = metrics.render()
    assert samples(text)["streamer_gpu_memory_allocated_bytes"] == []
    assert "# TYPE streamer_gpu_memory_allocated_bytes gauge\n" in text
    monkeypatch.setattr(metrics.gpu_memory, "function", lambda: 3 << 20)
    assert value(metrics.render(), "streamer_gpu_memory_allocated_bytes") == 3 << 20
    # without torch imported nothing used the GPU; the engine package does not import torch to find out
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert streamer.engine.gpu_memory_allocated() is None
    assert "torch" not in sys.modules


def test_a_source_whose_name_is_taken_is_refused() -> None:
    metrics = ServerMetrics()
    with pytest.raises(ValueError, match="streamer_real_time_factor"):
        metrics.render(ServerMetrics().real_time_factor)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, None), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5), ([10.0, 0.0], 95, 9.5)],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected
