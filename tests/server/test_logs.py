from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.server import logs
from tests.helpers import WORDS, chunks, config, exchange, pcm16, speech


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The streamer loggers, at INFO, into a JSON handler (as `streamer serve --log-format json` sets them up)."""
    stream = io.StringIO()
    root = logging.getLogger("streamer")
    handler = logging.StreamHandler(stream)
    host = logging.getLogger("streamer-test-host")
    host.addHandler(handler)
    logs.configure("json", host)
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield stream
    root.setLevel(level)
    root.removeHandler(handler)
    host.removeHandler(handler)


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line_with_the_session_id_when_there_is_one(json_log: io.StringIO) -> None:
    log = logging.getLogger("streamer.example")
    log.info("outside")
    token = logs.SESSION_ID.set("3f9a1c0b2e4d")
    try:
        log.warning("inside %s", "a session")
    finally:
        logs.SESSION_ID.reset(token)
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        log.exception("failed")
    outside, inside, failed = records(json_log)
    assert set(outside) == {"ts", "level", "logger", "message"}
    assert outside["logger"] == "streamer.example" and outside["level"] == "info"
    assert str(outside["ts"]).endswith("Z") and "T" in str(outside["ts"])
    assert inside["message"] == "inside a session" and inside["level"] == "warning"
    assert inside["session_id"] == "3f9a1c0b2e4d"
    assert "ValueError: bad\nvalue" in str(failed["exception"])


def test_text_leaves_the_handlers_alone_and_other_formats_are_refused() -> None:
    logger = logging.getLogger("streamer-test-text")
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    formatter = handler.formatter
    logs.configure("text", logger)
    assert handler.formatter is formatter
    with pytest.raises(ValueError, match="text, json"):
        logs.configure("yaml", logger)
    logger.removeHandler(handler)


async def test_every_record_of_a_session_carries_its_id(json_log: io.StringIO) -> None:
    async with App(config(), ScriptedEngine(WORDS)) as srv:
        messages, _ = await exchange(srv, [*chunks(pcm16(speech())), '{"type":"end"}'])
    session_id = messages[0]["session_id"]
    session_records = [r for r in records(json_log) if r["logger"] == "streamer.server.session"]
    assert {"event=open", "event=closed"} <= {str(r["message"]).split()[1] for r in session_records}
    assert all(r["session_id"] == session_id for r in session_records)
    # the server's own records (listening, shutdown) belong to no session
    assert all("session_id" not in r for r in records(json_log) if r["logger"] == "streamer.server.serve")
