"""Every transcribing stream's story (:mod:`streamer.server.lifecycle`), driven with numbers for ``now``: frames until
the stream ends (the client, idleness, its length, shutdown), the last events while the engine makes progress, then
the last word, once."""

from __future__ import annotations

import logging

import pytest

from streamer.core.errors import ConfigError, IdleTimeout, ProtocolError
from streamer.server.adapter import session_log
from streamer.server.lifecycle import Phase, StreamLifecycle, StreamLimits


class Stream(StreamLifecycle):
    """A stream whose one core is a counter: each text frame is a sample; the test says when the core is done."""

    kind = "test"

    def __init__(self, limits: StreamLimits, now: float = 0.0) -> None:
        super().__init__(limits, now)
        self.id = "s1"
        self._log = session_log(logging.getLogger("tests.lifecycle"), self.id)
        self.received = self.accounted = self.outcomes = 0
        self.drained_at: float | None = None
        self.core_done = False
        self.gave_up: list[float] = []
        self.last_words: list[ProtocolError | None] = []

    def receive_text(self, frame: str, now: float) -> None:
        if not self._note_frame(now):
            return
        if frame == "end":
            self._end(None, now)
        else:
            self.received += 1

    def receive_bytes(self, frame: bytes, now: float) -> None:
        raise AssertionError("text only")

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        self.phase = Phase.CLOSED

    def release(self) -> None:
        pass

    def account(self, samples: int, done: bool = False) -> None:
        """The engine's events: ``samples`` more accounted for, and whether the core has said all it will."""
        self.accounted += samples
        self.core_done = done
        self._finish_if_drained()

    def _idle_error(self) -> IdleTimeout:
        return IdleTimeout("idle")

    def _progress(self) -> int:
        return self.accounted + self.outcomes

    def _backlog_seconds(self) -> float:
        return float(self.received - self.accounted)

    def _drain(self, now: float) -> None:
        self.drained_at = now

    def _drained(self) -> bool:
        return self.core_done

    def _give_up(self, now: float) -> None:
        self.gave_up.append(now)

    def _finish(self) -> None:
        self.last_words.append(self._error)
        self.phase = Phase.CLOSED
        self._close_with(1000 if self._error is None else self._error.close_code, "bye")


def test_limits_are_validated() -> None:
    with pytest.raises(ConfigError):
        StreamLimits(idle_timeout=0, flush_timeout=1)
    with pytest.raises(ConfigError):
        StreamLimits(idle_timeout=1, flush_timeout=1, max_session_seconds=0)


def test_the_client_ends_the_stream_and_the_last_word_waits_for_the_last_events() -> None:
    stream = Stream(StreamLimits(idle_timeout=10, flush_timeout=20))
    stream.receive_text("a", 1.0)
    stream.receive_text("end", 2.0)
    assert stream.phase is Phase.DRAINING and stream.drained_at == 2.0 and not stream.reading
    assert stream.next_deadline() == 22.0 and stream.last_words == []
    stream.receive_text("late", 3.0)  # nothing is read once the stream has ended
    assert stream.received == 1
    stream.account(1, done=True)
    assert stream.last_words == [None] and stream.phase is Phase.CLOSED and stream.next_deadline() is None
    stream.account(0, done=True)  # the last word is said once
    assert stream.last_words == [None]


def test_idleness_and_length_end_the_stream_whichever_comes_first() -> None:
    idle = Stream(StreamLimits(idle_timeout=10, flush_timeout=5, max_session_seconds=100))
    idle.receive_text("a", 4.0)
    assert idle.next_deadline() == 14.0
    idle.receive_timer(13.9)
    assert idle.phase is Phase.RECEIVING
    idle.receive_timer(14.0)
    assert idle.phase is Phase.DRAINING and isinstance(idle._error, IdleTimeout)

    long = Stream(StreamLimits(idle_timeout=10, flush_timeout=5, max_session_seconds=12))
    long.receive_text("a", 8.0)
    assert long.next_deadline() == 12.0  # the length's deadline is the nearer one
    long.receive_timer(12.0)
    assert long._error is not None and long._error.code == "session_too_long"
    assert "12 s" in long._error.message


def test_the_flush_gives_up_only_after_a_whole_flush_timeout_without_progress(caplog: pytest.LogCaptureFixture) -> None:
    stream = Stream(StreamLimits(idle_timeout=10, flush_timeout=20))
    stream.receive_text("a", 1.0)
    stream.receive_text("b", 1.0)
    stream.receive_text("end", 2.0)
    stream.account(1)  # one sample's events came: the bound moves on
    stream.receive_timer(22.0)
    assert stream.last_words == [] and stream.gave_up == [] and stream.next_deadline() == 42.0
    stream.outcomes += 1  # the engine works (on another stream): still progress
    stream.receive_timer(42.0)
    assert stream.last_words == [] and stream.next_deadline() == 62.0
    with caplog.at_level(logging.WARNING, "tests.lifecycle"):
        stream.receive_timer(62.0)  # a whole flush_timeout without any
    assert stream.gave_up == [62.0] and stream.last_words == [None]
    assert "test=s1 event=flush_timeout" in caplog.text and "lost_s=1.00" in caplog.text


def test_shutdown_ends_the_stream_and_caps_the_flush() -> None:
    stream = Stream(StreamLimits(idle_timeout=10, flush_timeout=20))
    stream.receive_text("a", 1.0)
    stream.receive_shutdown(5.0)
    assert stream._error is not None and stream._error.code == "shutting_down"
    stream.outcomes += 1  # progress would extend the bound, but a shutdown's cap stands
    stream.receive_timer(24.9)
    assert stream.last_words == []
    stream.receive_timer(25.0)
    assert stream.gave_up == [25.0] and stream.phase is Phase.CLOSED
