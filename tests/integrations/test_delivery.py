from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamer.app import App
from streamer.core.errors import ConfigError
from streamer.engine.fake import ScriptedEngine
from streamer.integrations.call_centre import CallCentre, CallCentreOptions
from streamer.integrations.delivery import DeliveryOptions, JsonLinesSink, WebhookMetrics, WebhookSink, signature_header
from streamer.integrations.hub import CallEvent, CallEventType, CallHub
from streamer.integrations.twilio import TrackName, recorded_messages
from streamer.integrations.twilio_session import TwilioOptions
from streamer.server.metrics import ServerMetrics
from streamer.server.serve import ServerConfig
from tests.helpers import WORDS, http_get, until
from tests.integrations.test_twilio_session import stream, voice_8k
from tests.server.test_metrics import samples, value

SECRET = "s3cret-shared-with-the-receiver"


@dataclass
class Receiver:
    """A local HTTP server that answers 503 to the first ``failures`` requests, then 204."""

    failures: int = 0
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers["content-length"]))
        self.requests.append((headers, body))
        status = "503 Service Unavailable" if len(self.requests) <= self.failures else "204 No Content"
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver(failures=2)
    server = await asyncio.start_server(r.handle, "127.0.0.1", 0)
    r.port = server.sockets[0].getsockname()[1]
    async with server:
        yield r


def options(port: int, **kw: object) -> DeliveryOptions:
    base: dict[str, object] = {
        "webhook_url": f"http://127.0.0.1:{port}/hook",
        "webhook_secret": SECRET,
        "initial_backoff": 0.01,
        "max_backoff": 0.05,
    }
    return DeliveryOptions(**(base | kw))  # type: ignore[arg-type]


def call(hub: CallHub, sid: str, *texts: str) -> None:
    hub.publish(CallEvent(CallEventType.CALL_STARTED, sid))
    hub.publish(CallEvent(CallEventType.PARTIAL, sid, text="not delivered"))
    for text in texts:
        hub.publish(CallEvent(CallEventType.FINAL, sid, track="inbound", text=text))
    hub.publish(CallEvent(CallEventType.CALL_ENDED, sid))


async def test_webhook_retries_with_backoff_and_signs_every_body(receiver: Receiver) -> None:
    hub = CallHub()
    sink = WebhookSink(options(receiver.port))
    hub.add_listener(sink)
    sink.start()
    call(hub, "CA1", "hello", "world")
    async with asyncio.timeout(30):  # a hang guard
        await sink.wait_idle()
    await sink.stop()
    # the receiver was down for the first two attempts: nothing lost, nothing out of order
    delivered = [json.loads(body) for _, body in receiver.requests[2:]]
    assert [d["type"] for d in delivered] == ["final", "final", "call_ended"]
    assert [d.get("text") for d in delivered] == ["hello", "world", None]
    assert sink.stats.delivered == 3 and sink.stats.attempts == 5 and sink.stats.dropped == 0
    for headers, body in receiver.requests:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["x-streamer-signature"] == expected == signature_header(SECRET, body)
    # retries of one event carry the same delivery id, for de-duplication
    ids = [h["x-streamer-delivery"] for h, _ in receiver.requests]
    assert ids[0] == ids[1] == ids[2] == "CA1-3"


async def test_webhook_gives_up_after_max_attempts_and_counts(receiver: Receiver) -> None:
    receiver.failures = 100
    sink = WebhookSink(options(receiver.port, max_attempts=3))
    sink.start()
    sink(CallEvent(CallEventType.FINAL, "CA1", seq=1, text="x"))
    async with asyncio.timeout(30):  # a hang guard
        await sink.wait_idle()
    await sink.stop()
    assert sink.stats.given_up == 1 and sink.stats.attempts == 3 and sink.stats.delivered == 0
    text = ServerMetrics().render(WebhookMetrics(sink))
    assert value(text, "streamer_webhook_events_total", outcome="given_up") == 1
    assert value(text, "streamer_webhook_attempts_total", result="failed") == 3
    assert value(text, "streamer_webhook_attempts_total", result="ok") == 0


async def test_full_queue_drops_the_oldest_and_counts() -> None:
    integrations = CallCentre(CallCentreOptions(delivery=options(9, max_queue=2)))  # never started: all queue
    integrations.hub.publish(CallEvent(CallEventType.CALL_STARTED, "CA1"))  # not delivered
    for seq in range(1, 5):
        integrations.hub.publish(CallEvent(CallEventType.FINAL, "CA1", seq=seq, text=str(seq)))
    sink = integrations.webhook
    assert sink is not None and sink.stats.dropped == 2
    text = ServerMetrics().render(integrations)
    assert value(text, "streamer_webhook_events_total", outcome="dropped") == 2
    assert value(text, "streamer_webhook_events_total", outcome="delivered") == 0
    assert value(text, "streamer_webhook_queue_depth") == 2
    await sink.stop(grace=0.01)


def test_no_webhook_no_webhook_metrics() -> None:
    text = ServerMetrics().render(CallCentre(CallCentreOptions()))
    assert not [name for name in samples(text) if name.startswith("streamer_webhook")]


async def test_a_calls_deliveries_are_counted_on_the_servers_metrics(receiver: Receiver) -> None:
    # a real call on /twilio, in which the caller presses 3; the receiver answers 503 twice, then 204
    centre = CallCentreOptions(delivery=options(receiver.port), twilio=TwilioOptions(call_end_grace=0.0))
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS), call_centre=centre) as srv:
        call = recorded_messages({TrackName.INBOUND: voice_8k(2.0)}, call_sid="CAm", dtmf={50: "3"})
        assert await stream(srv.port, call) == 1000
        await until(lambda: b"call_ended" in b"".join(body for _, body in receiver.requests[2:]))
        assert srv.call_centre.webhook is not None
        await srv.call_centre.webhook.wait_idle()
        status, _, text = await http_get(srv.port, "/metrics")
    assert status == 200
    delivered = len(receiver.requests) - 2
    assert delivered >= 3  # a final at least, the key, and call_ended
    types = [json.loads(body)["type"] for _, body in receiver.requests[2:]]
    assert types.count("dtmf") == 1 and types[-1] == "call_ended"
    [key] = [json.loads(body) for _, body in receiver.requests[2:] if json.loads(body)["type"] == "dtmf"]
    assert key["data"] == {"digit": "3"} and key["start"] == 1.0 and key["label"] == "customer"
    assert value(text, "streamer_webhook_events_total", outcome="delivered") == delivered
    assert value(text, "streamer_webhook_events_total", outcome="given_up") == 0
    assert value(text, "streamer_webhook_events_total", outcome="dropped") == 0
    assert value(text, "streamer_webhook_attempts_total", result="ok") == delivered
    assert value(text, "streamer_webhook_attempts_total", result="failed") == 2
    assert value(text, "streamer_webhook_queue_depth") == 0
    assert value(text, "streamer_sessions_total", route="twilio") == 1


async def test_unreachable_receiver_is_retried() -> None:
    sink = WebhookSink(options(1, max_attempts=2, timeout=0.5))  # nothing listens on port 1
    sink.start()
    sink(CallEvent(CallEventType.FINAL, "CA1", seq=1, text="x"))
    async with asyncio.timeout(30):  # a hang guard
        await sink.wait_idle()
    await sink.stop()
    assert sink.stats.attempts == 2 and sink.stats.given_up == 1


def test_keys_and_marks_are_delivered_with_the_finals_and_stream_events_are_not(tmp_path: Path) -> None:
    hub = CallHub()
    sink = JsonLinesSink(tmp_path)
    webhook = WebhookSink(options(1))  # not started: what it queues is what it would deliver
    hub.add_listener(sink)
    hub.add_listener(webhook)
    hub.publish(CallEvent(CallEventType.CALL_STARTED, "CA1"))
    hub.publish(CallEvent(CallEventType.STREAM_STARTED, "CA1", data={"stream_sid": "MZ1"}))
    hub.publish(CallEvent(CallEventType.FINAL, "CA1", track="inbound", text="press one"))
    hub.publish(CallEvent(CallEventType.DTMF, "CA1", track="inbound", start=2.5, data={"digit": "1"}))
    hub.publish(CallEvent(CallEventType.MARK, "CA1", start=3.0, data={"name": "menu played"}))
    hub.publish(CallEvent(CallEventType.STREAM_ENDED, "CA1", data={"stream_sid": "MZ1"}))
    hub.publish(CallEvent(CallEventType.CALL_ENDED, "CA1"))
    lines = [json.loads(line) for line in sink.path("CA1").read_text().splitlines()]
    assert [line["type"] for line in lines] == ["final", "dtmf", "mark", "call_ended"]
    assert lines[1]["data"] == {"digit": "1"} and lines[2]["data"] == {"name": "menu played"}
    assert webhook.queued == 4


def test_jsonl_files_per_call(tmp_path: Path) -> None:
    hub = CallHub()
    sink = JsonLinesSink(tmp_path / "calls")
    hub.add_listener(sink)
    call(hub, "CA1", "one", "two")
    call(hub, "../CA2", "three")
    lines = (tmp_path / "calls" / "CA1.jsonl").read_text().splitlines()
    assert [json.loads(line).get("text") for line in lines] == ["one", "two", None]
    assert sink.path("../CA2").parent == tmp_path / "calls"  # no escaping the directory
    assert sink.written == 5


@pytest.mark.parametrize(
    ("kw", "complaint"),
    [
        ({"webhook_url": "ftp://x/y", "webhook_secret": "k"}, "http"),
        ({"webhook_url": "http://x/y"}, "secret"),
        ({"max_queue": 0}, "max_queue"),
        ({"initial_backoff": 5.0, "max_backoff": 1.0}, "backoff"),
    ],
)
def test_options_are_validated(kw: dict[str, object], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        DeliveryOptions(**kw).validate()  # type: ignore[arg-type]
