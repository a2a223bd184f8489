"""Deliver every call's finals to call-centre systems: a signed webhook, and/or JSON-lines files per call.

Both are :class:`~streamer.integrations.hub.CallHub` listeners; they take ``final``, ``dtmf``, ``mark`` and
``call_ended`` events (the last marks the end of a call's transcript).

- **Webhook**: each event is POSTed as JSON to ``webhook_url``, with ``X-Streamer-Signature: sha256=<hex
  HMAC-SHA256 of the body, keyed with webhook_secret>`` (verify it before trusting the body) and
  ``X-Streamer-Delivery: <id>`` (stable across retries: receivers de-duplicate on it). Any 2xx is success;
  anything else, or no answer within ``timeout``, is retried with exponential backoff (``initial_backoff``
  doubling up to ``max_backoff``) for up to ``max_attempts`` attempts. Events go out one at a time in order, so a
  call's finals arrive in order. The queue is bounded (``max_queue``): when it is full the oldest event is dropped;
  drops and give-ups are counted in :attr:`DeliveryStats` and logged, and exported on ``GET /metrics``
  (``streamer_webhook_*``, :class:`streamer.server.metrics.WebhookMetrics`). Plain ``http://`` and ``https://`` with the
  standard library only.
- **JSON lines**: each event is appended as one line to ``<jsonl_dir>/<callSid>.jsonl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import ssl
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamer.core.errors import ConfigError
from streamer.integrations.hub import CallEvent, CallEventType

__all__ = [
    "DeliveryOptions",
    "DeliveryStats",
    "JsonLinesSink",
    "WebhookMetrics",
    "WebhookSink",
    "signature_header",
]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Streamer-Signature"
# the transcript and what the caller did (keys, marks), and the end of the call; partials and the streams' own
# starts and ends stay on the live socket
_DELIVERED = (CallEventType.FINAL, CallEventType.DTMF, CallEventType.MARK, CallEventType.CALL_ENDED)


@dataclass(frozen=True)
class DeliveryOptions:
    """Where finals go. Validated in :meth:`validate`."""

    # POST every final here (http:// or https://); None for no webhook
    webhook_url: str | None = None
    # key of the X-Streamer-Signature HMAC; required with a webhook
    webhook_secret: str | None = None
    # append every final to <dir>/<callSid>.jsonl; None for no files
    jsonl_dir: Path | None = None
    # events waiting for the webhook; beyond this the oldest is dropped (and counted)
    max_queue: int = 10000
    # attempts per event before it is given up (and counted)
    max_attempts: int = 8
    # seconds before the first retry, doubled after each failure up to max_backoff
    initial_backoff: float = 0.5
    max_backoff: float = 30.0
    # seconds for one attempt, connection included
    timeout: float = 10.0

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.webhook_url is not None:
            if urlsplit(self.webhook_url).scheme not in ("http", "https") or not urlsplit(self.webhook_url).hostname:
                raise ConfigError("the webhook URL must be http:// or https:// with a host")
            if not self.webhook_secret:
                raise ConfigError("a webhook needs a secret to sign its requests (--webhook-secret)")
        if self.max_queue < 1 or self.max_attempts < 1:
            raise ConfigError("delivery max_queue and max_attempts must be >= 1")
        if not 0 < self.initial_backoff <= self.max_backoff or self.timeout <= 0:
            raise ConfigError("delivery backoffs and timeout must be > 0, initial_backoff <= max_backoff")


@dataclass
class DeliveryStats:
    delivered: int = 0
    attempts: int = 0
    dropped: int = 0  # pushed out of a full queue
    given_up: int = 0  # failed max_attempts times


def signature_header(secret: str, body: bytes) -> str:
    """The ``X-Streamer-Signature`` value for ``body``: ``sha256=`` + hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class _Delivery:
    delivery_id: str
    body: bytes


class WebhookSink:
    """See the module docstring. :meth:`start` on the event loop, :meth:`__call__` from the hub, :meth:`stop`
    (which tries to deliver what is queued for up to ``grace`` seconds)."""

    def __init__(self, options: DeliveryOptions) -> None:
        options.validate()
        assert options.webhook_url is not None and options.webhook_secret is not None
        self.options = options
        self.url = options.webhook_url
        self.secret = options.webhook_secret
        self.stats = DeliveryStats()
        self._queue: deque[_Delivery] = deque()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def __call__(self, event: CallEvent) -> None:
        if event.type not in _DELIVERED:
            return
        if len(self._queue) >= self.options.max_queue:
            lost = self._queue.popleft()
            self.stats.dropped += 1
            logger.error("event=webhook_dropped delivery=%s queued=%d", lost.delivery_id, len(self._queue))
        body = json.dumps(event.to_dict()).encode()
        self._queue.append(_Delivery(f"{event.call_sid}-{event.seq}", body))
        self._idle.clear()
        self._wakeup.set()

    @property
    def queued(self) -> int:
        """Events waiting for delivery, the one being attempted included (``streamer_webhook_queue_depth``)."""
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="webhook-delivery")

    async def wait_idle(self) -> None:
        """Until the queue is empty (everything delivered, given up or dropped)."""
        await self._idle.wait()

    async def stop(self, grace: float = 5.0) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.wait_idle()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._queue:
            logger.error("event=webhook_undelivered count=%d", len(self._queue))

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            item = self._queue[0]
            delay = self.options.initial_backoff
            for attempt in range(1, self.options.max_attempts + 1):
                self.stats.attempts += 1
                error = await self._post(item)
                if error is None:
                    self.stats.delivered += 1
                    break
                logger.warning("event=webhook_retry delivery=%s attempt=%d error=%s", item.delivery_id, attempt, error)
                if attempt < self.options.max_attempts:
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, self.options.max_backoff)
            else:
                self.stats.given_up += 1
                logger.error("event=webhook_gave_up delivery=%s", item.delivery_id)
            if self._queue and self._queue[0] is item:  # it may have been pushed out while we retried
                self._queue.popleft()

    async def _post(self, item: _Delivery) -> str | None:
        """One attempt; None on a 2xx answer, else what went wrong."""
        parts = urlsplit(self.url)
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname or ""
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(item.body)}\r\n{SIGNATURE_HEADER}: {signature_header(self.secret, item.body)}\r\n"
            f"X-Streamer-Delivery: {item.delivery_id}\r\nUser-Agent: streamer\r\nConnection: close\r\n\r\n"
        )
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.options.timeout):
                context = ssl.create_default_context() if https else None
                reader, writer = await asyncio.open_connection(host, port, ssl=context)
                writer.write(head.encode() + item.body)
                await writer.drain()
                status_line = await reader.readline()
        except (OSError, TimeoutError) as error:
            return type(error).__name__
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        fields = status_line.decode("latin-1").split()
        if len(fields) < 2 or not fields[1].isdigit():
            return "no HTTP status"
        return None if 200 <= int(fields[1]) < 300 else f"HTTP {fields[1]}"


class JsonLinesSink:
    """Append each final (and ``call_ended``) to ``<dir>/<callSid>.jsonl``. Writes are small and local, so they
    happen on the event loop; a failing disk is logged, not raised."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.written = 0
        self.failed = 0
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, call_sid: str) -> Path:
        return self.directory / (re.sub(r"[^A-Za-z0-9_.-]", "_", call_sid) + ".jsonl")

    def __call__(self, event: CallEvent) -> None:
        if event.type not in _DELIVERED:
            return
        try:
            with self.path(event.call_sid).open("a", encoding="utf-8") as out:
                out.write(json.dumps(event.to_dict()) + "\n")
            self.written += 1
        except OSError:
            self.failed += 1
            logger.exception("event=jsonl_failed call=%s", event.call_sid)


class WebhookMetrics(Collector):
    """A webhook sink's delivery counters (:class:`DeliveryStats`) and queue, read at
    scrape time."""

    def __init__(self, sink: WebhookSink) -> None:
        self.sink = sink

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        stats = self.sink.stats
        events, attempts, queue = self._families()
        events.add_metric(["delivered"], stats.delivered)
        events.add_metric(["given_up"], stats.given_up)
        events.add_metric(["dropped"], stats.dropped)
        attempts.add_metric(["ok"], stats.delivered)  # an event is delivered by its one successful attempt
        attempts.add_metric(["failed"], stats.attempts - stats.delivered)
        queue.add_metric([], self.sink.queued)
        return [events, attempts, queue]

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
        return (
            CounterMetricFamily(
                "streamer_webhook_events",
                "Events that left the webhook queue: delivered, given up after max attempts, or dropped from a full "
                "queue.",
                labels=["outcome"],
            ),
            CounterMetricFamily(
                "streamer_webhook_attempts",
                "POSTs to the webhook: ok (2xx), or failed (another status, no answer, or cut off by shutdown).",
                labels=["result"],
            ),
            GaugeMetricFamily("streamer_webhook_queue_depth", "Events waiting for the webhook, the one in flight too."),
        )
