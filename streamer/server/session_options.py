"""The limits of one ``/v1/listen`` session (also the session limits Deepgram's endpoint takes), and its id."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import NewType

from streamer.core.errors import ConfigError
from streamer.server.ratelimit import RateLimitOptions

__all__ = ["SessionId", "SessionOptions", "new_session_id"]

SessionId = NewType("SessionId", str)


def new_session_id() -> SessionId:
    return SessionId(secrets.token_hex(6))


@dataclass(frozen=True)
class SessionOptions:
    """Limits of one session. Validated in :meth:`validate`."""

    # binary frames larger than this get frame_too_large (close 1009); 1 MiB is 2.7 s of 48 kHz stereo float32
    max_frame_bytes: int = 1 << 20
    # seconds without any frame (audio or keepalive) before idle_timeout (close 4408)
    idle_timeout: float = 10.0
    # wall-clock seconds a session may last before session_too_long (close 4408)
    max_session_seconds: float = 4 * 3600.0
    # messages waiting for a slow reader; stale partials are dropped first, then the session closes (slow_reader)
    send_buffer: int = 256
    # the kernel's send buffer of the connection (SO_SNDBUF), in bytes: without a bound, Linux grows it to megabytes
    # and a reader that stopped reading is noticed only once that much is queued; 0 leaves the kernel's default
    socket_send_buffer: int = 128 * 1024
    # once a stream has ended, seconds the engine may go without progress (none of the stream's audio accounted for,
    # no window of any stream decoded) before the rest is reported lost (FlushBound: it waits while the engine works);
    # also how long the queued messages get to go out before the close. The server's one flush bound: /twilio,
    # /v1/realtime and Deepgram's get it too
    flush_timeout: float = 10.0
    # a message the connection cannot take for this long (its buffers full: the client stopped reading) ends the
    # session with slow_reader (4408); the count-based send_buffer catches a reader that is slow but alive
    slow_reader_seconds: float = 10.0
    # how fast a client may send audio (a burst, then a multiple of real time); faster gets rate_limited (4429)
    rate_limit: RateLimitOptions = field(default_factory=RateLimitOptions)
    # seconds a session whose connection dropped waits for the client to resume it; 0 ends it at once
    resume_grace_seconds: float = 30.0
    # finals kept for a resuming client (the newest; older ones it surely received). Finals made while it is away
    # (the grace period) plus those in flight when the connection dropped: a few dozen. Each kept final holds its
    # words, so this bounds what a long session keeps (1000 held about 2 MB per session, growing for an hour)
    resume_finals: int = 200

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.max_frame_bytes < 4:
            raise ConfigError("max_frame_bytes must be at least 4")
        for name in ("idle_timeout", "max_session_seconds", "flush_timeout", "slow_reader_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.send_buffer < 2:
            raise ConfigError("send_buffer must be at least 2")
        if self.socket_send_buffer < 0:
            raise ConfigError("socket_send_buffer must be >= 0")
        if self.resume_grace_seconds < 0:
            raise ConfigError("resume_grace_seconds must be >= 0")
        if self.resume_finals < 1:
            raise ConfigError("resume_finals must be at least 1")
        self.rate_limit.validate()
