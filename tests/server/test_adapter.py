"""The adapters' base (:mod:`streamer.server.adapter`): its queue, its close action and its wakeup, with no event
loop."""

from __future__ import annotations

import pytest

from streamer.server.adapter import LOST, Adapter, Close, SendLimits


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
