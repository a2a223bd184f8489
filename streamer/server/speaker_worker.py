"""The server's voice encoder (issue 40): one worker thread that embeds the windows every diarizing channel's
:class:`~streamer.core.diarization.ChannelDiarizer` plans, in batches across streams, and hands each channel its
embeddings back on the event loop.

Beside the engine's scheduler, not inside it: the engine's interface stays the decoder's, and a window to embed
(2 s of audio, about 6 ms of one core) never waits behind a batch of decodes. The encoder is loaded on the worker
thread at the first batch (a server whose package lacks the weights refuses ``diarize=true`` at the handshake:
:attr:`SpeakerWorker.available`); a load or embedding failure stops diarization for the channels it hit, whose
words then go out without speakers (the session says why once), never the transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import numpy.typing as npt

from streamer.core.diarization import ChannelDiarizer, EmbedRequest, SpeakerTime
from streamer.core.errors import ConfigError, InvalidState
from streamer.core.events import Event
from streamer.core.speakers import SpeakerOptions
from streamer.core.stream import StreamCore
from streamer.engine.speaker_encoder import load_speaker_encoder, weights_path
from streamer.server.metrics import ServerMetrics
from streamer.server.scheduler import CoreClient

__all__ = [
    "DIARIZATION_UNAVAILABLE",
    "Embedder",
    "SpeakerClient",
    "SpeakerCoreClient",
    "SpeakerWorker",
    "speaker_model_available",
]

logger = logging.getLogger(__name__)

# what a refused diarize=true says
DIARIZATION_UNAVAILABLE = (
    "this server has no speaker model: install it with pip install --no-deps Resemblyzer==0.1.4, "
    "and do not serve with --no-diarization"
)
# windows embedded in one call at most: a batch of 32 two-second windows is ~0.2 s of one core, so a burst of
# channels ending at once (each flushing its last windows) is served in turns
MAX_BATCH = 32


class Embedder(Protocol):
    """What embeds windows: :class:`streamer.engine.speaker_encoder.SpeakerEncoder`, or a test's stand-in."""

    def embed_windows(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...


class SpeakerClient(Protocol):
    """A diarizing channel, as the worker sees it."""

    @property
    def wants_embedding(self) -> bool:
        """Windows wait to be taken."""
        ...

    def windows_to_embed(self, limit: int | None = None) -> list[EmbedRequest]: ...

    def receive_embeddings(self, requests: Sequence[EmbedRequest], vectors: npt.NDArray[np.float32]) -> None: ...

    def receive_embed_failure(self, reason: str) -> None: ...


class SpeakerCoreClient(CoreClient):
    """A scheduled stream core with its speakers: a ``/v1/listen`` channel or a compatibility adapter's track. While
    it diarizes (:meth:`start_diarizing`), its audio reaches a :class:`~streamer.core.diarization.ChannelDiarizer`
    too, it is the worker's :class:`SpeakerClient`, and its core's events pass through the diarizer (:meth:`events`:
    labelled, finals once their labels are known)."""

    def __init__(self, core: StreamCore, sample_rate: int, on_update: Callable[[], None]) -> None:
        super().__init__(core, sample_rate, on_update)
        self.diarizer: ChannelDiarizer | None = None
        # whether it ever diarized (done then lists its speakers), and the talk times when it stopped
        self.diarized = False
        self._talk: list[SpeakerTime] = []

    def receive_audio(self, samples: npt.NDArray[np.float32]) -> None:
        """The core's (and diarizer's) next 16 kHz samples."""
        self.core.receive_audio(samples)
        if self.diarizer is not None:
            self.diarizer.receive_audio(samples)
        self.offered = True

    def receive_end_of_stream(self) -> None:
        self.core.receive_end_of_stream()
        if self.diarizer is not None:
            self.diarizer.receive_end_of_stream()

    def start_diarizing(self, options: SpeakerOptions) -> None:
        """Label speakers from the next sample on (the core's events still to be collected included)."""
        if self.diarizer is None:
            self.diarizer = ChannelDiarizer(options, first=self.core.samples_received)
            self.diarized = True

    def stop_diarizing(self) -> list[Event]:
        """Stop labelling: the events the diarizer held, labelled with what it knows."""
        if self.diarizer is None:
            return []
        diarizer, self.diarizer = self.diarizer, None
        diarizer.receive_events(self.core.events_received())
        events = diarizer.stop()
        self._talk = diarizer.talk_times()
        return events

    def events(self) -> list[Event]:
        """The core's new events, through the diarizer when there is one."""
        events = self.core.events_received()
        if self.diarizer is None:
            return events
        self.diarizer.receive_events(events)
        return self.diarizer.events_received()

    def talk_times(self) -> list[SpeakerTime]:
        """Each speaker's talk time over the finals released, while diarizing (kept when diarization stops)."""
        return self.diarizer.talk_times() if self.diarizer is not None else list(self._talk)

    @property
    def diarization_failure(self) -> str | None:
        return None if self.diarizer is None else self.diarizer.failure

    @property
    def events_held(self) -> int:
        return 0 if self.diarizer is None else self.diarizer.held

    @property
    def wants_embedding(self) -> bool:
        return self.diarizer is not None and self.diarizer.has_windows

    def windows_to_embed(self, limit: int | None = None) -> list[EmbedRequest]:
        return [] if self.diarizer is None else self.diarizer.windows_to_embed(limit)

    def receive_embeddings(self, requests: Sequence[EmbedRequest], vectors: npt.NDArray[np.float32]) -> None:
        if self.diarizer is not None:
            self.diarizer.receive_embeddings(requests, vectors)
            self._on_update()

    def receive_embed_failure(self, reason: str) -> None:
        if self.diarizer is not None:
            self.diarizer.receive_failure(reason)
            self._on_update()


def speaker_model_available() -> bool:
    """Whether the voice encoder's weights are installed (without loading them)."""
    try:
        weights_path()
    except ConfigError:
        return False
    return True


class SpeakerWorker:
    """Embeds the windows of the registered clients, oldest first, :data:`MAX_BATCH` at a time. ``load`` makes the
    embedder (on the worker thread, once); ``available`` says whether diarization may be offered at all."""

    def __init__(
        self,
        metrics: ServerMetrics,
        load: Callable[[], Embedder] = load_speaker_encoder,
        available: bool | None = None,
    ) -> None:
        self.metrics = metrics
        self._load = load
        self.available = speaker_model_available() if available is None else available
        self._embedder: Embedder | None = None
        self._failure: str | None = None  # the encoder could not be loaded: every client hears it at once
        self._clients: list[SpeakerClient] = []
        self._wakeup = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    def register(self, client: SpeakerClient) -> None:
        if client not in self._clients:
            self._clients.append(client)

    def unregister(self, client: SpeakerClient) -> None:
        with contextlib.suppress(ValueError):
            self._clients.remove(client)

    def notify(self) -> None:
        """A client may have windows to embed."""
        self._wakeup.set()

    def next_batch(self) -> list[tuple[SpeakerClient, list[EmbedRequest]]]:
        """Windows to embed now, per client, at most :data:`MAX_BATCH` in all; the clients served move to the back
        of the line, so that one with a long backlog does not starve the others."""
        batch: list[tuple[SpeakerClient, list[EmbedRequest]]] = []
        room = MAX_BATCH
        served: list[SpeakerClient] = []
        for client in list(self._clients):
            if room <= 0:
                break
            if not client.wants_embedding:
                continue
            if self._failure is not None:
                client.windows_to_embed()
                client.receive_embed_failure(self._failure)
                continue
            # at most the batch's room: a client with a backlog (audio sent faster than real time) is embedded a
            # batch at a time, so the encoder's memory is a batch's whatever a client sends
            requests = client.windows_to_embed(room)
            batch.append((client, requests))
            served.append(client)
            room -= len(requests)
        for client in served:
            self._clients.remove(client)
            self._clients.append(client)
        return batch

    def warm_up(self) -> None:
        """Load the encoder and embed a full batch of faint noise (blocks: call on the worker thread only), so that
        the model and the buffers of a batch are resident before a client asks for labels: neither the load's time
        nor its memory falls on the first diarizing stream."""
        if self._embedder is None:
            self._embedder = self._load()
        noise = np.random.default_rng(0).normal(0.0, 0.01, (MAX_BATCH, SpeakerOptions().window_samples))
        self._embedder.embed_windows(noise.astype(np.float32))

    def embed(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Embed a batch. Blocks: call on the worker thread only."""
        if self._embedder is None:
            self._embedder = self._load()
        return self._embedder.embed_windows(windows)

    def deliver(
        self, batch: Sequence[tuple[SpeakerClient, list[EmbedRequest]]], vectors: npt.NDArray[np.float32]
    ) -> None:
        row = 0
        for client, requests in batch:
            client.receive_embeddings(requests, vectors[row : row + len(requests)])
            row += len(requests)

    def fail(self, batch: Sequence[tuple[SpeakerClient, list[EmbedRequest]]], reason: str) -> None:
        for client, _ in batch:
            client.receive_embed_failure(reason)

    # -- running ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is not None:
            raise InvalidState("the speaker worker is already running")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamer-speakers")
        self._task = asyncio.get_running_loop().create_task(self.run(), name="streamer-speakers")

    async def stop(self) -> None:
        """Stop; every client still waiting for embeddings hears that diarization stopped, so nothing waits on it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for client in list(self._clients):
            client.receive_embed_failure("the server is shutting down")
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._executor is None:
            raise InvalidState("call start(), which creates the worker thread, instead of run()")
        if self.available:
            try:
                await asyncio.shield(loop.run_in_executor(self._executor, self.warm_up))
            except Exception as error:
                logger.exception("the voice encoder could not be loaded")
                self._failure = f"the voice encoder failed ({type(error).__name__})"
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch = self.next_batch()
            if not batch:
                continue
            self._wakeup.set()  # more may wait behind this batch
            windows = np.stack([r.audio for _, requests in batch for r in requests])
            started = time.perf_counter()
            try:
                vectors = await asyncio.shield(loop.run_in_executor(self._executor, self.embed, windows))
            except asyncio.CancelledError:
                self.fail(batch, "the server is shutting down")
                raise
            except Exception as error:
                logger.exception("the voice encoder failed on %d windows", len(windows))
                reason = f"the voice encoder failed ({type(error).__name__})"
                if self._embedder is None:
                    self._failure = reason  # it never loaded: no later batch would fare better
                self.fail(batch, reason)
                continue
            finally:
                self.metrics.speaker_busy_seconds.inc(time.perf_counter() - started)
            self.metrics.speaker_windows.inc(len(windows))
            self.deliver(batch, vectors)
