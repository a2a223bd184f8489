"""A call made of several Twilio Media Streams, published to the hub as one sequence of events.

A call may stream more than once: one ``<Stream>`` per track (``inbound_track`` on one connection,
``outbound_track`` on another), a stream restarted after ``<Stop><Stream>``, a new stream after a transfer. Each
arrives on its own ``/twilio`` connection (:class:`~streamer.integrations.twilio_session.TwilioSession`) with its own
``streamSid``, and all of them name the same ``callSid``. :class:`TwilioCalls` merges them:

- **Streams** are keyed by ``streamSid``. A stream may join a live call if none of its tracks is being streamed by
  another live stream of the call; the same track twice at once is refused with
  :class:`~streamer.core.errors.TrackInUse` (``track_in_use``, close 4409), and the first stream goes on.
- **Events**: ``call_started`` once, before the first stream's ``stream_started``; each stream then publishes
  ``stream_started``, its transcript events and ``stream_ended``. ``seq`` is the hub's, one sequence per call.
  Segment ids are unique per track over the whole call: a later stream's ids on a track continue after the earlier
  streams'. Times are seconds from the start of the call's first stream: each stream's own media clock (Twilio's
  ``timestamp``, from 0 per stream) shifted by when it started after the first one, on the server's clock.
- **The end of a call**: once its last live stream has ended, the call waits ``grace`` seconds for another stream
  (the restart after ``<Stop><Stream>``, the other track's stream starting late, the leg after a transfer); if none
  comes, ``call_ended`` is published, with the statistics of every stream summed per track, and the call id cannot
  stream again. A stream ended by the server's shutdown ends its call at once (no stream can come any more), and so
  does :meth:`TwilioCalls.close`.

Like :class:`~streamer.server.resume.ResumeRegistry`, it never reads the clock: the grace period is a ``call_later``
timer, and the caller passes ``now`` (the server's monotonic clock) to :meth:`TwilioCalls.open`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamer.core.errors import MalformedMessage, ServerShutdown, TrackInUse
from streamer.integrations.hub import CallEvent, CallEventType, CallHub
from streamer.integrations.twilio import Start, TrackName, TrackStats
from streamer.server.resume import CallLater, Timer

__all__ = ["CallStream", "TwilioCalls"]

logger = logging.getLogger(__name__)


@dataclass
class _Call:
    call_sid: str
    started_at: float  # the server's clock when the first stream started: time 0 of the call's events
    live: dict[str, CallStream] = field(default_factory=dict)  # by streamSid
    # per track: statistics summed over the streams that ended, and the next free segment id
    stats: dict[str, TrackStats] = field(default_factory=dict)
    next_segment: dict[str, int] = field(default_factory=dict)
    streams: list[str] = field(default_factory=list)  # every streamSid, in the order they started
    reason: str = "stopped"  # why the last stream ended
    timer: Timer | None = None  # the grace period, once no stream is live


class CallStream:
    """One stream's place in its call: :meth:`publish` its events (stream-local times and segment ids), then
    :meth:`end` it once. Made by :meth:`TwilioCalls.open`."""

    def __init__(self, calls: TwilioCalls, call: _Call, start: Start, labels: Mapping[TrackName, str], now: float):
        self._calls = calls
        self._call = call
        self.call_sid = start.call_sid
        self.stream_sid = start.stream_sid
        self.labels = dict(labels)
        # where this stream's time 0 lies on the call's clock
        self.offset = round(now - call.started_at, 3)
        # this stream's segment ids on each track start after the ids the call's earlier streams used there
        self._segment_base = {track.value: call.next_segment.get(track.value, 0) for track in start.tracks}
        self.ended = False

    def label(self, track: TrackName) -> str:
        """Who speaks on ``track`` in this stream (a DTMF on a track the stream does not carry: the default)."""
        return self.labels.get(track, track.label)

    def publish(self, event: CallEvent) -> None:
        """Publish one of the stream's events: its times move onto the call's clock, its segment id into the call's
        ids of that track."""
        if self.ended:
            return
        changes: dict[str, Any] = {}
        if event.start is not None:
            changes["start"] = round(event.start + self.offset, 3)
        if event.end is not None:
            changes["end"] = round(event.end + self.offset, 3)
        if event.segment_id is not None and event.track is not None:
            segment = self._segment_base[event.track] + event.segment_id
            next_free = self._call.next_segment
            next_free[event.track] = max(next_free.get(event.track, 0), segment + 1)
            changes["segment_id"] = segment
        self._calls.hub.publish(dataclasses.replace(event, **changes) if changes else event)

    def end(self, reason: str, stats: Mapping[TrackName, TrackStats]) -> None:
        """The stream is over (stop, hang-up, error, shutdown): ``stream_ended`` with its statistics; the call ends
        after the grace period if this was its last live stream. Idempotent."""
        if self.ended:
            return
        self.ended = True
        call = self._call
        del call.live[self.stream_sid]
        call.reason = reason
        for track, counts in stats.items():
            total = call.stats.setdefault(track.value, TrackStats())
            for name, value in dataclasses.asdict(counts).items():
                setattr(total, name, getattr(total, name) + value)
        data = {"stream_sid": self.stream_sid, "reason": reason, "tracks": _asdict(stats)}
        self._calls.hub.publish(CallEvent(CallEventType.STREAM_ENDED, self.call_sid, data=data))
        if not call.live:
            self._calls.last_stream_ended(call, at_once=reason == ServerShutdown.code)


def _asdict(stats: Mapping[TrackName, TrackStats] | Mapping[str, TrackStats]) -> dict[str, dict[str, int]]:
    return {str(track): dataclasses.asdict(counts) for track, counts in stats.items()}


class TwilioCalls:
    """The live calls of one server. Call on the event loop thread only. ``call_later`` schedules each grace
    period's end; by default the running loop's (tests pass one whose time they move)."""

    def __init__(self, hub: CallHub, grace: float, call_later: CallLater | None = None) -> None:
        self.hub = hub
        self.grace = grace
        self._call_later = call_later
        self._calls: dict[str, _Call] = {}

    def __contains__(self, call_sid: object) -> bool:
        """Whether ``call_sid`` is live: streaming, or waiting for another stream."""
        return call_sid in self._calls

    def open(self, start: Start, labels: Mapping[TrackName, str], now: float) -> CallStream:
        """A stream's ``start``: the stream joins its call (``call_started`` first for a new call), and
        ``stream_started`` is published. Raises :class:`~streamer.core.errors.TrackInUse` when a live stream of
        the call carries one of its tracks, :class:`~streamer.core.errors.MalformedMessage` when the call has ended
        (after its grace period) or the ``streamSid`` is live already."""
        call = self._calls.get(start.call_sid)
        if call is None:
            if self.hub.has_started(start.call_sid):
                raise MalformedMessage(f"call {start.call_sid} has ended; a new stream cannot join it")
            call = self._calls[start.call_sid] = _Call(start.call_sid, now)
        if start.stream_sid in call.live:
            raise MalformedMessage(f"stream {start.stream_sid} of call {start.call_sid} is already live")
        busy = {track: sid for sid, stream in call.live.items() for track in stream.labels}
        taken = [track for track in start.tracks if track in busy]
        if taken:
            raise TrackInUse(
                f"call {start.call_sid} is already streaming its {taken[0].value} track (stream {busy[taken[0]]}); "
                "a track may be streamed by one stream at a time"
            )
        if call.timer is not None:  # the call waited for this stream
            call.timer.cancel()
            call.timer = None
        stream = CallStream(self, call, start, labels, now)
        call.live[start.stream_sid] = stream
        call.streams.append(start.stream_sid)
        data: dict[str, Any] = {
            "stream_sid": start.stream_sid,
            "account_sid": start.account_sid,
            "tracks": {track.value: label for track, label in stream.labels.items()},
            "custom_parameters": dict(start.custom_parameters),
            "offset": stream.offset,
        }
        if len(call.streams) == 1:
            self.hub.publish(CallEvent(CallEventType.CALL_STARTED, start.call_sid, data=data))
        self.hub.publish(CallEvent(CallEventType.STREAM_STARTED, start.call_sid, data=data))
        return stream

    def last_stream_ended(self, call: _Call, at_once: bool) -> None:
        """The call has no live stream: wait ``grace`` seconds for another (unless ``at_once``), then end it."""
        if at_once or self.grace <= 0:
            self._end(call.call_sid)
            return
        call_later = self._call_later or asyncio.get_running_loop().call_later
        call.timer = call_later(self.grace, self._end, call.call_sid)

    def close(self) -> None:
        """The server is stopping: end every call waiting for a stream now (none can come)."""
        for call_sid, call in list(self._calls.items()):
            if not call.live:
                self._end(call_sid)

    def _end(self, call_sid: str) -> None:
        call = self._calls.get(call_sid)
        if call is None or call.live:
            return
        del self._calls[call_sid]
        if call.timer is not None:
            call.timer.cancel()
        data = {"reason": call.reason, "tracks": _asdict(call.stats), "streams": call.streams}
        self.hub.publish(CallEvent(CallEventType.CALL_ENDED, call_sid, data=data))
        logger.info("event=call_ended call=%s streams=%d reason=%s", call_sid, len(call.streams), call.reason)
