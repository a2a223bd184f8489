"""How fast a client may send audio: a token bucket counted in stream time.

A live source produces one second of audio per second. A client may send faster for a while (a file streamed
with ``streamer stream --speed 0``, a reconnecting browser replaying what no final covered, a test), so the bucket
starts full with ``burst_seconds`` of audio and refills at ``max_rate`` seconds of audio per wall-clock second.
A client that empties it has sent more than ``burst_seconds`` ahead of ``max_rate`` times real time: it is
refused with :class:`~streamer.core.errors.RateLimited` (close 4429) before the frame is decoded, so a flood costs the
server neither decoding nor engine time.

Sans-I/O: the clock is an argument (``now``, seconds of any monotonic clock); the session reads it.

Units: the bucket holds 16 kHz samples (stream time, :data:`~streamer.core.units.SAMPLE_RATE`), whatever the client's
rate; a frame of ``n`` samples per channel at ``rate`` Hz costs ``n * SAMPLE_RATE / rate`` of them, once for all
channels (a stereo second is one second of stream time).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamer.core.errors import ConfigError, RateLimited
from streamer.core.units import SAMPLE_RATE

__all__ = ["AudioRateLimiter", "RateLimitOptions"]


@dataclass(frozen=True)
class RateLimitOptions:
    """The audio rate limit of one session. Validated in :meth:`validate`."""

    # sustained audio rate, in seconds of audio per wall-clock second (2.0 = twice real time); 0 turns the limit off
    max_rate: float = 2.0
    # seconds of audio a client may send ahead of that rate at any moment (covers sending a short clip at once)
    burst_seconds: float = 60.0

    @property
    def enabled(self) -> bool:
        return self.max_rate > 0

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.max_rate < 0:
            raise ConfigError("max_audio_rate must be >= 0 (0 turns the limit off)")
        if self.enabled and self.max_rate < 1:
            raise ConfigError("max_audio_rate must be at least 1 (real time), or 0 to turn the limit off")
        if self.burst_seconds <= 0:
            raise ConfigError("audio_burst_seconds must be > 0")


class AudioRateLimiter:
    """One session's bucket. Call :meth:`receive` with every audio frame's size before decoding it."""

    def __init__(self, options: RateLimitOptions, now: float) -> None:
        options.validate()
        self.options = options
        self._capacity = options.burst_seconds * SAMPLE_RATE
        self._tokens = self._capacity  # full: a new session may send its burst at once
        self._refilled_at = now

    def receive(self, frames: int, sample_rate: int, now: float) -> None:
        """Take ``frames`` samples per channel at ``sample_rate`` Hz out of the bucket, or raise
        :class:`~streamer.core.errors.RateLimited` (and take nothing) when they do not fit. The caller closes the
        session on the error; it must not feed the frame to the decoder."""
        if not self.options.enabled:
            return
        elapsed = max(0.0, now - self._refilled_at)
        self._tokens = min(self._capacity, self._tokens + elapsed * self.options.max_rate * SAMPLE_RATE)
        self._refilled_at = now
        cost = frames * SAMPLE_RATE / sample_rate
        if cost > self._tokens:
            raise RateLimited(
                f"audio arrives faster than {self.options.max_rate:g} times real time "
                f"beyond a burst of {self.options.burst_seconds:g} s; pace it"
            )
        self._tokens -= cost
