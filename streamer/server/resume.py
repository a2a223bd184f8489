"""Sessions that outlive their connection: parked for a grace period, waiting for the client to resume them.

When a ``/v1/listen`` connection drops mid-stream (a network change, a proxy restart, a reset), the session keeps its
stream cores, its place with the scheduler and the finals the client may not have received, and parks itself here.
A client that reconnects within ``grace_seconds`` with ``?resume=<session_id>&last_seq=<n>`` claims it back
(:meth:`ResumeRegistry.claim`) and receives every final after ``n``; when the grace period ends unclaimed, the
registry expires the session, which then lets go of everything.

Resume works within one process: the registry is in memory, so a restarted server or a sibling replica knows
nothing of the session (the client starts a new one; see ``docs/protocol.md``).

The registry never reads the clock itself: expiry is a ``loop.call_later`` timer, and the registry takes the
``call_later`` to use as an argument, so that tests move time themselves instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from streamer.core.errors import UnknownSession
from streamer.server.auth import ANONYMOUS, Principal

__all__ = ["CallLater", "Parkable", "ResumeRegistry", "Timer"]

logger = logging.getLogger(__name__)


class Parkable(Protocol):
    """A session as the registry sees it (:class:`streamer.server.session.Session`)."""

    @property
    def id(self) -> str: ...

    @property
    def owner(self) -> Principal:
        """Who opened the session: only that principal (or an admin) may resume it."""
        ...

    def check_resume(self, last_seq: int) -> None:
        """Raise :class:`~streamer.core.errors.UnknownSession` if the finals after ``last_seq`` cannot all be
        replayed."""
        ...

    def expire(self) -> None:
        """The grace period is over (or the server stops): let go of the cores and the scheduler; never raises."""
        ...


class Timer(Protocol):
    """A pending call, as ``loop.call_later`` returns it (:class:`asyncio.TimerHandle`)."""

    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[str], None], str], Timer]
"""``loop.call_later(delay, callback, session_id)``: call ``callback(session_id)`` ``delay`` seconds from now."""


class ResumeRegistry:
    """The parked sessions of one server. Call on the event loop thread only. ``call_later`` schedules each grace
    period's end; by default the running loop's (tests pass one whose time they move)."""

    def __init__(self, call_later: CallLater | None = None) -> None:
        self._call_later = call_later
        self._parked: dict[str, tuple[Parkable, Timer]] = {}
        self.resumed = 0  # sessions claimed back, for the logs and tests
        self.expired = 0  # sessions whose grace period ended unclaimed

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._parked

    def park(self, session: Parkable, grace_seconds: float, limit: int | None = None) -> None:
        """Keep ``session`` for ``grace_seconds``; then call its :meth:`~Parkable.expire` unless claimed. With
        ``limit``, the oldest parked sessions expire first so that no more than ``limit`` are kept."""
        if session.id in self._parked:
            return
        while limit is not None and self._parked and len(self._parked) >= limit:
            self._expire(next(iter(self._parked)))
        call_later = self._call_later or asyncio.get_running_loop().call_later
        timer = call_later(grace_seconds, self._expire, session.id)
        self._parked[session.id] = (session, timer)
        logger.info("session=%s event=parked grace_s=%g", session.id, grace_seconds)

    def claim(self, session_id: str, last_seq: int, principal: Principal = ANONYMOUS) -> Parkable:
        """Take a parked session back for a new connection; raise :class:`~streamer.core.errors.UnknownSession` when
        there is none by that id (never was, already resumed, or expired), it belongs to another principal than
        ``principal`` (answered the same, so that ids say nothing to those who do not own them), or it cannot
        replay from ``last_seq``; the session then stays parked. The caller attaches the connection at once."""
        entry = self._parked.get(session_id)
        if entry is None or not principal.owns(entry[0].owner):
            raise UnknownSession("no session to resume by that id: it ended, expired, or was resumed already")
        session, timer = entry
        session.check_resume(last_seq)
        del self._parked[session_id]
        timer.cancel()
        self.resumed += 1
        return session

    def close(self) -> None:
        """The server is stopping: expire every parked session now (nobody could resume them after the stop)."""
        for session_id in list(self._parked):
            self._expire(session_id)

    def _expire(self, session_id: str) -> None:
        entry = self._parked.pop(session_id, None)
        if entry is None:
            return
        session, timer = entry
        timer.cancel()
        self.expired += 1
        session.expire()
