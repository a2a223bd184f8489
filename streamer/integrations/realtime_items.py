"""Conversation items of an OpenAI Realtime transcription session, sans-I/O: the core's events in, server events out.

:class:`Items` maps one stream core's events onto OpenAI's items, each a user message holding one stretch of audio.
Text goes out as soon as the core makes it final, whatever the turn detection: one
``conversation.item.input_audio_transcription.delta`` per :class:`~streamer.core.events.Final`, in the batch of
events that produced it, so a word reaches the client as fast as a ``final`` reaches a ``/v1/listen`` client.

With ``turn_detection`` ``server_vad`` (or ``semantic_vad``) each utterance the core's VAD finds is an item::

    input_audio_buffer.speech_started     SpeechStarted          audio_start_ms, the item's id
    ...delta                              each Final             (deltas may come before the turn ends)
    input_audio_buffer.speech_stopped     SpeechEnded (VAD)      audio_end_ms: the VAD's end point
    input_audio_buffer.committed          SpeechEnded            previous_item_id: the item before
    conversation.item.added (GA) | conversation.item.created (beta)
    ...delta                              the utterance's last Finals (one more decode)
    ...completed, conversation.item.done  the core has committed the whole utterance

With ``turn_detection: null`` the client's ``commit`` closes the open item: deltas stream as the core makes text
final (before any commit), ``committed`` and ``added`` go out at the commit, ``completed`` and ``done`` when the core
has committed every utterance begun before the commit point.

Audio the engine failed on (a core :class:`~streamer.core.events.Lost`) fails its item:
``conversation.item.input_audio_transcription.failed`` with the error, at once; the item then ends with
``conversation.item.done`` (its transcript holds the text that was transcribed) and no ``completed``.

Times are 16 kHz stream samples; the wire has milliseconds.
"""

from __future__ import annotations

import itertools
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from streamer.core.errors import EngineFailure
from streamer.core.events import Word
from streamer.core.units import SAMPLE_RATE
from streamer.integrations.realtime import InvalidRequest

__all__ = ["MIN_COMMIT_MS", "EventIds", "Items"]

_MS = SAMPLE_RATE // 1000
MIN_COMMIT_MS = 100  # OpenAI refuses to commit less audio than this (input_audio_buffer_commit_empty)
_DELTA = "conversation.item.input_audio_transcription.delta"
_COMPLETED = "conversation.item.input_audio_transcription.completed"
_FAILED = "conversation.item.input_audio_transcription.failed"


class EventIds:
    """The ``event_id`` of each server event of one session: a random prefix and a counter."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(4)
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"event_{self._prefix}{next(self._count):06d}"


@dataclass
class _Item:
    item_id: str
    start: int  # server_vad: the utterance start; null mode: the previous commit point
    boundary: int | None = None  # where its audio ends (end point, commit point); None while audio still joins it
    committed: bool = False  # committed and added sent
    failed: bool = False  # failed sent: no completed follows
    discard: bool = False  # cleared: its finals are dropped
    texts: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    end: int = 0  # end of its last final


class Items:
    """Conversation items of one session, built from core events; every method returns the server events to send,
    in order. ``beta`` clients get ``conversation.item.created`` where GA clients get ``conversation.item.added``
    and ``conversation.item.done``; ``logprobs`` (``session.include``) may change at any time."""

    def __init__(self, server_vad: bool, beta: bool, event_ids: EventIds, logprobs: bool = False) -> None:
        self.server_vad = server_vad
        self.beta = beta
        self.logprobs = logprobs
        self._event_id = event_ids
        self._items: list[_Item] = []  # not yet ended, in stream order
        self._previous: str | None = None  # the last committed item, for previous_item_id
        self._last_commit = 0

    # -- core events ------------------------------------------------------------------------------------------------

    def speech_started(self, start: int) -> list[dict[str, Any]]:
        """A core SpeechStarted: under server VAD, a new item."""
        if not self.server_vad:
            return []
        item = self._new_item(start)
        return [self._event("input_audio_buffer.speech_started", audio_start_ms=start // _MS, item_id=item.item_id)]

    def speech_ended(self, start: int, end: int, client_commit: bool) -> list[dict[str, Any]]:
        """A core SpeechEnded: under server VAD the utterance's item is committed at its end point, announced by
        ``speech_stopped`` unless the client's own commit closed it (as OpenAI does). Its last finals follow."""
        if not self.server_vad:
            return []
        item = next((i for i in self._items if i.start == start and i.boundary is None), None)
        if item is None:  # cleared already
            return []
        item.boundary = end
        events = []
        if not client_commit:
            events.append(
                self._event("input_audio_buffer.speech_stopped", audio_end_ms=end // _MS, item_id=item.item_id)
            )
        return events + self._committed(item)

    def final(self, start: int, end: int, text: str, words: tuple[Word, ...]) -> list[dict[str, Any]]:
        """A core Final: its text goes out at once as a delta of the item it belongs to."""
        item = self._owner(start)
        item.end = max(item.end, end)
        text = text.strip()
        if item.discard or not text:
            return []
        delta = text if not item.texts else " " + text
        item.texts.append(text)
        fields: dict[str, Any] = {"item_id": item.item_id, "content_index": 0, "delta": delta}
        logprobs = _logprobs(words, first=len(item.texts) == 1)
        item.logprobs += logprobs
        if self.logprobs:
            fields["logprobs"] = logprobs
        return [self._event(_DELTA, **fields)]

    def lost(self, start: int, end: int, reason: str) -> list[dict[str, Any]]:
        """A core Lost: ``[start, end)`` cannot be transcribed (``reason``); the transcription of its item, and of every
        later item that starts inside it (a flush that gave up on a stream's tail), fails (once each)."""
        owner = self._owner(start)
        error = {
            "type": "transcription_error",
            "code": EngineFailure.code,
            "message": f"{reason}: {start / SAMPLE_RATE:.2f}-{end / SAMPLE_RATE:.2f} s of audio is lost",
            "param": None,
        }
        events = []
        for item in self._items:
            if item is not owner and not start <= item.start < end:
                continue
            if item.discard or item.failed:
                continue
            item.failed = True
            events.append(self._event(_FAILED, item_id=item.item_id, content_index=0, error=error))
        return events

    def settle(self, uncommitted_from: int | None) -> list[dict[str, Any]]:
        """End every item whose speech the core has wholly committed (``uncommitted_from`` is
        :attr:`~streamer.core.stream.StreamCore.uncommitted_from`). Call after every batch of core events."""
        events: list[dict[str, Any]] = []
        while self._items:
            item = self._items[0]
            if item.boundary is None:
                break
            if self.server_vad and not item.discard:
                done = uncommitted_from is None or uncommitted_from > item.start
            else:
                done = uncommitted_from is None or uncommitted_from >= item.boundary
            if not done:
                break
            self._items.pop(0)
            if not item.discard:
                events += self._ended(item)
        return events

    def end(self) -> list[dict[str, Any]]:
        """The stream is over and the core has ended: commit and end what is left."""
        events: list[dict[str, Any]] = []
        for item in self._items:
            if item.boundary is None:
                item.boundary = item.end
            if not item.committed and not item.discard:
                events += self._committed(item)
        return events + self.settle(None)

    # -- client events ----------------------------------------------------------------------------------------------

    def commit(self, point: int) -> list[dict[str, Any]]:
        """The client committed the buffer at stream sample ``point``; the session finalizes the core next. Raise
        :class:`~streamer.integrations.realtime.InvalidRequest` for less than :data:`MIN_COMMIT_MS` since the last."""
        if point - self._last_commit < MIN_COMMIT_MS * _MS:
            raise InvalidRequest(
                f"buffer too small: expected at least {MIN_COMMIT_MS} ms of audio since the last commit, "
                f"got {(point - self._last_commit) / _MS:.0f} ms",
                code="input_audio_buffer_commit_empty",
            )
        self._last_commit = point
        if self.server_vad:
            return []  # finalizing ends the open utterance, whose item is committed like any other (speech_ended)
        item = self._open_item()
        item.boundary = point
        return self._committed(item)

    def clear(self, point: int) -> list[dict[str, Any]]:
        """Drop the audio not yet committed (the session finalized the core so that it ends at ``point``): its
        later finals are dropped; deltas already sent stay sent, and its item never completes."""
        for item in self._items:
            if not item.committed:
                item.discard = True
                item.boundary = point if item.boundary is None else item.boundary
        self._last_commit = point
        return [self._event("input_audio_buffer.cleared")]

    def timeout(self, start: int, end: int) -> list[dict[str, Any]]:
        """Server VAD heard no speech in ``[start, end)`` for the session's ``idle_timeout_ms``: OpenAI's
        ``timeout_triggered``, and the silence committed as an empty item (as OpenAI commits it)."""
        item = _Item(f"item_{secrets.token_hex(8)}", start, boundary=end, end=end)
        event = self._event(
            "input_audio_buffer.timeout_triggered",
            audio_start_ms=start // _MS,
            audio_end_ms=end // _MS,
            item_id=item.item_id,
        )
        return [event, *self._committed(item), *self._ended(item)]

    def event_id(self) -> str:
        return self._event_id()

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _new_item(self, start: int) -> _Item:
        item = _Item(f"item_{secrets.token_hex(8)}", start)
        self._items.append(item)
        return item

    def _open_item(self) -> _Item:
        for item in self._items:
            if item.boundary is None and not item.discard:
                return item
        return self._new_item(self._last_commit)

    def _owner(self, start: int) -> _Item:
        if self.server_vad:
            candidates = [i for i in self._items if i.start <= start]
            return candidates[-1] if candidates else (self._items[0] if self._items else self._new_item(start))
        for item in self._items:
            if item.boundary is not None and start < item.boundary:
                return item
        return self._open_item()

    def _committed(self, item: _Item) -> list[dict[str, Any]]:
        item.committed = True
        previous, self._previous = self._previous, item.item_id
        committed = self._event("input_audio_buffer.committed", item_id=item.item_id, previous_item_id=previous)
        added = "conversation.item.created" if self.beta else "conversation.item.added"
        return [committed, self._event(added, previous_item_id=previous, item=_message(item, None))]

    def _ended(self, item: _Item) -> list[dict[str, Any]]:
        transcript = " ".join(item.texts)
        events = []
        if not item.failed:
            fields: dict[str, Any] = {
                "item_id": item.item_id,
                "content_index": 0,
                "transcript": transcript,
                "usage": {
                    "type": "duration",
                    "seconds": round(max(0, (item.boundary or 0) - item.start) / SAMPLE_RATE, 3),
                },
            }
            if self.logprobs:
                fields["logprobs"] = item.logprobs
            events.append(self._event(_COMPLETED, **fields))
        if not self.beta:
            events.append(self._event("conversation.item.done", item=_message(item, transcript)))
        return events

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": self._event_id(), **fields}


def _message(item: _Item, transcript: str | None) -> dict[str, Any]:
    """The user message item holding ``item``'s audio (its audio bytes are never sent back)."""
    return {
        "id": item.item_id,
        "object": "realtime.item",
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def _logprobs(words: tuple[Word, ...], first: bool) -> list[dict[str, Any]]:
    """OpenAI's logprobs, one entry a word: the word as the delta spells it and the log of the probability the
    decoder gave it (a word's probability is its tokens', from the engine's word timing)."""
    entries = []
    for index, word in enumerate(words):
        token = word.text if first and index == 0 else " " + word.text
        logprob = math.log(min(1.0, max(word.probability, 1e-12)))
        entries.append({"token": token, "logprob": round(logprob, 6), "bytes": list(token.encode("utf-8"))})
    return entries
