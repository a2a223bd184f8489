"""The shape every WebSocket endpoint's protocol takes: a sans-I/O adapter between frames and the stream cores.

Like :class:`~streamer.core.stream.StreamCore` (and python-websockets' ``protocol.py``), an adapter never awaits, never
touches a socket and never reads the clock: the connection runner (:class:`streamer.server.runner.Connection`) feeds it
what happened, with the time it happened, and does what it says::

    adapter.receive_text(frame, now)          # a text frame from the client
    adapter.receive_bytes(frame, now)         # a binary frame
    adapter.receive_timer(now)                # the time given by next_deadline() has come
    adapter.receive_shutdown(now)             # the server is stopping
    adapter.receive_connection_lost(now, dropped=True)
    adapter.receive_send_timeout(now)         # a frame could not go out in send_limits.send_timeout seconds

    adapter.messages_to_send(now, limit=1)    # text frames to send, oldest first
    adapter.close_action()                    # None while serving; then the close the runner performs
    adapter.next_deadline()                   # when to call receive_timer (None: no timer)
    adapter.reading                           # whether the runner should read more frames

Engine and hub outcomes (a decode result, an event of a followed call) reach an adapter through the scheduler's or
the hub's callbacks, outside these calls; the adapter then calls :attr:`Adapter.wakeup` so that the runner looks at
its outputs again.

Every call above is a plain method, so an adapter is tested with strings, bytes and numbers for ``now``, without an
event loop or a socket.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from streamer.server.auth import ANONYMOUS, Principal
from streamer.server.outbox import Outbox

__all__ = [
    "FLUSH_CEILING_FLOOR_SECONDS",
    "FLUSH_CEILING_PER_SECOND",
    "FLUSH_GAVE_UP",
    "LOST",
    "Adapter",
    "Close",
    "FlushBound",
    "SendLimits",
    "SessionLog",
    "session_log",
]


@dataclass(frozen=True)
class Close:
    """How the connection ends: the close code and reason the runner sends once every queued message went out."""

    code: int
    reason: str


# the close action of an adapter whose connection is gone: nothing can be sent, the runner's work is over (1006 is
# the code RFC 6455 reserves for a connection that closed without a close frame; it never goes on the wire)
LOST = Close(1006, "connection lost")


@dataclass(frozen=True)
class SendLimits:
    """How the runner sends an adapter's messages. Each adapter's options decide them."""

    # seconds one frame may wait for the connection's buffers to drain (the client stopped reading) before the
    # runner calls receive_send_timeout and sends nothing more; None: no bound
    send_timeout: float | None = None
    # seconds the queued messages get to go out once the adapter has a close action; then the close goes regardless
    flush_timeout: float = 10.0
    # the kernel's send buffer of the connection (SO_SNDBUF), in bytes; 0 leaves the kernel's default
    socket_send_buffer: int = 0


# why the audio of an ended stream that the engine did not finish is lost, when the flush bound gives up on it
FLUSH_GAVE_UP = "the engine did not finish this audio in time"


# the most an ended stream waits for its last transcripts, per second of its audio not yet accounted for when it
# ended (beyond one flush_timeout): a ceiling that only a core that never finishes reaches. The engine finishes a
# stream's backlog at several times real time even when it is shared; at 16 streams each gets about a sixteenth of
# it, which on a CPU that decodes windows at 0.1 times real time is still under 2 s per second of audio
FLUSH_CEILING_PER_SECOND = 10.0
# ... counting at least this many seconds left, however few are: a stream that ends a fraction of a second short still
# waits for its turn behind every other stream's windows, which depends on the load and not on its tail (with the
# tail alone, one that ended 0.3 s short would be given up on after 13 s, however busy the engine was with the streams
# ahead of it). One turn is at most one window of Whisper's 30 s, and 300 s covers many rotations of a full replica;
# the ceiling still grows with what is left and not with the stream's length, so a stuck core holds an hour-long call
# for minutes, not hours
FLUSH_CEILING_FLOOR_SECONDS = 30.0


@dataclass
class FlushBound:
    """How long an ended stream waits for the last transcripts of the audio it received: for as long as the engine
    is making progress. Each ``timeout`` seconds the bound looks at a progress marker the owner passes, which grows
    when the stream accounts for more of its audio (a final, a non-speech or a lost span) or when the engine hands
    back any window's outcome (it is alive, and the scheduler's rotation comes to every stream): grown since the last
    look, and it waits another ``timeout``; not, and the stream gives up on the rest (which its adapter reports lost).
    So a replica that is busy but working through its backlog finishes every stream, however long the tail takes
    (a window of a long utterance may commit nothing until the next one agrees with it, and under load a stream's
    next turn may be many seconds away), and an engine that stopped answering costs a stream between ``timeout`` and
    twice that. Two bounds hold whatever the progress: :data:`FLUSH_CEILING_PER_SECOND` per second of the stream's
    unaccounted audio (counting at least :data:`FLUSH_CEILING_FLOOR_SECONDS`, for the wait for a turn), so the wait is
    linear in what was received, and a server shutdown's cap (:meth:`cap`), so the stream says what it gave up on
    before the process stops waiting for it.

    Sans-I/O, like its owner: :meth:`start` when the stream ends, :attr:`deadline` for the runner's timer, and at
    that time :meth:`expired`, with the progress marker each time."""

    # seconds the engine may go without progress before an ended stream gives up on the rest
    timeout: float
    # when the stream ended (on the clock of ``now``)
    ended: float = 0.0
    # when to look next, and when to give up whatever the progress (the ceiling, or a shutdown's cap)
    next_look: float = 0.0
    limit: float = math.inf
    # the progress marker at the last look
    progress: int = 0
    # how many times the bound moved on (for the log)
    extensions: int = 0

    @property
    def deadline(self) -> float:
        """When the owner's timer should call :meth:`expired` next."""
        return min(self.next_look, self.limit)

    def start(self, now: float, progress: int, backlog_seconds: float) -> None:
        """The stream ended at ``now`` with ``backlog_seconds`` of its audio, over all its channels, not yet accounted
        for: the first look is ``timeout`` on, and the ceiling :data:`FLUSH_CEILING_PER_SECOND` times the backlog (at
        least :data:`FLUSH_CEILING_FLOOR_SECONDS`) after that."""
        self.ended = now
        self.next_look = now + self.timeout
        self.limit = self.next_look + FLUSH_CEILING_PER_SECOND * max(FLUSH_CEILING_FLOOR_SECONDS, backlog_seconds)
        self.progress = progress
        self.extensions = 0

    def cap(self, until: float) -> None:
        """Give up at ``until`` at the latest, progress or not (the earliest bound stands). Call on shutdown, with
        ``now + timeout``, after :meth:`start`: the server waits for its sessions longer than that (see
        ``ServerConfig.shutdown_wait``)."""
        self.limit = min(self.limit, until)

    def expired(self, now: float, progress: int) -> bool:
        """Call at the timer with the progress marker: True when the stream should give up now (a bound has come,
        or the next look has and the marker has not grown since the last); otherwise the next look moves on if it
        had come."""
        if now >= self.limit:
            return True
        if now < self.next_look:
            return False
        if progress <= self.progress:
            return True
        self.progress = progress
        self.next_look = now + self.timeout
        self.extensions += 1
        return False


SessionLog = logging.LoggerAdapter[logging.Logger]


def session_log(logger: logging.Logger, session_id: str) -> SessionLog:
    """``logger``, with every record carrying ``session_id`` (:mod:`streamer.server.logs`) whatever task logs it: an
    adapter is called from its connection's task, and from the scheduler's with decode results."""
    return logging.LoggerAdapter(logger, {"session_id": session_id})


def _nothing() -> None:
    return None


class Adapter(ABC):
    """The base of the endpoints' adapters: a queue of text frames, the close action, the runner's wakeup.

    Subclasses implement the ``receive_*`` inputs of their protocol and :meth:`next_deadline`; they queue frames
    with :meth:`_queue` and end with :meth:`_close_with`. Construct one per connection once the runner has applied
    the route's policy; the runner then owns it until :meth:`release`.
    """

    send_limits = SendLimits()

    def __init__(self) -> None:
        # who opened the connection (the runner sets it once credentials are checked)
        self.owner: Principal = ANONYMOUS
        # called when engine or hub outcomes changed what the adapter has to say (the runner replaces it)
        self.wakeup: Callable[[], None] = _nothing
        # what the client has not read yet; unbounded unless the subclass bounds it (streamer.server.outbox)
        self._outgoing: Outbox[str] = Outbox(None)
        self._close: Close | None = None

    # -- inputs -----------------------------------------------------------------------------------------------------

    @abstractmethod
    def receive_text(self, frame: str, now: float) -> None: ...

    @abstractmethod
    def receive_bytes(self, frame: bytes, now: float) -> None: ...

    @abstractmethod
    def receive_timer(self, now: float) -> None:
        """Call when ``now`` has reached :meth:`next_deadline` (calling earlier does nothing). The adapter moves its
        deadline past ``now``, or clears it."""

    @abstractmethod
    def receive_shutdown(self, now: float) -> None: ...

    @abstractmethod
    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        """The connection closed: ``dropped`` when it broke without the client's close frame (a network fault,
        which a client may recover from), False when the client closed it or the server closed it for a protocol
        violation. Nothing more can be sent; the adapter still ends with a close action."""

    def receive_send_timeout(self, now: float) -> None:
        """A frame could not go out within :attr:`send_limits` ``.send_timeout``: the adapter decides how the
        connection ends and may queue its last words (why); the runner writes those behind what the connection's
        buffers hold, without waiting for them to drain, then closes. Only called when that bound is set."""
        raise NotImplementedError

    # -- outputs ----------------------------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When to call :meth:`receive_timer` (on the clock of ``now``); None: no timer is pending."""
        return None

    @property
    def reading(self) -> bool:
        """Whether the runner should read frames: until the adapter has decided how the connection ends."""
        return self._close is None

    def messages_to_send(self, now: float, limit: int | None = None) -> list[str]:
        """Take up to ``limit`` queued text frames (all by default), oldest first, as they read at ``now``. The
        runner takes one at a time, as fast as the client reads: what it has not taken stays queued here."""
        return self._outgoing.take(limit)

    def close_action(self) -> Close | None:
        """None while the connection is served; then how it ends. The runner stops reading, sends what is queued,
        closes with it (unless the connection is lost already) and calls :meth:`release`."""
        return self._close

    @abstractmethod
    def release(self) -> None:
        """Let go of everything the adapter holds (scheduler slots, subscriptions). The runner calls it once, when
        the connection's run ends, whatever happened."""

    # -- for subclasses ---------------------------------------------------------------------------------------------

    def _queue(self, frame: str) -> None:
        """Queue ``frame``; raise :class:`~streamer.core.errors.SlowReader` when a bounded outbox is full."""
        self._outgoing.put(frame)

    def _close_with(self, code: int, reason: str) -> None:
        """Decide how the connection ends (the first decision stands), and wake the runner to act on it."""
        if self._close is None:
            self._close = Close(code, reason)
            self.wakeup()
