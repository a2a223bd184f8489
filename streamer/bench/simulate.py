"""The accelerated streaming mode: the server's own core and scheduler on a simulated clock, the engine run for real.

What a real-time run through ``streamer serve`` does, without waiting for the audio (issue 16):

- audio arrives at real-time pace on the simulated clock: chunk ``k`` of a stream that starts at ``t0`` arrives at
  ``t0 + k * chunk / 16000`` (the pacing of :func:`streamer.cli.terminal.paced_chunks`), the end of the stream right
  after its last chunk;
- each stream is a :class:`~streamer.core.stream.StreamCore` behind a :class:`~streamer.server.scheduler.CoreClient`,
  and one :class:`~streamer.server.scheduler.Scheduler` picks the batches as the server's does (its batch size, its
  finals first, its rotation), whenever the engine is free and a stream has work;
- each batch is decoded for real by the engine, its measured wall time charged to the simulated clock: its results
  are delivered at submit time + decode time, while audio goes on arriving. One engine shared by N simulated streams
  queues their windows as the server's worker thread does.

The simulated run takes about the engine's busy time instead of the audio's duration: a stream that keeps the engine
30% busy runs about three times faster than real time, and no audio ever waits for the clock. What it leaves out:
the event loop's and the network's own time (small next to a decode, see ``streamer bench accuracy --validate``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamer.bench.harness import AudioArray, ReceivedTranscript, StreamRun, TimedWord
from streamer.core.events import Final, Lost, Partial
from streamer.core.options import CoreOptions, for_the_model
from streamer.core.stream import StreamCore
from streamer.core.units import SAMPLE_RATE, samples_to_seconds
from streamer.engine import silero_vad
from streamer.engine.types import Engine, StreamId
from streamer.server.arrivals import ArrivalLog
from streamer.server.scheduler import Batch, CoreClient, Decoded, Scheduler, SchedulerOptions

__all__ = ["SimulatedStream", "Simulation", "simulate"]


@dataclass(frozen=True)
class SimulatedStream:
    """One client of a simulated run: its audio (float32 mono 16 kHz) and when it starts (simulated seconds)."""

    name: str
    samples: AudioArray
    start: float = 0.0


@dataclass(frozen=True)
class Simulation:
    """What a simulated run produced: one :class:`StreamRun` per stream (times on the simulated clock, from the
    stream's own start, as a real client's clock would read them) and the engine's work."""

    runs: tuple[StreamRun, ...]
    batches: int
    windows: int
    # wall seconds spent in engine.decode, all charged to the simulated clock
    decode_seconds: float
    # the simulated clock when the last stream was done, and the wall time the simulation took
    simulated_seconds: float
    wall_seconds: float


@dataclass(frozen=True)
class _Running:
    """The batch the engine is running, and when its results are due on the simulated clock."""

    due: float
    batch: Batch
    decoded: Decoded


@dataclass
class _Clock:
    """The simulated clock (seconds), read by the clients when a decode result comes back."""

    now: float = 0.0


@dataclass
class _Client:
    """One simulated stream: its core behind the scheduler's client, and what its client received."""

    stream: SimulatedStream
    core: StreamCore
    chunk: int
    clock: _Clock
    arrivals: ArrivalLog = field(default_factory=ArrivalLog)
    transcripts: list[ReceivedTranscript] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done_at: float | None = None
    client: CoreClient | None = None

    def on_update(self) -> None:
        """The scheduler delivered a result to the core (the session's ``after_core_update``)."""
        self.drain(self.clock.now)

    def drain(self, now: float) -> None:
        """Take the core's events as the session would, each received by the client at ``now``."""
        for event in self.core.events_received():
            if isinstance(event, Partial | Final):
                arrived = self.arrivals.arrival_of(event.audio_end)
                self.transcripts.append(
                    ReceivedTranscript(
                        final=isinstance(event, Final),
                        text=event.text,
                        start=samples_to_seconds(event.start),
                        end=samples_to_seconds(event.end),
                        latency_ms=0.0 if arrived is None else round(max(0.0, now - arrived) * 1000, 1),
                        received=now - self.stream.start,
                        words=tuple(
                            TimedWord(w.text, samples_to_seconds(w.start), samples_to_seconds(w.end))
                            for w in event.words
                        ),
                        route=event.route.value if isinstance(event, Final) else "",
                    )
                )
            elif isinstance(event, Lost):
                self.errors.append(f"lost [{samples_to_seconds(event.start)}, {samples_to_seconds(event.end)}) s")
        if self.done_at is None and self.core.done:
            self.done_at = now

    def run(self) -> StreamRun:
        chunks = -(-len(self.stream.samples) // self.chunk)
        done = self.done_at if self.done_at is not None else self.stream.start
        return StreamRun(
            file=self.stream.name,
            audio_seconds=len(self.stream.samples) / SAMPLE_RATE,
            speed=1.0,
            transcripts=tuple(self.transcripts),
            done=None,
            errors=tuple(self.errors),
            wall_seconds=done - self.stream.start,
            sent=tuple(k * self.chunk / SAMPLE_RATE for k in range(chunks)),
            chunk_samples=self.chunk,
        )


def simulate(
    engine: Engine,
    streams: Sequence[SimulatedStream],
    core: CoreOptions,
    scheduler: SchedulerOptions | None = None,
    chunk_ms: int = 100,
) -> Simulation:
    """Run ``streams`` through cores and a scheduler sharing ``engine`` on a simulated clock; blocks until every
    stream is done (the engine runs on this thread). See the module docstring for what is simulated."""
    started = time.perf_counter()
    chunk = chunk_ms * SAMPLE_RATE // 1000
    sched = Scheduler(engine, scheduler or SchedulerOptions())
    core = for_the_model(core, engine.info.multilingual)
    clients: list[_Client] = []
    clock = _Clock()
    for index, stream in enumerate(streams):
        stream_core = StreamCore(core, StreamId(f"sim-{index}"), vad_classifiers=silero_vad.CLASSIFIERS)
        state = _Client(stream, stream_core, chunk, clock)
        state.client = CoreClient(state.core, SAMPLE_RATE, state.on_update)
        sched.register(state.client)
        clients.append(state)
    # 1. Every chunk's arrival, in time order: (time, stream, chunk index).
    arrivals = [(c.stream.start + k * chunk / SAMPLE_RATE, i, k) for i, c in enumerate(clients)
                for k in range(-(-len(c.stream.samples) // chunk))]  # fmt: skip
    heapq.heapify(arrivals)
    batches = windows = 0
    decode_seconds = 0.0
    running: _Running | None = None
    while arrivals or running is not None:
        # 2. The next thing to happen: a chunk arrives, or the engine finishes (a tie goes to the engine: its
        # results were on the loop before the frame).
        if running is not None and (not arrivals or running.due <= arrivals[0][0]):
            clock.now, batch, decoded = running.due, running.batch, running.decoded
            running = None
            if decoded.failed_calls:
                sched.deliver_retried(batch, decoded.results)
            else:
                sched.deliver(batch, [r for r in decoded.results if r is not None])
        else:
            clock.now, index, k = heapq.heappop(arrivals)
            state = clients[index]
            piece = state.stream.samples[k * chunk : (k + 1) * chunk]
            state.core.receive_audio(piece)
            state.arrivals.record(state.core.samples_received, clock.now)
            if (k + 1) * chunk >= len(state.stream.samples):
                state.core.receive_end_of_stream()  # the client's end follows its last chunk at once
            assert state.client is not None
            state.client.offered = True
            state.drain(clock.now)
        # 3. A free engine takes the next batch now, and holds the clock's charge for its real decode time.
        if running is None:
            due = sched.next_batch()
            if due is not None:
                t = time.perf_counter()
                result = sched.decode_isolating(due.requests)
                spent = time.perf_counter() - t
                decode_seconds += spent
                batches += 1
                windows += len(due.requests)
                running = _Running(clock.now + spent, due, result)
    for state in clients:
        assert state.client is not None
        sched.unregister(state.client)
        if state.core.stream_id is not None:
            engine.forget_stream(state.core.stream_id)
    return Simulation(
        runs=tuple(c.run() for c in clients),
        batches=batches,
        windows=windows,
        decode_seconds=decode_seconds,
        simulated_seconds=clock.now,
        wall_seconds=time.perf_counter() - started,
    )
