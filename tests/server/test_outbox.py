"""The send buffer every adapter keeps (:mod:`streamer.server.outbox`): bounded, a newer partial replacing its
channel's, stale partials dropped before anything that must arrive, and a slow reader named when only those fill it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from streamer.core.errors import SlowReader
from streamer.server.outbox import Outbox


@dataclass(frozen=True)
class Message:
    text: str
    # the channel of a partial; None: a message that must arrive (a final, an error)
    partial_of: int | None = None


def partial(channel: int, text: str) -> Message:
    return Message(text, channel)


def outbox(capacity: int | None) -> Outbox[Message]:
    return Outbox(capacity, lambda message: message.partial_of)


def test_a_newer_partial_replaces_the_queued_one_of_its_channel() -> None:
    box = outbox(8)
    box.put(partial(0, "a"))
    box.put(partial(1, "x"))
    box.put(partial(0, "a b"))
    assert list(box) == [partial(1, "x"), partial(0, "a b")]
    assert box.dropped_partials == 1


def test_a_full_buffer_drops_stale_partials_before_finals() -> None:
    box = outbox(3)
    box.put(Message("one"))
    box.put(partial(1, "two"))
    box.put(Message("three"))
    box.put(Message("four"))  # full: the partial goes
    assert [m.text for m in box] == ["one", "three", "four"] and box.dropped_partials == 1


def test_when_only_finals_fill_the_buffer_the_reader_is_too_slow() -> None:
    box = Outbox[Message](2, what="events")
    box.put(Message("one"))
    box.put(Message("error"))
    with pytest.raises(SlowReader, match="did not read 2 events") as info:
        box.put(Message("two"))
    assert info.value.close_code == 4408
    assert len(box) == 2  # what did fit stays; the close is the adapter's close action, outside the buffer


def test_messages_are_taken_oldest_first_as_the_client_reads() -> None:
    box = outbox(None)  # unbounded: an adapter whose inputs bound what it says
    for index in range(1000):
        box.put(Message(str(index)))
    assert [m.text for m in box.take(2)] == ["0", "1"]
    assert len(box.take()) == 998 and box.take() == []
    box.put(Message("x"))
    box.clear()
    assert len(box) == 0
