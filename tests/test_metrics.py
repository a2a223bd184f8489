from __future__ import annotations

import sys

import pytest

from streamer.engine.types import StageTimings
from streamer.metrics import Counter, Gauge, Histogram, Registry, ServerMetrics, percentile


def test_counter_gauge_histogram_render_in_exposition_format() -> None:
    registry = Registry()
    requests = registry.register(Counter("app_requests_total", "Requests."))
    depth = registry.register(Gauge("app_depth", "Depth."))
    latency = registry.register(Histogram("app_latency_seconds", "Latency.", buckets=(0.1, 1.0)))
    requests.inc()
    requests.inc(2)
    depth.set(5)
    depth.dec()
    for value in (0.05, 0.1, 0.5, 7.0):
        latency.observe(value)
    assert registry.render() == (
        "# HELP app_requests_total Requests.\n"
        "# TYPE app_requests_total counter\n"
        "app_requests_total 3\n"
        "# HELP app_depth Depth.\n"
        "# TYPE app_depth gauge\n"
        "app_depth 4\n"
        "# HELP app_latency_seconds Latency.\n"
        "# TYPE app_latency_seconds histogram\n"
        'app_latency_seconds_bucket{le="0.1"} 2\n'
        'app_latency_seconds_bucket{le="1"} 3\n'
        'app_latency_seconds_bucket{le="+Inf"} 4\n'
        "app_latency_seconds_sum 7.65\n"
        "app_latency_seconds_count 4\n"
    )


def test_counter_refuses_to_decrease() -> None:
    with pytest.raises(ValueError, match="cannot decrease"):
        Counter("c", "c").inc(-1)


def test_duplicate_names_are_refused() -> None:
    registry = Registry()
    registry.register(Gauge("g", "g"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Counter("g", "g"))


def test_histogram_needs_increasing_buckets() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Histogram("h", "h", buckets=(1.0, 0.5))


def test_server_metrics_real_time_factor() -> None:
    metrics = ServerMetrics()
    assert "streamer_real_time_factor 0\n" in metrics.render()
    metrics.audio_received.inc(10.0)
    metrics.engine_busy_seconds.inc(2.5)
    text = metrics.render()
    assert "streamer_real_time_factor 0.25\n" in text
    for name in (
        "streamer_active_sessions",
        "streamer_queue_depth",
        "streamer_admission_rejections_total",
        "streamer_partial_latency_seconds_bucket",
        "streamer_final_latency_seconds_count",
        "streamer_audio_seconds_received_total",
        "streamer_audio_seconds_transcribed_total",
    ):
        assert name in text


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, None), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5), ([10.0, 0.0], 95, 9.5)],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


def test_stage_timings_and_batches_are_observed_but_cached_windows_are_not() -> None:
    metrics = ServerMetrics()
    metrics.observe_batch(0.2, [StageTimings(0.01, 0.05, 0.1), StageTimings()])  # the second came from the cache
    text = metrics.render()
    assert 'streamer_batch_size_bucket{le="2"} 1\n' in text
    assert "streamer_batch_seconds_sum 0.2\n" in text
    for stage, seconds in (("features", 0.01), ("encoder", 0.05), ("decoder", 0.1)):
        assert f"streamer_{stage}_seconds_count 1\n" in text
        assert f"streamer_{stage}_seconds_sum {seconds}\n" in text


def test_gpu_memory_has_no_sample_without_a_gpu_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    import streamer.engine

    metrics = ServerMetrics()
    monkeypatch.setattr(metrics.gpu_memory, "function", lambda: None)
    text = metrics.render()
    assert "# TYPE streamer_gpu_memory_allocated_bytes gauge\n" in text
    assert "\nstreamer_gpu_memory_allocated_bytes " not in text
    monkeypatch.setattr(metrics.gpu_memory, "function", lambda: 3 << 20)
    assert "\nstreamer_gpu_memory_allocated_bytes 3145728\n" in metrics.render()
    # without torch imported nothing used the GPU; the engine package does not import torch to find out
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert streamer.engine.gpu_memory_allocated() is None
    assert "torch" not in sys.modules
