"""The call hub across replicas: every call's events in a Redis Stream, so that a follower on any replica sees a call
streaming into any other (``streamer serve --redis``).

:class:`RedisCallHub` is the in-process :class:`~streamer.integrations.hub.CallHub` (local followers, sinks, bounds)
plus two things. Each event of a call streaming into this process is appended to the stream
``<prefix>call:<callSid>`` (``XADD``, through the link's bounded queue: the call never waits on Redis), which the
replica that holds the call claims with ``<prefix>call:<callSid>:owner`` (set if absent: a second stream of the same
call on another replica, a replayed Twilio stream, is refused, see :meth:`claimed_elsewhere`). And a follower of a
call this process does not hold starts a relay: the stream read from its start (``XRANGE``: ``call_started``, the
finals and gaps so far, as for a late follower here), then followed live (``XREAD BLOCK`` from the last id read),
each event handed to the local followers with the seq its replica gave it.

Why Redis Streams and not pub/sub: a stream keeps the call's history, so a follower that joins late (or on a
replica that was not subscribed when the call began) gets the finals so far from Redis itself; and a relay that lost
Redis for a while reads on from its last id, missing nothing the stream still holds. Pub/sub delivers only to
those listening at the instant of publication. The stream is capped (``MAXLEN ~``) and expires ``retention``
seconds after its last event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from streamer.integrations.hub import CallEvent, CallEventType, CallHub, HubOptions, Subscription
from streamer.server.redis_link import RedisLink, connect

__all__ = ["RedisCallHub"]

logger = logging.getLogger(__name__)

# KEYS: the call's stream, its owner. ARGV: this replica, the retention in seconds, the stream's cap, the event.
# 0: another replica holds the call (nothing appended).
_APPEND = """
local owner = redis.call('GET', KEYS[2])
if not owner then
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
  owner = ARGV[1]
end
if owner ~= ARGV[1] then return 0 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# milliseconds a relay's XREAD waits for new events before it asks again
_BLOCK_MS = 1000


class RedisCallHub(CallHub):
    """See the module docstring. Relays run on the event loop; :meth:`close` stops them."""

    def __init__(self, options: HubOptions, link: RedisLink, retention: float = 3600.0) -> None:
        super().__init__(options)
        self.link = link
        self.retention = max(1, int(retention))
        # a stream holds partials too: room for several per final
        self.maxlen = 10 * options.history
        self._append = link.client.register_script(_APPEND)
        # relays block on XREAD: a client of their own, whose timeout allows for the block
        assert link.options.url is not None
        self._reader = connect(link.options.url, _BLOCK_MS / 1000 + link.options.command_timeout)
        self._relays: dict[str, asyncio.Task[None]] = {}
        self._elsewhere: set[str] = set()

    def _keys(self, call_sid: str) -> list[str]:
        stream = self.link.key("call", call_sid)
        return [stream, stream + ":owner"]

    def claimed_elsewhere(self, call_sid: str) -> bool:
        """Whether Redis said that another replica holds ``call_sid`` (its events are not appended from here)."""
        return call_sid in self._elsewhere

    def publish(self, event: CallEvent) -> CallEvent:
        numbered = super().publish(event)
        if numbered.call_sid in self._elsewhere:
            return numbered
        keys = self._keys(numbered.call_sid)
        payload = json.dumps(numbered.to_dict(), separators=(",", ":"))
        args = [self.link.replica, self.retention, self.maxlen, payload]

        async def append(client: Any) -> None:
            if not int(await self._append(keys=keys, args=args)):
                if numbered.call_sid not in self._elsewhere:
                    logger.warning("event=call_claimed_elsewhere call=%s", numbered.call_sid)
                self._elsewhere.add(numbered.call_sid)

        self.link.submit(append)
        return numbered

    def subscribe(self, call_sid: str, notify: Any = None) -> Subscription:
        subscription = super().subscribe(call_sid, notify)
        topic = self._topics.get(call_sid)
        if topic is not None and not topic.local and not topic.ended and call_sid not in self._relays:
            self._relays[call_sid] = asyncio.get_running_loop().create_task(self._relay(call_sid))
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        super().unsubscribe(subscription)
        call_sid = subscription.call_sid
        if not self.subscribers(call_sid) and call_sid in self._relays:
            self._relays.pop(call_sid).cancel()

    async def close(self) -> None:
        """Stop every relay and close the reader's connections."""
        relays = list(self._relays.values())
        self._relays.clear()
        for relay in relays:
            relay.cancel()
        for relay in relays:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay
        with contextlib.suppress(Exception):
            await self._reader.aclose()

    async def _relay(self, call_sid: str) -> None:
        """Hand ``call_sid``'s events from Redis to the local followers until ``call_ended`` (or no follower is
        left). While Redis is down the followers wait; the relay reads on from its last id once it is back."""
        stream = self._keys(call_sid)[0]
        last: str | None = None
        try:
            while True:
                try:
                    if last is None:  # 1. the call's history, as a late follower gets it
                        entries = await self._reader.xrange(stream, "-", "+")
                        backlog = True
                    else:  # 2. then live, from the last event read
                        answer = await self._reader.xread({stream: last}, block=_BLOCK_MS)
                        entries = answer[0][1] if answer else []
                        backlog = False
                except Exception as error:  # Redis down or slow: the followers wait, the relay tries again
                    logger.info("event=relay_waiting call=%s reason=%r", call_sid, type(error).__name__)
                    await asyncio.sleep(self.link.options.retry_seconds)
                    continue
                last = entries[-1][0] if entries else (last or "0-0")
                for _, fields in entries:
                    event = _event(fields.get("e", ""))
                    if event is None:
                        continue
                    self.relay(event, backlog)
                    if event.type is CallEventType.CALL_ENDED:
                        return
        finally:
            if self._relays.get(call_sid) is asyncio.current_task():
                del self._relays[call_sid]


def _event(text: str) -> CallEvent | None:
    """The event an :data:`_APPEND` wrote, or None if the entry is not one (it is skipped)."""
    try:
        data = json.loads(text)
        data["type"] = CallEventType(data["type"])
        return CallEvent(**data)
    except (ValueError, KeyError, TypeError):
        return None
