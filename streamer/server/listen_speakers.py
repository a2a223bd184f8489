"""A ``/v1/listen`` session's speaker labels (issue 40): turning them on (``diarize=true``, or ``configure``) and
off, bounding them (``max_speakers``), and saying once that they failed. The labelling itself is each channel's
(:class:`~streamer.server.speaker_worker.SpeakerCoreClient`) and the voice encoder's
(:class:`~streamer.server.speaker_worker.SpeakerWorker`); this is the session's side of it, sans-I/O."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from streamer.core.errors import DiarizationFailure, DiarizationUnavailable
from streamer.core.events import Event
from streamer.core.speakers import SpeakerOptions
from streamer.server.client_messages import Configure
from streamer.server.listen_channel import ListenChannel
from streamer.server.listen_query import ListenParams
from streamer.server.server_messages import ErrorMessage
from streamer.server.speaker_worker import DIARIZATION_UNAVAILABLE, SpeakerWorker

__all__ = ["ListenSpeakers"]


class ListenSpeakers:
    """The speaker labels of a session's ``channels``, with the server's voice encoder ``worker`` (None: the
    server has none)."""

    def __init__(
        self,
        worker: SpeakerWorker | None,
        channels: Sequence[ListenChannel],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.worker = worker
        self.channels = channels
        self._log = log
        self._failure_said = False  # the session says once that labels stopped

    def start(self, max_speakers: int | None) -> None:
        """Label every channel's speakers from here on; :class:`DiarizationUnavailable` when the server has no voice
        encoder (the handshake checks that first: :func:`~streamer.server.takeover.open_listen_session`)."""
        if self.worker is None or not self.worker.available:
            raise DiarizationUnavailable(DIARIZATION_UNAVAILABLE)
        options = SpeakerOptions(max_speakers=max_speakers)
        for channel in self.channels:
            channel.start_diarizing(options)
            self.worker.register(channel)

    def configure(
        self, params: ListenParams, message: Configure
    ) -> tuple[ListenParams, list[tuple[ListenChannel, Event]]]:
        """A ``configure``'s ``diarize`` and ``max_speakers`` (a field left out keeps its value): the session's
        parameters after it, and the events that turning labels off let go (to forward, labelled with what was
        known)."""
        diarize = params.diarize if message.diarize is None else message.diarize
        max_speakers = params.max_speakers if message.max_speakers is None else message.max_speakers
        released: list[tuple[ListenChannel, Event]] = []
        if diarize and not params.diarize:
            self.start(max_speakers)
        elif diarize and max_speakers != params.max_speakers:
            for channel in self.channels:
                if channel.diarizer is not None:
                    channel.diarizer.limit_speakers(max_speakers)
        elif not diarize and params.diarize:
            released = [(channel, event) for channel in self.channels for event in channel.stop_diarizing()]
        return replace(params, diarize=diarize, max_speakers=max_speakers if diarize else None), released

    def after_events(self) -> ErrorMessage | None:
        """After the channels' events: wake the encoder if a channel has windows for it; the ``diarization_failed``
        notice the first time a channel's labels stopped, else None."""
        if self.worker is not None and any(c.wants_embedding for c in self.channels):
            self.worker.notify()
        if self._failure_said:
            return None
        failed = next((c for c in self.channels if c.diarization_failure is not None), None)
        if failed is None:
            return None
        self._failure_said = True
        reason = failed.diarization_failure
        self._log.warning("event=diarization_failed channel=%d reason=%r", failed.index, reason)
        message = f"speaker labels stopped ({reason}); the transcript goes on without them"
        return ErrorMessage(code=DiarizationFailure.code, message=message, channel=failed.index)

    def close(self) -> None:
        """The session is over: the encoder forgets its channels."""
        if self.worker is not None:
            for channel in self.channels:
                self.worker.unregister(channel)
