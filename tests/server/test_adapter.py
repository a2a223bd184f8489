"""The adapters' base (:mod:`streamer.server.adapter`): its queue, its close action and its wakeup, with no event
loop."""

from __future__ import annotations

import pytest

from streamer.server.adapter import (
    FLUSH_CEILING_FLOOR_SECONDS,
    FLUSH_CEILING_PER_SECOND,
    LOST,
    Adapter,
    Close,
    FlushBound,
    SendLimits,
)


class Minimal(Adapter):
    """The least an endpoint implements: each input says what it does."""

    def __init__(self) -> None:
        super().__init__()
        self.released = 0

    def receive_text(self, frame: str, now: float) -> None:
        self._queue(f"{frame}@{now:g}")

    def receive_bytes(self, frame: bytes, now: float) -> None:
        self._close_with(1003, "no binary")

    def receive_timer(self, now: float) -> None:
        pass

    def receive_shutdown(self, now: float) -> None:
        self._close_with(1001, "shutting_down")

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        self._close_with(LOST.code, LOST.reason)

    def release(self) -> None:
        self.released += 1


def test_messages_go_out_oldest_first_in_as_many_takes_as_the_runner_wants() -> None:
    adapter = Minimal()
    for frame in ("a", "b", "c"):
        adapter.receive_text(frame, 1.5)
    assert adapter.messages_to_send(2.0, limit=1) == ["a@1.5"]
    assert adapter.messages_to_send(2.0, limit=0) == []
    assert adapter.messages_to_send(2.0) == ["b@1.5", "c@1.5"]
    assert adapter.messages_to_send(2.0, limit=5) == []


def test_the_first_close_decision_stands_and_wakes_the_runner() -> None:
    adapter = Minimal()
    woken: list[Close | None] = []
    adapter.wakeup = lambda: woken.append(adapter.close_action())
    assert adapter.reading and adapter.close_action() is None and adapter.next_deadline() is None
    adapter.receive_bytes(b"x", 1.0)
    adapter.receive_shutdown(2.0)
    assert adapter.close_action() == Close(1003, "no binary") and not adapter.reading
    assert woken == [Close(1003, "no binary")]


def test_defaults() -> None:
    adapter = Minimal()
    adapter.wakeup()  # a no-op until a runner owns the adapter
    assert adapter.send_limits == SendLimits(send_timeout=None, flush_timeout=10.0, socket_send_buffer=0)
    with pytest.raises(NotImplementedError):
        adapter.receive_send_timeout(1.0)  # only adapters with a send bound are told
    assert LOST.code == 1006  # never sent: the connection is gone


def test_the_flush_bound_waits_while_there_is_progress_and_gives_up_after_a_stretch_without() -> None:
    bound = FlushBound(timeout=10.0)
    bound.start(now=2.0, progress=100, backlog_seconds=60.0)
    assert (bound.ended, bound.deadline) == (2.0, 12.0)
    assert not bound.expired(11.9, progress=100)  # early: nothing happens, whatever the progress
    assert bound.deadline == 12.0
    assert not bound.expired(12.0, progress=101)  # any progress: another stretch
    assert (bound.deadline, bound.extensions) == (22.0, 1)
    assert not bound.expired(22.5, progress=50_000)  # a late timer: the next stretch counts from when it looked
    assert (bound.deadline, bound.extensions) == (32.5, 2)
    assert bound.expired(32.5, progress=50_000)  # a whole stretch without progress
    assert bound.expired(40.0, progress=50_000)  # and it stays given up


def test_a_stream_without_progress_gives_up_at_the_first_look() -> None:
    bound = FlushBound(timeout=5.0)
    bound.start(now=0.0, progress=0, backlog_seconds=3.0)
    assert bound.expired(5.0, progress=0)
    bound.start(now=100.0, progress=7, backlog_seconds=3.0)  # started again (a stream ending anew): from there
    assert (bound.deadline, bound.extensions) == (105.0, 0)
    assert not bound.expired(104.0, progress=7) and bound.expired(105.0, progress=7)


def test_the_wait_has_a_ceiling_linear_in_the_audio_left_whatever_the_progress() -> None:
    # only a core that never finishes reaches it: the engine works through a backlog far faster than this
    bound = FlushBound(timeout=10.0)
    bound.start(now=0.0, progress=0, backlog_seconds=60.0)
    assert bound.limit == 10.0 + 60.0 * FLUSH_CEILING_PER_SECOND
    progress = 0
    now = 0.0
    while not bound.expired(now := now + 10.0, progress := progress + 1):
        pass
    assert now == bound.limit == 610.0


def test_a_short_tail_gets_the_ceiling_of_a_whole_window_to_wait_for_its_turn() -> None:
    # the wait for a turn behind other streams does not shrink with the tail: a fraction of a second left counts as
    # FLUSH_CEILING_FLOOR_SECONDS, and no more than that
    for left in (0.0, 0.3, 2.0, FLUSH_CEILING_FLOOR_SECONDS):
        bound = FlushBound(timeout=10.0)
        bound.start(now=5.0, progress=0, backlog_seconds=left)
        assert bound.limit == 15.0 + FLUSH_CEILING_FLOOR_SECONDS * FLUSH_CEILING_PER_SECOND == 315.0
    bound.start(now=5.0, progress=0, backlog_seconds=31.0)
    assert bound.limit == 15.0 + 310.0


def test_a_shutdown_caps_the_flush_whatever_the_progress() -> None:
    bound = FlushBound(timeout=10.0)
    bound.start(now=0.0, progress=0, backlog_seconds=60.0)
    bound.cap(15.0)
    assert bound.deadline == 10.0 and not bound.expired(10.0, progress=5)  # progress: the next look is at 20
    assert bound.deadline == 15.0  # but the cap comes first
    assert not bound.expired(14.9, progress=9) and bound.expired(15.0, progress=10)
    bound.cap(30.0)  # a later cap does not lift an earlier one
    assert bound.limit == 15.0
