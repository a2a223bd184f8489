"""A small Prometheus registry: counters, gauges and histograms rendered in the text exposition format 0.0.4.

No dependency and no global state: the server owns one :class:`ServerMetrics` and renders it for ``GET /metrics``.
All updates happen on the event loop thread, so no locks. :func:`percentile` also lives here; the session uses it
for the latency summary of its ``done`` message.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TypeVar

from streamer.engine import gpu_memory_allocated
from streamer.engine.types import StageTimings

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "LATENCY_BUCKETS",
    "STAGE_BUCKETS",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
    "ServerMetrics",
    "percentile",
]

# seconds; streaming latency lives between a few hundred milliseconds and a few seconds
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# seconds; one stage of one window (features, encoder, decoder) takes from a millisecond on a GPU to a second
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# windows per engine call: powers of two up to the largest --max-batch-size anyone runs
BATCH_SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _format(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text

    def samples(self) -> list[tuple[str, float]]:
        raise NotImplementedError

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{name} {_format(value)}" for name, value in self.samples()]
        return "\n".join(lines)


M = TypeVar("M", bound=_Metric)


class Counter(_Metric):
    """A total that only goes up."""

    kind = "counter"

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help_text)
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter cannot decrease")
        self.value += amount

    def samples(self) -> list[tuple[str, float]]:
        return [(self.name, self.value)]


class Gauge(_Metric):
    """A value that goes up and down; set it, or give it a function read at render time (a function that returns
    None renders no sample: the value does not exist here, like GPU memory on a CPU-only machine)."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, function: Callable[[], float | None] | None = None) -> None:
        super().__init__(name, help_text)
        self.value = 0.0
        self.function = function

    def set(self, value: float) -> None:
        self.value = value

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def read(self) -> float | None:
        """The value now (None: it does not exist here)."""
        return self.function() if self.function is not None else self.value

    def samples(self) -> list[tuple[str, float]]:
        value = self.read()
        return [] if value is None else [(self.name, value)]


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        super().__init__(name, help_text)
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError("histogram buckets must be a non-empty increasing sequence")
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def samples(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append((f'{self.name}_bucket{{le="{_format(bound)}"}}', running))
        out += [(f"{self.name}_sum", self.sum), (f"{self.name}_count", self.count)]
        return out


class Registry:
    """Metrics in registration order, rendered together."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def register(self, metric: M) -> M:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        """The body of ``GET /metrics`` (content type ``text/plain; version=0.0.4``)."""
        return "".join(metric.render() + "\n" for metric in self._metrics.values())


class ServerMetrics:
    """Every metric the server exports, by role. The scheduler and the sessions update them."""

    def __init__(self) -> None:
        self.registry = r = Registry()
        self.active_sessions = r.register(Gauge("streamer_active_sessions", "Sessions currently open."))
        self.sessions_total = r.register(Counter("streamer_sessions_total", "Sessions accepted since start."))
        self.admission_rejections = r.register(
            Counter("streamer_admission_rejections_total", "Sessions refused because the server was at capacity.")
        )
        self.queue_depth = r.register(
            Gauge("streamer_queue_depth", "Streams with a window waiting for the engine (not the running batch).")
        )
        self.batches = r.register(Counter("streamer_batches_total", "Batches the engine decoded."))
        self.batch_failures = r.register(Counter("streamer_batch_failures_total", "Batches whose decode raised."))
        self.windows_retried = r.register(
            Counter("streamer_windows_retried_total", "Windows decoded again alone because their batch raised.")
        )
        self.windows = r.register(Counter("streamer_windows_total", "Windows the engine decoded."))
        self.engine_busy_seconds = r.register(
            Counter("streamer_engine_busy_seconds_total", "Wall time the engine spent decoding.")
        )
        self.audio_received = r.register(
            Counter("streamer_audio_seconds_received_total", "Seconds of audio received, summed over channels.")
        )
        self.audio_transcribed = r.register(
            Counter("streamer_audio_seconds_transcribed_total", "Seconds of audio committed in finals.")
        )
        self.real_time_factor = r.register(
            Gauge(
                "streamer_real_time_factor",
                "Engine busy seconds per second of audio received (below 1 keeps up with real time).",
                function=self._real_time_factor,
            )
        )
        self.partial_latency = r.register(
            Histogram("streamer_partial_latency_seconds", "From the arrival of the audio to sending a partial.")
        )
        self.final_latency = r.register(
            Histogram("streamer_final_latency_seconds", "From the arrival of the audio to sending a final.")
        )
        self.batch_size = r.register(
            Histogram("streamer_batch_size", "Windows per engine call.", buckets=BATCH_SIZE_BUCKETS)
        )
        self.batch_seconds = r.register(
            Histogram("streamer_batch_seconds", "Wall time of one engine call.", buckets=STAGE_BUCKETS)
        )
        # DecodeResult.timings: the engine's own per-window share of each stage (windows answered from the cache,
        # which cost nothing, are not observed)
        self.features_seconds = r.register(
            Histogram("streamer_features_seconds", "Log-mel features, per window.", buckets=STAGE_BUCKETS)
        )
        self.encoder_seconds = r.register(
            Histogram("streamer_encoder_seconds", "Encoder forward pass, per window.", buckets=STAGE_BUCKETS)
        )
        self.decoder_seconds = r.register(
            Histogram("streamer_decoder_seconds", "Decoding (every decoder pass), per window.", buckets=STAGE_BUCKETS)
        )
        self.gpu_memory = r.register(
            Gauge(
                "streamer_gpu_memory_allocated_bytes",
                "GPU memory held by the engine's tensors (no sample without a GPU in use).",
                function=gpu_memory_allocated,
            )
        )

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

    def render(self) -> str:
        return self.registry.render()


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
