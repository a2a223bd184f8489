"""Speaker labels at real time through a running server (issue 40), the way clients get them.

Conversations (:mod:`streamer.bench.conversations`: the synthetic report half, all at once; the shared real ones,
alone) are streamed at real time in 100 ms chunks to an in-process server, through ``/v1/listen`` with the protocol
v1 client or through the Deepgram-compatible endpoint with the official ``deepgram-sdk``, diarization off and on. A
round is one pass of each client with each setting; rounds alternate the order of off and on (off first in the first
round, on first in the second, ...), so a drift of the machine over the run falls on both. Per client and setting,
pooled over the rounds:

- **WER** of the finals against the reference words (Whisper's English normaliser);
- **final delay** as the speaker feels it: a final's arrival on the client's clock minus the moment the audio of its
  last word was sent;
- **word attribution**: each reference word takes the speaker of the streamed word that overlaps it most (words no
  streamed word overlaps are left out), scored under the best one-to-one mapping of labels to speakers;
- **speaker count**: the speakers ``done`` lists (``/v1/listen``), or the labels on the words (Deepgram, whose
  protocol has no summary);
- **DER** of the streamed finals as speaker turns (each final's span shared among its words' speakers, a speaker's
  pieces less than 0.5 s apart joined, as ``streamer transcribe --format rttm`` writes them), scored by
  pyannote.metrics where it is installed (collar 0.5, overlap skipped) and by ours beside it
  (:func:`streamer.bench.speakers.diarization_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from streamer.bench.conversations import Conversation, ReferenceWord
from streamer.bench.speakers import (
    DerScore,
    SpeakerSegment,
    diarization_error,
    pyannote_error,
    segment_frames,
    word_attribution,
)
from streamer.core.units import SAMPLE_RATE

if TYPE_CHECKING:
    from streamer.bench.harness import AudioArray, ReceivedTranscript, StreamRun, TimedWord
    from streamer.engine.types import Engine
    from streamer.offline.normalize import WerResult

__all__ = [
    "CLIENTS",
    "TURN_GAP",
    "RealtimeScore",
    "run_realtime",
    "score_realtime",
    "speaker_segments",
    "stream_conversations",
    "stream_file_deepgram",
]

CLIENTS = ("listen", "deepgram")
# a speaker's pieces less than this apart make one turn (streamer.offline.speakers.speaker_turns' default gap)
TURN_GAP = SAMPLE_RATE // 2
CHUNK_MS = 100


@dataclass(frozen=True)
class RealtimeScore:
    """One conversation streamed at real time, diarized or not."""

    name: str
    speakers: int
    found: int
    words: int  # reference words matched by a streamed word in time
    words_right: int
    der: DerScore  # ours
    der_pyannote: DerScore | None  # pyannote.metrics', where installed
    wer: WerResult
    delays: tuple[float, ...]  # speaker-measured final delays, seconds
    errors: tuple[str, ...]


def _streamed_words(run: StreamRun) -> list[TimedWord]:
    return sorted((w for f in run.finals for w in f.words), key=lambda w: (w.start, w.end))


def speaker_segments(finals: Sequence[ReceivedTranscript], gap: int = TURN_GAP) -> list[SpeakerSegment]:
    """Labelled finals as speaker turns, by the rule ``streamer transcribe --format rttm`` writes them
    (:func:`streamer.offline.speakers.speaker_turns`): each final's span (the speech it accounts for) shared among
    its words' speakers, then a speaker's consecutive pieces less than ``gap`` samples apart joined."""
    from streamer.offline.speakers import join_turns, speaker_pieces

    def samples(seconds: float) -> int:
        return round(seconds * SAMPLE_RATE)

    ordered = sorted(finals, key=lambda f: (f.start, f.end))
    pieces = (
        (samples(start), samples(end), speaker)
        for f in ordered
        for start, end, speaker in speaker_pieces(f.start, f.end, [(w.start, w.end, w.speaker) for w in f.words])
    )
    return [SpeakerSegment(int(start), int(end), speaker) for start, end, speaker in join_turns(pieces, gap)]


def score_realtime(conversation: Conversation, run: StreamRun) -> RealtimeScore:
    """A run's word attribution, speaker count, DER (ours and pyannote's), WER and final delays (see the module
    docstring)."""
    from streamer.bench.accuracy import final_delays
    from streamer.offline.normalize import normalize_english, word_error_rate

    streamed = _streamed_words(run)
    starts = np.array([round(w.start * SAMPLE_RATE) for w in streamed], dtype=np.int64)
    matched: list[ReferenceWord] = []
    labels: list[int | None] = []
    for ref in conversation.words:
        best, overlap = None, 0
        lo = max(0, int(np.searchsorted(starts, ref.start - 5 * SAMPLE_RATE)))
        for w in streamed[lo:]:
            start, end = round(w.start * SAMPLE_RATE), round(w.end * SAMPLE_RATE)
            if start >= ref.end:
                break
            shared = min(end, ref.end) - max(start, ref.start)
            if shared > overlap:
                best, overlap = w, shared
        if best is not None:
            matched.append(ref)
            labels.append(best.speaker)
    segments = speaker_segments(run.finals)
    frames, frame_labels = segment_frames(segments)
    if run.done is not None and run.done.speakers is not None:
        found = len({t.speaker for t in run.done.speakers})
    else:  # no summary (Deepgram): the labels the words carried
        found = len({w.speaker for w in streamed if w.speaker is not None})
    reference = normalize_english(" ".join(w.text for w in conversation.words))
    return RealtimeScore(
        name=conversation.name,
        speakers=len(conversation.speakers),
        found=found,
        words=len(matched),
        words_right=word_attribution(matched, labels),
        der=diarization_error(conversation, frames, frame_labels),
        der_pyannote=pyannote_error(conversation, segments) if segments else None,
        wer=word_error_rate([reference], [normalize_english(run.text)]),
        delays=tuple(final_delays(run)),
        errors=run.errors,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Streaming


def _deepgram_sdk() -> Any:
    """The official SDK (its async live client imports websockets' legacy API, which warns on import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import deepgram
        from deepgram.listen.v1 import raw_client  # noqa: F401  (the import that warns)

    return deepgram


async def stream_file_deepgram(
    port: int,
    name: str,
    samples: AudioArray,
    *,
    speed: float,
    chunk_ms: int,
    delay: float = 0.0,
    diarize: bool = False,
) -> StreamRun:
    """Stream ``samples`` (16 kHz mono) to a local server's Deepgram-compatible endpoint with the official SDK,
    exactly as a Deepgram client would (``linear16``, ``interim_results``, ``diarize``), paced at ``speed`` times
    real time after ``delay`` seconds; the Results as a :class:`~streamer.bench.harness.StreamRun` (``is_final``
    ones are its finals, their words with ``speaker``)."""
    from websockets.exceptions import ConnectionClosed

    from streamer.bench.harness import ReceivedTranscript, StreamRun, TimedWord
    from streamer.cli.terminal import paced_chunks
    from streamer.client import encode_audio
    from streamer.core.audio import Encoding
    from streamer.integrations.deepgram import DEEPGRAM_PREFIX

    deepgram = _deepgram_sdk()
    base = f"127.0.0.1:{port}{DEEPGRAM_PREFIX}"
    environment = deepgram.DeepgramClientEnvironment(
        base=f"http://{base}", production=f"ws://{base}", agent=f"ws://{base}", agent_rest=f"http://{base}"
    )
    client = deepgram.AsyncDeepgramClient(api_key="bench", environment=environment)
    await asyncio.sleep(delay)
    transcripts: list[ReceivedTranscript] = []
    errors: list[str] = []
    sent: list[float] = []
    chunk = chunk_ms * SAMPLE_RATE // 1000
    async with client.listen.v1.connect(
        model="nova-3",
        encoding="linear16",
        sample_rate="16000",
        interim_results="true",
        diarize="true" if diarize else "false",
    ) as connection:
        started = time.monotonic()

        async def send() -> None:
            async for piece in paced_chunks(samples, chunk, speed):
                sent.append(time.monotonic() - started)
                await connection.send_media(encode_audio(piece, Encoding.PCM_S16LE))
            await connection.send_close_stream()

        sender = asyncio.create_task(send())
        with contextlib.suppress(ConnectionClosed):
            while True:
                message = await connection.recv()
                received = time.monotonic() - started
                kind = getattr(message, "type", None)
                if kind == "Results":
                    alternative = message.channel.alternatives[0]
                    words = tuple(
                        TimedWord(w.word, float(w.start), float(w.end), None if w.speaker is None else int(w.speaker))
                        for w in alternative.words or ()
                    )
                    start = float(message.start)
                    transcripts.append(
                        ReceivedTranscript(
                            bool(message.is_final),
                            alternative.transcript,
                            start,
                            start + float(message.duration),
                            0.0,  # Deepgram's Results carry no server latency
                            received,
                            words,
                        )
                    )
                elif kind == "Metadata":
                    break
                elif kind == "Error" or kind is None:
                    errors.append(str(message))
        await sender
        return StreamRun(
            name,
            len(samples) / SAMPLE_RATE,
            speed,
            tuple(transcripts),
            None,
            tuple(errors),
            time.monotonic() - started,
            tuple(sent),
            chunk,
        )


async def stream_conversations(
    conversations: Sequence[Conversation], diarize: bool, engine: Engine, client: str = "listen", stagger: float = 0.5
) -> list[StreamRun]:
    """Every conversation at once through an in-process server at real time in 100 ms chunks, the starts
    ``stagger`` seconds apart, by ``client`` (see :data:`CLIENTS`)."""
    import argparse

    from streamer.bench.harness import serve, stream_file
    from streamer.core.options import CoreOptions

    args = argparse.Namespace(engine="real", model=engine.info.model)
    async with serve(engine, args, core=CoreOptions()) as server:
        if client == "deepgram":
            streams = [
                stream_file_deepgram(
                    server.port, c.name, c.samples, speed=1.0, chunk_ms=CHUNK_MS, delay=i * stagger, diarize=diarize
                )
                for i, c in enumerate(conversations)
            ]
        else:
            url = f"ws://127.0.0.1:{server.port}"
            streams = [
                stream_file(url, c.name, c.samples, speed=1.0, chunk_ms=CHUNK_MS, delay=i * stagger, diarize=diarize)
                for i, c in enumerate(conversations)
            ]
        return list(await asyncio.gather(*streams))


# ---------------------------------------------------------------------------------------------------------------------
# The report


def _sum_der(scores: Sequence[DerScore]) -> DerScore:
    total = DerScore(0, 0, 0, 0)
    for s in scores:
        total = total + s
    return total


def _der_parts(d: DerScore) -> str:
    scored = max(1, d.scored)
    return (
        f"missed {100 * d.missed / scored:.1f}, false alarm {100 * d.false_alarm / scored:.1f}, "
        f"confusion {100 * d.confusion / scored:.1f}"
    )


def _der_text(scores: Sequence[RealtimeScore]) -> str:
    ours = _sum_der([s.der for s in scores])
    theirs = [s.der_pyannote for s in scores]
    if theirs and all(t is not None for t in theirs):
        pyannote = _sum_der([t for t in theirs if t is not None])
        return (
            f"DER {100 * pyannote.der:.1f} % by pyannote.metrics ({_der_parts(pyannote)}; ours {100 * ours.der:.1f} %)"
        )
    return f"DER {100 * ours.der:.1f} % (ours; {_der_parts(ours)}; pyannote.metrics not installed)"


def _lines(label: str, scores: Sequence[RealtimeScore], conversations: int) -> list[str]:
    from streamer.server.metrics import percentile

    wer = sum((s.wer for s in scores[1:]), scores[0].wer)
    delays = [d for s in scores for d in s.delays]
    words = sum(s.words for s in scores)
    p50, p95 = percentile(delays, 50), percentile(delays, 95)
    line = (
        f"  {label}: WER {100 * wer.wer:.2f} % ({wer.words} words), final delay p50 {p50 or 0:.2f} s, "
        f"p95 {p95 or 0:.2f} s ({len(delays)} finals)"
    )
    if any(s.found for s in scores):
        line += (
            f"; word attribution {100 * sum(s.words_right for s in scores) / max(1, words):.1f} % of {words}, "
            f"speakers right in {sum(s.found == s.speakers for s in scores)} of {len(scores)}"
            f" ({len(scores) // max(1, conversations)} round(s) of {conversations}), {_der_text(scores)}"
        )
    errors = [e for s in scores for e in s.errors]
    return [line] + ([f"    errors: {errors[:3]}"] if errors else [])


def _round_line(client: str, results: dict[tuple[int, str, bool], list[RealtimeScore]], rounds: int) -> str:
    from streamer.server.metrics import percentile

    cells = []
    for r in range(rounds):
        for diarize in (False, True):
            scores = results[(r, client, diarize)]
            wer = sum((s.wer for s in scores[1:]), scores[0].wer)
            p95 = percentile([d for s in scores for d in s.delays], 95) or 0.0
            cells.append(f"round {r + 1} {'on' if diarize else 'off'}: {100 * wer.wer:.2f} % / {p95:.2f} s")
    return f"    by round (WER / final p95): {'; '.join(cells)}"


def run_realtime(
    sets: Sequence[tuple[str, Sequence[Conversation]]],
    model: str,
    *,
    clients: Sequence[str] = ("listen",),
    rounds: int = 1,
) -> list[str]:
    """Each set's conversations through a server at real time (a set's conversations at once), by each client,
    diarization off and on, in ``rounds`` interleaved rounds; the report's lines."""
    from streamer.engine import load_engine

    engine = load_engine(model)
    lines: list[str] = []
    for title, conversations in sets:
        results: dict[tuple[int, str, bool], list[RealtimeScore]] = {}
        for r in range(rounds):
            for client in clients:
                for diarize in (False, True) if r % 2 == 0 else (True, False):
                    runs = asyncio.run(stream_conversations(conversations, diarize, engine, client))
                    results[(r, client, diarize)] = [
                        score_realtime(c, run) for c, run in zip(conversations, runs, strict=True)
                    ]
        path = {"listen": "/v1/listen (protocol v1 client)", "deepgram": "the Deepgram endpoint (deepgram-sdk)"}
        lines.append(
            f"{title}: real time, {len(conversations)} at once, {rounds} round(s) off and on interleaved ({model}):"
        )
        for client in clients:
            lines.append(f" through {path[client]}:")
            for diarize in (False, True):
                pooled = [s for r in range(rounds) for s in results[(r, client, diarize)]]
                lines += _lines("diarize=true" if diarize else "diarize off", pooled, len(conversations))
            if rounds > 1:
                lines.append(_round_line(client, results, rounds))
            for c in conversations:
                mine = [s for r in range(rounds) for s in results[(r, client, True)] if s.name == c.name]
                lines.append(
                    f"    {c.name}: {mine[0].speakers} speakers, found {', '.join(str(s.found) for s in mine)}, "
                    f"attribution {100 * sum(s.words_right for s in mine) / max(1, sum(s.words for s in mine)):.1f} %"
                    f" of {sum(s.words for s in mine)} words, {_der_text(mine)}"
                )
    return lines
