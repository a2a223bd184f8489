"""``/v1/calls/{callSid}/events``: follow one call's transcript live, read-only.

The follower gets JSON text frames, each a :class:`~streamer.integrations.hub.CallEvent` (``call_started``, then for
each of the call's streams ``stream_started``, ``speech_started``, ``partial``, ``final``, ``gap``, ``dtmf``,
``mark`` and ``stream_ended``, and last ``call_ended``), then close 1000. A late follower first gets the call's
history (what is never superseded: ``call_started``, the streams' starts and ends, finals, gaps, keys and marks).
The follower may send nothing: any frame gets ``bad_message`` and close 4400. A follower that does not keep up is
cut with ``slow_reader`` (4408), and one whose call sends nothing for ``follower_idle_timeout`` seconds (not started
yet, or silent) with ``idle_timeout`` (4408). Credentials, origin and the follower's admission slot
(``--max-followers``) are the server runner's (:mod:`streamer.server.routes`).

:class:`CallEventsSession` is the endpoint's sans-I/O adapter (:mod:`streamer.server.adapter`): the hub's events go into
its subscription's bounded queue, and the runner takes them out as fast as the follower reads.
"""

from __future__ import annotations

import json
import logging
import re

from streamer.core.errors import IdleTimeout, MalformedMessage, ProtocolError, ServerShutdown, SlowReader
from streamer.integrations.hub import CallHub, SubscriberOverflow, Subscription
from streamer.server.adapter import LOST, Adapter
from streamer.server.server_messages import ErrorMessage, serialize

__all__ = ["CALL_EVENTS_PATH", "CallEventsSession", "call_sid_from_path"]

logger = logging.getLogger(__name__)

CALL_EVENTS_PATH = "/v1/calls/{call_sid}/events"
_PATH = re.compile(r"^/v1/calls/([A-Za-z0-9][A-Za-z0-9_.-]{0,63})/events$")


def call_sid_from_path(path: str) -> str | None:
    """The call id of an events path (query string excluded), or None if ``path`` is not one."""
    match = _PATH.match(path)
    return match.group(1) if match else None


class CallEventsSession(Adapter):
    """One follower of ``call_sid``, subscribed to the hub from construction (at ``now``) until :meth:`release`.

    It ends with close 1000 after ``call_ended``, 4400 for a frame from the follower, 4408 for a follower that fell
    behind or a call idle for ``follower_idle_timeout``, 1001 on shutdown, or quietly when the follower leaves.
    """

    def __init__(self, hub: CallHub, call_sid: str, now: float) -> None:
        super().__init__()
        self.hub = hub
        self.call_sid = call_sid
        self.idle_timeout = hub.options.follower_idle_timeout
        # when the follower last got (or had waiting) an event of its call: the idle timeout counts from here
        self._last_event = now
        self._subscription: Subscription | None = hub.subscribe(call_sid, self._on_event)

    # -- inputs -----------------------------------------------------------------------------------------------------

    def receive_text(self, frame: str, now: float) -> None:
        self._fail(MalformedMessage("this socket is read-only: send nothing but a close"))

    def receive_bytes(self, frame: bytes, now: float) -> None:
        self._fail(MalformedMessage("this socket is read-only: send nothing but a close"))

    def receive_timer(self, now: float) -> None:
        if self._subscription is None or now < self._last_event + self.idle_timeout:
            return
        if self._subscription.queue:
            self._last_event = now  # events wait for a follower that reads slowly: the call is not idle
            return
        self._fail(IdleTimeout(f"no event of call {self.call_sid} for {self.idle_timeout:g} s"))

    def receive_shutdown(self, now: float) -> None:
        self._fail(ServerShutdown("the server is shutting down"))

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        self.release()
        self._close_with(LOST.code, LOST.reason)

    # -- outputs ----------------------------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        return None if self._subscription is None else self._last_event + self.idle_timeout

    def messages_to_send(self, now: float, limit: int | None = None) -> list[str]:
        """The call's events in order, then the error that ended the follow, if any."""
        frames = self._take(now, limit)
        more = None if limit is None else limit - len(frames)
        return frames + super().messages_to_send(now, more)

    def release(self) -> None:
        """Unsubscribe from the hub (idempotent)."""
        if self._subscription is not None:
            self.hub.unsubscribe(self._subscription)
            self._subscription = None

    # -- the end ----------------------------------------------------------------------------------------------------

    def _on_event(self) -> None:
        self.wakeup()

    def _take(self, now: float, limit: int | None = None) -> list[str]:
        """Up to ``limit`` events from the subscription, as frames; the follow ends after ``call_ended``, or with
        slow_reader when the follower fell too far behind."""
        frames: list[str] = []
        while self._subscription is not None and (limit is None or len(frames) < limit):
            try:
                event = self._subscription.take()
            except SubscriberOverflow as overflow:
                logger.warning("event=follower_overflow call=%s", self.call_sid)
                self._fail(SlowReader(str(overflow)))
                break
            if event is None:
                break
            self._last_event = now
            frames.append(json.dumps(event.to_dict()))
            if self._subscription.finished:
                self.release()
                self._close_with(1000, "call ended")
        return frames

    def _fail(self, error: ProtocolError) -> None:
        """End the follow: the events already queued for the follower, the error, then its close code."""
        if self.close_action() is not None:
            return
        if not isinstance(error, SlowReader):
            for frame in self._take(self._last_event):
                self._queue(frame)
            if self.close_action() is not None:  # call_ended was among them: the follow ended by itself
                return
        self.release()
        self._queue(serialize(ErrorMessage(code=error.code, message=error.message)))
        self._close_with(error.close_code, error.code)
