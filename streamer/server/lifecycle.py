"""The story every transcribing stream tells, whatever its protocol: ``/v1/listen``
(:class:`~streamer.server.session.Session`), and ``/twilio``, ``/v1/realtime`` and Deepgram's ``/deepgram/v1/listen``
(:class:`~streamer.integrations.transcriber.TranscribingAdapter`).

1. Frames until :meth:`StreamLifecycle._end`: the client ends the stream, a frame breaks a rule, the stream is idle
   for ``idle_timeout`` seconds, it outlasts ``max_session_seconds``, the reader is too slow, or the server stops.
2. No more audio: the cores finish their last events (:meth:`~StreamLifecycle._drain`) while the engine makes progress
   (:class:`~streamer.server.adapter.FlushBound`: ``flush_timeout`` seconds without any gives up, and what is left is
   named lost, :meth:`~StreamLifecycle._give_up`).
3. The last word and the close (:meth:`~StreamLifecycle._finish`), once every core has said all it will.

Sans-I/O like every adapter (:mod:`streamer.server.adapter`): the clock is an argument; the subclass says how its
protocol feeds the cores and what its last word is.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from enum import Enum

from streamer.core.errors import ConfigError, IdleTimeout, ProtocolError, ServerShutdown, SessionTooLong
from streamer.server.adapter import Adapter, FlushBound, SessionLog

__all__ = ["Phase", "StreamLifecycle", "StreamLimits"]


class Phase(Enum):
    """Where a stream is in its story."""

    RECEIVING = "receiving"  # frames flow until the client ends the stream, an error, idleness or shutdown
    DRAINING = "draining"  # no more audio; the cores finish the last events while they make progress (FlushBound)
    PARKED = "parked"  # /v1/listen: the connection dropped mid-stream, the session waits for a resume
    CLOSED = "closed"  # the last word is said; the close is decided


@dataclass(frozen=True)
class StreamLimits:
    """The timers of a stream's story. Validated on construction."""

    # seconds without any frame (audio or keepalive) before the stream ends with the protocol's idle error
    idle_timeout: float
    # once the stream has ended, seconds the engine may go without progress before the rest is reported lost
    flush_timeout: float
    # wall-clock seconds a stream may last before session_too_long; None: no bound (a call lasts as long as it lasts)
    max_session_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.idle_timeout <= 0 or self.flush_timeout <= 0:
            raise ConfigError("idle_timeout and flush_timeout must be > 0")
        if self.max_session_seconds is not None and self.max_session_seconds <= 0:
            raise ConfigError("max_session_seconds must be > 0")


class StreamLifecycle(Adapter):
    """The story of the module docstring, as the runner drives it (timer, shutdown, reading, deadlines).

    Subclasses call :meth:`_note_frame` on each frame (and handle it only while it returns True), call :meth:`_end`
    when the stream ends and :meth:`_finish_if_drained` after their cores' events, implement the hooks below, and
    set :attr:`kind`, :attr:`id` and :attr:`_log` (the flush's give-up is logged as ``<kind>=<id>``).
    """

    # how the log names the endpoint's streams ("session=<id> event=...")
    kind = "stream"
    id: str
    _log: SessionLog

    def __init__(self, limits: StreamLimits, now: float) -> None:
        super().__init__()
        self.phase = Phase.RECEIVING
        self.limits = limits
        self._opened = now
        self._last_frame = now
        # why the stream ended (None: the client ended it), and how long its last events may take
        self._error: ProtocolError | None = None
        self._flush = FlushBound(limits.flush_timeout)

    # -- what the protocol says -------------------------------------------------------------------------------------

    @abstractmethod
    def _idle_error(self) -> IdleTimeout:
        """What a stream idle for ``idle_timeout`` seconds is told."""

    def _too_long_error(self) -> SessionTooLong:
        """What a stream that outlasts ``max_session_seconds`` is told."""
        return SessionTooLong(f"sessions may last at most {self.limits.max_session_seconds:g} s")

    @abstractmethod
    def _progress(self) -> int:
        """What the flush bound watches: samples accounted for over every channel, and the engine's outcomes (it
        grows while the engine works, on this stream or another)."""

    @abstractmethod
    def _backlog_seconds(self) -> float:
        """Seconds of audio, over every channel, that no event has accounted for yet."""

    @abstractmethod
    def _drain(self, now: float) -> None:
        """2. No more audio: the decoders' and resamplers' last samples, then the end of every core."""

    @abstractmethod
    def _drained(self) -> bool:
        """Whether every core has said all it will (no event follows)."""

    @abstractmethod
    def _give_up(self, now: float) -> None:
        """The flush bound ran out: what no event accounted for is named lost, and the cores are let go of."""

    @abstractmethod
    def _finish(self) -> None:
        """3. The last events are in (or the flush gave up): say the last word, set :attr:`phase` to ``CLOSED`` and
        decide the close."""

    # -- the runner's calls -----------------------------------------------------------------------------------------

    def receive_timer(self, now: float) -> None:
        if self.phase is Phase.RECEIVING:
            max_seconds = self.limits.max_session_seconds
            if now >= self._last_frame + self.limits.idle_timeout:
                self._end(self._idle_error(), now)
            elif max_seconds is not None and now >= self._opened + max_seconds:
                self._end(self._too_long_error(), now)
        elif self.phase is Phase.DRAINING and self._flush.expired(now, self._progress()):
            # what the engine did not finish is named, as the engine's failures are
            self._log.warning(
                "%s=%s event=flush_timeout waited_s=%.1f extensions=%d lost_s=%.2f",
                self.kind,
                self.id,
                now - self._flush.ended,
                self._flush.extensions,
                self._backlog_seconds(),
            )
            self._give_up(now)
            self._finish()

    def receive_shutdown(self, now: float) -> None:
        """The server is stopping: stop receiving, the last events (for at most ``flush_timeout`` from now, progress or
        not: the server waits that long and a little more), then the close (1001)."""
        self._end(ServerShutdown("the server is shutting down"), now)
        self._flush.cap(now + self.limits.flush_timeout)  # a flush under way already is capped too

    @property
    def reading(self) -> bool:
        return self.phase is Phase.RECEIVING

    def next_deadline(self) -> float | None:
        if self.phase is Phase.RECEIVING:
            deadline = self._last_frame + self.limits.idle_timeout
            if self.limits.max_session_seconds is not None:
                deadline = min(deadline, self._opened + self.limits.max_session_seconds)
            return deadline
        if self.phase is Phase.DRAINING:
            return self._flush.deadline
        return None

    # -- the story --------------------------------------------------------------------------------------------------

    def _note_frame(self, now: float) -> bool:
        """1. A frame came at ``now``: True while the stream receives (the caller then handles it), else False."""
        if self.phase is not Phase.RECEIVING:
            return False
        self._last_frame = now
        return True

    def _end(self, error: ProtocolError | None, now: float) -> None:
        """No more audio (``error`` says why; None: the client ended it): 2. drain, then 3. the last word once the
        cores are done, which may be at once. Only while receiving; later calls are ignored."""
        if self.phase is not Phase.RECEIVING:
            return
        self._error = error
        self.phase = Phase.DRAINING
        self._flush.start(now, self._progress(), self._backlog_seconds())
        self._drain(now)
        self._finish_if_drained()

    def _finish_if_drained(self) -> None:
        """3. The last word, if the stream is draining and every core has said all it will. Call after the cores'
        events."""
        if self.phase is Phase.DRAINING and self._drained():
            self._finish()
