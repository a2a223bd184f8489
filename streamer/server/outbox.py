"""The send buffer every endpoint's adapter keeps between what it has to say and what the client has read.

The runner takes one message at a time, as fast as the client reads (:meth:`~streamer.server.adapter.Adapter.
messages_to_send`), so a slow reader leaves messages here. The buffer is bounded (every input costs memory linear in
its own size): a newer partial (an interim result) replaces the queued one of its channel, which is stale; when the
buffer is full the oldest partial goes first; when only messages that must arrive fill it (finals, errors), the reader
is too slow and :meth:`Outbox.put` raises :class:`~streamer.core.errors.SlowReader`: the adapter ends the stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from streamer.core.errors import SlowReader

__all__ = ["Outbox", "not_a_partial"]

T = TypeVar("T")


def not_a_partial(item: object) -> int | None:
    """For an outbox whose messages all must arrive (nothing supersedes anything)."""
    return None


class Outbox(Generic[T]):
    """A bounded FIFO of messages of type ``T``. ``partial_channel`` says of a message whether it is a partial and of
    which channel (None: it must arrive); ``capacity`` None: unbounded (adapters whose inputs bound what they say)."""

    def __init__(
        self,
        capacity: int | None,
        partial_channel: Callable[[T], int | None] = not_a_partial,
        what: str = "messages",
    ) -> None:
        self.capacity = capacity
        self._partial_channel = partial_channel
        # how SlowReader names what went unread ("messages", "events")
        self._what = what
        self.items: deque[T] = deque()
        self.dropped_partials = 0

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def put(self, item: T) -> None:
        """Queue ``item``: a partial first drops the queued partial of its channel. Raise
        :class:`~streamer.core.errors.SlowReader` when it cannot fit (the buffer is full of messages that must
        arrive); ``item`` is then not queued."""
        channel = self._partial_channel(item)
        if channel is not None:
            self._drop_first_partial(channel)  # superseded by the newer one
        if self.capacity is not None and len(self.items) >= self.capacity and not self._drop_first_partial(None):
            raise SlowReader(f"the client did not read {self.capacity} {self._what} in time")
        self.items.append(item)

    def take(self, limit: int | None = None) -> list[T]:
        """Up to ``limit`` messages (all by default), oldest first."""
        count = len(self.items) if limit is None else min(limit, len(self.items))
        return [self.items.popleft() for _ in range(count)]

    def clear(self) -> None:
        """Forget every queued message (the reader cannot get them in time, or is gone)."""
        self.items.clear()

    def _drop_first_partial(self, channel: int | None) -> bool:
        """Drop the oldest partial (of ``channel``, or of any channel): True if there was one."""
        for item in self.items:
            found = self._partial_channel(item)
            if found is not None and (channel is None or found == channel):
                self.items.remove(item)
                self.dropped_partials += 1
                return True
        return False
