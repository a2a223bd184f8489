"""Everything the server exports on ``GET /metrics``, built on ``prometheus_client``.

The server owns one :class:`ServerMetrics`, and each has its own ``CollectorRegistry`` (never the library's global
one): two servers in one process, or two tests, keep separate counts. Besides the ``streamer_*`` metrics the registry
carries the library's process collector (``process_resident_memory_bytes``, ``process_cpu_seconds_total``,
``process_open_fds``, ...) and platform collector (``python_info``), and the webhook's delivery counters once the
server hands them over (:meth:`ServerMetrics.render`). docs/operations.md lists every name. :func:`percentile` also
lives here; the session uses it for the latency summary of its ``done`` message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamer.engine import gpu_memory_allocated
from streamer.engine.types import StageTimings

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "CONTENT_TYPE_LATEST",
    "LATENCY_BUCKETS",
    "OTHER_ROUTE",
    "STAGE_BUCKETS",
    "Counter",
    "ReadGauge",
    "ServerMetrics",
    "percentile",
]

# The content type of render()'s body. generate_latest() writes the text format 0.0.4 (classic names, nothing
# escaped), which is what prometheus_client's own handler declares to a scraper that negotiates nothing; the
# library's CONTENT_TYPE_LATEST says version=1.0.0 since 0.22, a format the server does not negotiate.
CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"

# seconds; streaming latency lives between a few hundred milliseconds and a few seconds
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# seconds; one stage of one window (features, encoder, decoder) takes from a millisecond on a GPU to a second
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# windows per engine call: powers of two up to the largest --max-batch-size anyone runs
BATCH_SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

# The `route` label of a session admitted by anything but the server's runner (ServerMetrics.route_label).
OTHER_ROUTE = "other"


class Counter(prometheus_client.Counter):
    """``prometheus_client``'s counter, whose total over every label set reads as :attr:`value` (``/status`` reads
    the engine's busy seconds and batches this way)."""

    @property
    def value(self) -> float:
        return sum(s.value for family in self.collect() for s in family.samples if s.name.endswith("_total"))


class ReadGauge(Collector):
    """A gauge whose value is ``function()`` at scrape time; None renders no sample (the value does not exist here,
    like GPU memory on a CPU-only machine). ``prometheus_client``'s ``Gauge.set_function`` cannot say that."""

    def __init__(self, name: str, help_text: str, function: Callable[[], float | None]) -> None:
        self.name = name
        self.help = help_text
        self.function = function

    def read(self) -> float | None:
        """The value now (None: it does not exist here)."""
        return self.function()

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.name, self.help)]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.help)
        value = self.read()
        if value is not None:
            family.add_metric([], value)
        return [family]


class ServerMetrics:
    """Every metric the server exports, by role, on a registry of its own. The scheduler and the sessions update
    them; ``GET /metrics`` answers :meth:`render` with the content type :data:`CONTENT_TYPE_LATEST`."""

    def __init__(self, stream_routes: Sequence[str] = ("listen",)) -> None:
        # The values of the `route` label of the session counters: the routes whose connections take a scheduler
        # slot (the server's table's RouteTable.stream_names), and `other`. Bounded on purpose: a label value per
        # session id would be a new time series per session.
        self.stream_routes = tuple(stream_routes)
        self.registry = r = CollectorRegistry()
        self._sources: list[Collector] = []
        ProcessCollector(registry=r)  # process_*: RSS, CPU seconds, open fds (Linux only: /proc)
        PlatformCollector(registry=r)  # python_info
        self.active_sessions = prometheus_client.Gauge(
            "streamer_active_sessions", "Sessions currently open.", registry=r
        )
        self.ready = prometheus_client.Gauge(
            "streamer_ready", "1 while serving /v1/listen (the model loaded, not draining), else 0.", registry=r
        )
        self.engine_threads = prometheus_client.Gauge(
            "streamer_engine_threads",
            "Threads the engine's last call ran on, where a worker's engine follows its siblings' load (--workers "
            "without --threads); else 0.",
            registry=r,
        )
        self.sessions_total = Counter(
            "streamer_sessions_total", "Sessions accepted since start, by route.", ["route"], registry=r
        )
        self.admission_rejections = Counter(
            "streamer_admission_rejections_total",
            "Sessions refused because the server was at capacity, by route.",
            ["route"],
            registry=r,
        )
        for route in self.stream_routes:  # every series from the start: rate() of a series that appears later misses it
            self.sessions_total.labels(route=route)
            self.admission_rejections.labels(route=route)
        self.queue_depth = prometheus_client.Gauge(
            "streamer_queue_depth", "Streams with a window waiting for the engine (not the running batch).", registry=r
        )
        self.batches = Counter("streamer_batches_total", "Batches the engine decoded.", registry=r)
        self.batch_failures = Counter("streamer_batch_failures_total", "Batches whose decode raised.", registry=r)
        self.windows_retried = Counter(
            "streamer_windows_retried_total", "Windows decoded again alone because their batch raised.", registry=r
        )
        self.windows = Counter("streamer_windows_total", "Windows the engine decoded.", registry=r)
        self.engine_busy_seconds = Counter(
            "streamer_engine_busy_seconds_total", "Wall time the engine spent decoding.", registry=r
        )
        self.speaker_windows = Counter(
            "streamer_speaker_windows_total", "Windows the voice encoder embedded for speaker labels.", registry=r
        )
        self.speaker_busy_seconds = Counter(
            "streamer_speaker_busy_seconds_total", "Wall time the voice encoder spent embedding.", registry=r
        )
        self.audio_received = Counter(
            "streamer_audio_seconds_received_total", "Seconds of audio received, summed over channels.", registry=r
        )
        self.audio_transcribed = Counter(
            "streamer_audio_seconds_transcribed_total", "Seconds of audio committed in finals.", registry=r
        )
        self.real_time_factor = ReadGauge(
            "streamer_real_time_factor",
            "Engine busy seconds per second of audio received (below 1 keeps up with real time).",
            self._real_time_factor,
        )
        self.partial_latency = Histogram(
            "streamer_partial_latency_seconds",
            "From the arrival of the audio to sending a partial.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.final_latency = Histogram(
            "streamer_final_latency_seconds",
            "From the arrival of the audio to sending a final.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "streamer_batch_size", "Windows per engine call.", buckets=BATCH_SIZE_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "streamer_batch_seconds", "Wall time of one engine call.", buckets=STAGE_BUCKETS, registry=r
        )
        # DecodeResult.timings: the engine's own per-window share of each stage (windows answered from the cache,
        # which cost nothing, are not observed)
        self.features_seconds = Histogram(
            "streamer_features_seconds", "Log-mel features, per window.", buckets=STAGE_BUCKETS, registry=r
        )
        self.encoder_seconds = Histogram(
            "streamer_encoder_seconds", "Encoder forward pass, per window.", buckets=STAGE_BUCKETS, registry=r
        )
        self.decoder_seconds = Histogram(
            "streamer_decoder_seconds", "Decoding (every decoder pass), per window.", buckets=STAGE_BUCKETS, registry=r
        )
        self.gpu_memory = ReadGauge(
            "streamer_gpu_memory_allocated_bytes",
            "GPU memory held by the engine's tensors (no sample without a GPU in use).",
            gpu_memory_allocated,
        )
        r.register(self.real_time_factor)
        r.register(self.gpu_memory)

    def observe_batch(self, seconds: float, timings: Sequence[StageTimings]) -> None:
        """One engine call that took ``seconds`` of wall time returned results with these stage ``timings``."""
        self.batch_size.observe(len(timings))
        self.batch_seconds.observe(seconds)
        for timing in timings:
            if timing == StageTimings():
                continue  # answered from the cache
            self.features_seconds.observe(timing.features)
            self.encoder_seconds.observe(timing.encoder)
            self.decoder_seconds.observe(timing.decoder)

    def _real_time_factor(self) -> float:
        received = self.audio_received.value
        return self.engine_busy_seconds.value / received if received else 0.0

    def route_label(self, route: str) -> str:
        """The ``route`` label for a session of ``route``: a stream route's name, else ``other`` (bounded)."""
        return route if route in self.stream_routes else OTHER_ROUTE

    def render(self, *sources: Collector) -> str:
        """The body of ``GET /metrics`` (content type :data:`CONTENT_TYPE_LATEST`), read now.

        ``sources``: collectors the server owns apart from these metrics (its
        :class:`~streamer.integrations.endpoints.Integrations`, with the webhook's counters). Each is registered on this
        registry the first time it is passed, so that a name it shares with another metric is refused
        (``ValueError``).
        """
        for source in sources:
            if source not in self._sources:
                self.registry.register(source)
                self._sources.append(source)
        return generate_latest(self.registry).decode()


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
