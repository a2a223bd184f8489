"""What a ``/v1/listen`` session queues for its client, and how each message reads as it goes out: a transcript's
latency is measured when it is sent (the server's share of the delay: from the arrival of the audio its text needed
to the send), and ``done`` sums the session when it is sent, over every transcript before it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamer.core.events import Final, Partial, Word
from streamer.core.units import SAMPLE_RATE, samples_to_seconds
from streamer.server.listen_channel import ListenChannel
from streamer.server.listen_query import ListenParams
from streamer.server.metrics import ServerMetrics, percentile
from streamer.server.server_messages import (
    Done,
    FinalMessage,
    LatencySummary,
    PartialMessage,
    Percentiles,
    Ready,
    ServerMessage,
    SpeakerTalk,
    WordMessage,
)
from streamer.server.status import LatencyPercentiles, latency_percentiles

__all__ = [
    "Outgoing",
    "QueuedSummary",
    "QueuedTranscript",
    "TranscriptRenderer",
    "partial_channel",
    "ready_message",
    "seconds",
    "word_message",
]


@dataclass(frozen=True)
class QueuedTranscript:
    """A partial or final waiting in the send buffer; its latency is measured when it is actually sent."""

    channel: int
    event: Partial | Final
    seq: int = 0  # finals only: 1, 2, 3, ... per session
    # when the last sample the text needed arrived (None: before any audio), stamped when the event is made, so a
    # final replayed on resume long after is still dated right once the arrival log has forgotten its audio
    arrived: float | None = None


@dataclass(frozen=True)
class QueuedSummary:
    """``done``, in the send buffer: made as it goes out, so that its latency figures cover every transcript sent
    before it."""


Outgoing = ServerMessage | QueuedTranscript | QueuedSummary


def partial_channel(item: Outgoing) -> int | None:
    """The outbox's rule (:class:`~streamer.server.outbox.Outbox`): a newer partial replaces its channel's."""
    if isinstance(item, QueuedTranscript) and isinstance(item.event, Partial):
        return item.channel
    return None


def ready_message(session_id: str, model: str, params: ListenParams, received: float, resumed: bool) -> Ready:
    """``ready``: the session (new, or ``resumed``) and from where in the stream (``received`` seconds) the client
    sends its audio."""
    return Ready(
        session_id=session_id,
        model=model,
        # a container's rate is the container's, unknown until its header: 0 says so
        sample_rate=0 if params.container is not None else params.sample_rate,
        encoding=params.encoding.value,
        channels=params.channels,
        resumed=resumed,
        audio_seconds_received=round(received, 6),
        resume_from=round(received, 6),
    )


def seconds(samples: int) -> float:
    """Stream samples as the wire's seconds."""
    return round(samples / SAMPLE_RATE, 4)


def word_message(word: Word) -> WordMessage:
    return WordMessage(
        word.text, seconds(word.start), seconds(word.end), round(word.probability, 4), speaker=word.speaker
    )


def _speakers(channels: Sequence[ListenChannel]) -> tuple[SpeakerTalk, ...] | None:
    """``done``'s speakers: each diarized channel's, with their talk time; None when no channel diarized."""
    if not any(c.diarized for c in channels):
        return None
    return tuple(
        SpeakerTalk(channel.index, talk.speaker, round(samples_to_seconds(talk.samples), 3))
        for channel in channels
        for talk in channel.talk_times()
    )


class TranscriptRenderer:
    """Turns queued items into messages as they go out, and keeps the session's latencies (for ``done``,
    ``/status`` and the server's histograms)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.latencies: dict[str, list[float]] = {"partial": [], "final": []}

    def render(self, item: Outgoing, now: float, channels: Sequence[ListenChannel]) -> ServerMessage:
        """The message ``item`` becomes at ``now`` (``channels``: the session's, for ``done``'s totals)."""
        if isinstance(item, QueuedSummary):
            return self.done(channels)
        if not isinstance(item, QueuedTranscript):
            return item
        event = item.event
        latency_ms = 0.0 if item.arrived is None else round(max(0.0, now - item.arrived) * 1000, 1)
        words = tuple(word_message(w) for w in event.words)
        fields = (item.channel, event.segment_id, event.text, seconds(event.start), seconds(event.end), words)
        if isinstance(event, Partial):
            self.latencies["partial"].append(latency_ms)
            self.metrics.partial_latency.observe(latency_ms / 1000)
            return PartialMessage(*fields, latency_ms=latency_ms, language=event.language, speaker=event.speaker)
        self.latencies["final"].append(latency_ms)
        self.metrics.final_latency.observe(latency_ms / 1000)
        return FinalMessage(
            *fields, latency_ms=latency_ms, seq=item.seq, language=event.language, speaker=event.speaker
        )

    def done(self, channels: Sequence[ListenChannel]) -> Done:
        """``done``: what the channels received and how each second was accounted for, and the latencies."""

        def total(samples: int) -> float:
            return round(samples_to_seconds(samples), 6)

        return Done(
            audio_seconds_received=total(sum(c.core.samples_received for c in channels)),
            audio_seconds_transcribed=total(sum(c.transcribed for c in channels)),
            non_speech_seconds=total(sum(c.non_speech for c in channels)),
            lost_seconds=total(sum(c.lost for c in channels)),
            latency=LatencySummary(partial=self._percentiles("partial"), final=self._percentiles("final")),
            speakers=_speakers(channels),
        )

    def summary(self, kind: str) -> LatencyPercentiles:
        """``kind``'s (partial, final) latency percentiles as ``/status`` shows them."""
        return latency_percentiles(self.latencies[kind])

    def _percentiles(self, kind: str) -> Percentiles:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        values = self.latencies[kind]
        return Percentiles(p50=ms(percentile(values, 50)), p95=ms(percentile(values, 95)))
