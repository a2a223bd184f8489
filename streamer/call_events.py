"""``/v1/calls/{callSid}/events``: follow one call's transcript live, read-only.

The follower gets JSON text frames, each a :class:`~streamer.hub.CallEvent` (``call_started``, then
``speech_started``, ``partial``, ``final``, ``gap`` per track, and last ``call_ended``), then close 1000. A late
follower first gets the call's history (``call_started`` and the finals so far). The follower may send nothing:
any frame gets ``bad_message`` and close 4400. A follower that does not keep up is cut with ``slow_reader`` (4408),
and one whose call sends nothing for ``follower_idle_timeout`` seconds (not started yet, or silent) with
``idle_timeout`` (4408). Credentials, origin and the follower's admission slot (``--max-followers``) are the server
runner's (:mod:`streamer.routes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamer.auth import ANONYMOUS, Principal
from streamer.errors import IdleTimeout, MalformedMessage, ProtocolError, ServerShutdown, SlowReader
from streamer.hub import CallHub, SubscriberOverflow, Subscription
from streamer.protocol import ErrorMessage, serialize

__all__ = ["CALL_EVENTS_PATH", "CallEventsSession", "call_sid_from_path"]

logger = logging.getLogger(__name__)

CALL_EVENTS_PATH = "/v1/calls/{call_sid}/events"
_PATH = re.compile(r"^/v1/calls/([A-Za-z0-9][A-Za-z0-9_.-]{0,63})/events$")


def call_sid_from_path(path: str) -> str | None:
    """The call id of an events path (query string excluded), or None if ``path`` is not one."""
    match = _PATH.match(path)
    return match.group(1) if match else None


class CallEventsSession:
    """Serve one follower; :meth:`run` is the whole story, :meth:`shutdown` ends it with 1001."""

    def __init__(self, ws: ServerConnection, hub: CallHub, call_sid: str) -> None:
        self.ws = ws
        # who follows (set by the server's runner)
        self.owner: Principal = ANONYMOUS
        self.hub = hub
        self.call_sid = call_sid
        self._stop: asyncio.Future[ProtocolError] = asyncio.get_running_loop().create_future()

    def shutdown(self) -> None:
        if not self._stop.done():
            self._stop.set_result(ServerShutdown("the server is shutting down"))

    async def run(self) -> None:
        """Forward the call's events until ``call_ended`` (close 1000), a frame from the follower (4400), the
        follower falling behind (4408), the follower leaving, or shutdown (1001). Never raises."""
        subscription = self.hub.subscribe(self.call_sid)
        forwarding = asyncio.ensure_future(self._forward(subscription))
        listening = asyncio.ensure_future(self.ws.recv())
        try:
            waiting: set[asyncio.Future[Any]] = {forwarding, listening, self._stop}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if forwarding in done:
                error = forwarding.result()
            elif listening in done:
                if listening.exception() is not None:  # the follower left
                    return
                error = MalformedMessage("this socket is read-only: send nothing but a close")
            else:
                error = self._stop.result()
            with contextlib.suppress(ConnectionClosed):
                if error is None:
                    await self.ws.close(1000, "call ended")
                else:
                    await self.ws.send(serialize(ErrorMessage(code=error.code, message=error.message)))
                    await self.ws.close(error.close_code, error.code)
        finally:
            for task in (forwarding, listening):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, Exception):
                    await task
            self.hub.unsubscribe(subscription)

    async def _forward(self, subscription: Subscription) -> ProtocolError | None:
        idle = self.hub.options.follower_idle_timeout
        events = aiter(subscription)
        try:
            while True:
                try:
                    async with asyncio.timeout(idle):
                        event = await anext(events)
                except StopAsyncIteration:
                    return None
                except TimeoutError:
                    return IdleTimeout(f"no event of call {self.call_sid} for {idle:g} s")
                await self.ws.send(json.dumps(event.to_dict()))
        except SubscriberOverflow as overflow:
            logger.warning("event=follower_overflow call=%s", self.call_sid)
            return SlowReader(str(overflow))
        except ConnectionClosed:
            return None  # the follower left; run() sees it too
        return None
