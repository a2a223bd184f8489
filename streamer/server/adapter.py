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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from streamer.server.auth import ANONYMOUS, Principal

__all__ = ["FLUSH_GAVE_UP", "LOST", "Adapter", "Close", "FlushBound", "SendLimits", "SessionLog", "session_log"]


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


@dataclass
class FlushBound:
    """How long an ended stream waits for the last transcripts of the audio it received: for as long as the engine
    keeps accounting for that audio. Each ``timeout`` seconds, the bound looks at how much of the stream is accounted
    for (its finals, non-speech and lost spans, in samples): more than at the last look, and it waits another
    ``timeout``; no more, and the stream gives up on the rest (which its adapter reports lost). So a replica that is
    busy but working through the backlog finishes every stream, however long its tail takes, and an engine that
    stopped answering costs a stream between ``timeout`` and twice that after its last progress. The wait is bounded
    by what was received: each extension needs a sample accounted for that was not before. A server shutdown caps it
    (:meth:`cap`): the process waits for its sessions for a bounded time, and a stream must say what it gave up on
    before that time runs out.

    Sans-I/O, like its owner: :meth:`start` when the stream ends, :attr:`deadline` for the runner's timer, and at
    that time :meth:`expired`, with the stream's accounted samples each time."""

    # seconds the engine may go without accounting for any more of an ended stream's audio
    timeout: float
    # when the stream ended (on the clock of ``now``)
    ended: float = 0.0
    # when to look next, and when to give up whatever the progress (a shutdown's cap; infinity: none)
    next_look: float = 0.0
    limit: float = math.inf
    # samples accounted for at the last look
    accounted: int = 0
    # how many times the bound moved on (for the log)
    extensions: int = 0

    @property
    def deadline(self) -> float:
        """When the owner's timer should call :meth:`expired` next."""
        return min(self.next_look, self.limit)

    def start(self, now: float, accounted: int) -> None:
        """The stream ended at ``now`` with ``accounted`` samples accounted for: the first look is ``timeout`` on."""
        self.ended = now
        self.next_look = now + self.timeout
        self.accounted = accounted
        self.extensions = 0

    def cap(self, until: float) -> None:
        """Give up at ``until`` at the latest, progress or not (the earliest cap stands). Call on shutdown, with
        ``now + timeout``: the server waits for its sessions longer than that (see ``ServerConfig.shutdown_wait``)."""
        self.limit = min(self.limit, until)

    def expired(self, now: float, accounted: int) -> bool:
        """Call at the timer with the stream's accounted samples: True when the stream should give up now (the cap
        has come, or the next look has and nothing more was accounted for since the last); otherwise the next look
        moves on if it had come."""
        if now >= self.limit:
            return True
        if now < self.next_look:
            return False
        if accounted <= self.accounted:
            return True
        self.accounted = accounted
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
        self._outgoing: deque[str] = deque()
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
        count = len(self._outgoing) if limit is None else min(limit, len(self._outgoing))
        return [self._outgoing.popleft() for _ in range(count)]

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
        self._outgoing.append(frame)

    def _close_with(self, code: int, reason: str) -> None:
        """Decide how the connection ends (the first decision stands), and wake the runner to act on it."""
        if self._close is None:
            self._close = Close(code, reason)
            self.wakeup()
