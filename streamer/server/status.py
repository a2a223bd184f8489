"""``GET /status``: what the server is doing right now, as JSON, for ``streamer top`` and for people.

Unlike ``/metrics`` (totals and histograms since start, for Prometheus), this is a snapshot: every live session
with its age, audio, lag and latency, and the engine's recent load and queue. Its shape (``docs/operations.md``)::

    {"model": "tiny.en", "ready": true, "draining": false, "uptime_seconds": 812.4,
     "engine": {"load": 0.31, "real_time_factor": 0.08, "queue_depth": 1, "active_sessions": 3,
                "max_sessions": 16, "batches": 5120, "gpu_memory_bytes": null},
     "sessions": [{"id": "3f9a1c0b2e4d", "kind": "listen", "age_seconds": 42.1, "channels": 1,
                   "audio_seconds": 41.9, "lag_seconds": 0.3, "uncommitted_seconds": 1.2,
                   "partial_latency_ms": {"p50": 380.2, "p95": 610.0},
                   "final_latency_ms": {"p50": 720.4, "p95": 1010.9}}]}

``lag_seconds`` is speech received that no decode has covered yet (how far the engine is behind this stream);
``uncommitted_seconds`` is audio received that no final, non-speech span or lost range accounts for yet.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "EngineSnapshot",
    "LatencyPercentiles",
    "LoadMeter",
    "Observable",
    "SessionSnapshot",
    "StatusReport",
    "latency_percentiles",
]

# the engine's load is measured over (about) this many seconds of recent wall time
LOAD_WINDOW_SECONDS = 10.0


@dataclass(frozen=True)
class LatencyPercentiles:
    """Milliseconds; None when nothing was measured."""

    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class SessionSnapshot:
    """One live session, as ``/status`` shows it."""

    # the id sent in `ready` and logged with every record of the session
    id: str
    # which endpoint: listen (/v1/listen), twilio, realtime
    kind: str
    # wall-clock seconds since the handshake
    age_seconds: float
    channels: int
    # seconds of audio received, summed over channels
    audio_seconds: float
    # speech received that no decode has covered yet, summed over channels
    lag_seconds: float
    # audio received that nothing accounts for yet (the utterance in progress, mostly), summed over channels
    uncommitted_seconds: float
    partial_latency_ms: LatencyPercentiles
    final_latency_ms: LatencyPercentiles


@runtime_checkable
class Observable(Protocol):
    """A session that can describe itself for ``/status``."""

    def snapshot(self, now: float) -> SessionSnapshot:
        """The session as of ``now`` (``time.monotonic()``)."""
        ...


@dataclass(frozen=True)
class EngineSnapshot:
    # fraction of recent wall time the engine spent decoding (1.0: saturated; queues grow beyond it)
    load: float
    # engine seconds per second of audio since start (streamer_real_time_factor)
    real_time_factor: float
    # streams with a window waiting for the engine
    queue_depth: int
    active_sessions: int
    max_sessions: int
    # engine calls since start
    batches: int
    # bytes held on the GPU, None without one
    gpu_memory_bytes: int | None


@dataclass(frozen=True)
class StatusReport:
    """The body of ``GET /status``."""

    model: str
    # serving /v1/listen (what /readyz says)
    ready: bool
    # shutting down: finishing the sessions it has, taking no new ones
    draining: bool
    uptime_seconds: float
    # None until the model is loaded
    engine: EngineSnapshot | None
    sessions: tuple[SessionSnapshot, ...]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> StatusReport:
        """Parse a ``/status`` body (``streamer top``); raise ValueError if it is not one."""
        try:
            data = json.loads(text)
            engine = data["engine"]
            return cls(
                model=str(data["model"]),
                ready=bool(data["ready"]),
                draining=bool(data["draining"]),
                uptime_seconds=float(data["uptime_seconds"]),
                engine=None if engine is None else EngineSnapshot(**engine),
                sessions=tuple(
                    SessionSnapshot(
                        **{
                            **session,
                            "partial_latency_ms": LatencyPercentiles(**session["partial_latency_ms"]),
                            "final_latency_ms": LatencyPercentiles(**session["final_latency_ms"]),
                        }
                    )
                    for session in data["sessions"]
                ),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a /status report: {error}") from error


def latency_percentiles(values: Iterable[float]) -> LatencyPercentiles:
    """p50 and p95 of latencies in milliseconds, rounded to 0.1 ms."""
    from streamer.server.metrics import percentile

    ordered = list(values)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return LatencyPercentiles(p50=ms(percentile(ordered, 50)), p95=ms(percentile(ordered, 95)))


class LoadMeter:
    """The engine's recent load from a running total of busy seconds: call :meth:`sample` with the total and the
    time at each status request; the load is measured against the oldest sample within the window."""

    def __init__(self, started: float, window: float = LOAD_WINDOW_SECONDS) -> None:
        self.window = window
        self._samples: deque[tuple[float, float]] = deque([(started, 0.0)])

    def sample(self, now: float, busy_seconds: float) -> float:
        """Record the total at ``now`` and return the fraction of time busy since the oldest sample kept."""
        # keep one sample at least ``window`` old, so the measurement always spans (about) the window
        while len(self._samples) > 1 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        then, busy_then = self._samples[0]
        self._samples.append((now, busy_seconds))
        elapsed = now - then
        if elapsed <= 0:
            return 0.0
        return round(min(1.0, max(0.0, (busy_seconds - busy_then) / elapsed)), 3)
