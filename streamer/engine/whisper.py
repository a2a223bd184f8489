"""The Whisper engine: a persistent, warmed-up model behind the narrow :class:`~streamer.engine.types.Engine`
interface. Batches share one encoder pass; each window is then decoded with its own KV cache."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from streamer.core.errors import InvalidState
from streamer.core.units import N_SAMPLES, SAMPLE_RATE, SAMPLES_PER_TOKEN
from streamer.engine.decoding import Decoder, Prepared, WindowDecoding
from streamer.engine.features import IncrementalFeatures, batch_log_mel, encoder_frames, log_mel_spectrogram
from streamer.engine.greedy import GreedyOutcome, GreedyRow, greedy_batch
from streamer.engine.kvcache import CrossKV
from streamer.engine.memory import release_free_memory
from streamer.engine.models import ModelFiles
from streamer.engine.runtime import Placement, Precision, WhisperRuntime
from streamer.engine.static import StaticBuffers, static_greedy_batch
from streamer.engine.timing import AlignedWord, AlignmentItem, align_words
from streamer.engine.tokenizer import WhisperTokenizer
from streamer.engine.types import (
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    EngineInfo,
    SegmentResult,
    StageTimings,
    StreamId,
    WordTiming,
)

__all__ = ["WhisperEngine"]

log = logging.getLogger(__name__)


class WhisperEngine:
    """Load once, :meth:`warmup`, then call :meth:`decode` from one worker thread for the process's lifetime."""

    def __init__(
        self,
        files: ModelFiles,
        encoder: Placement,
        decoder: Placement,
        *,
        threads: int | None = None,
        draft_decoding: bool = True,
        static_shapes: bool = False,
        cuda_graphs: bool = True,
        incremental_features: bool = True,
        device_features: bool = False,
        projection: Precision | None = None,
        weight_cache: bool = False,
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.files = files
        self.runtime = WhisperRuntime(files, encoder, decoder, projection, weight_cache=weight_cache)
        # decodes from the cached decode-only copy when the weights are cached; encodes once it first has to
        self.tokenizer = WhisperTokenizer(files.tokenizer, files.vocab_size, cache=weight_cache)
        self.decoder = Decoder(self.runtime, self.tokenizer, files.suppress_tokens, files.suppress_begin_tokens)
        self._info = EngineInfo(
            model=files.name,
            multilingual=self.tokenizer.multilingual,
            encoder=str(encoder),
            decoder=str(decoder),
            # the codes with a <|code|> token (none in an English-only vocabulary: then "en" alone)
            languages=frozenset(self.tokenizer.language_tokens),
        )
        # feed each stream's previous hypothesis as a draft (see streamer.engine.greedy); off gives plain greedy
        self.draft_decoding = draft_decoding
        # greedy windows decoded in static shapes with one host read per pass (streamer.engine.static): a GPU's path
        self._greedy: Callable[..., list[GreedyOutcome]] = greedy_batch
        if static_shapes:  # its buffers (and CUDA graphs) kept from batch to batch
            self._greedy = partial(static_greedy_batch, buffers=StaticBuffers(self.runtime, graphs=cuda_graphs))
        self._drafts: dict[StreamId, _Draft] = {}
        # windows of a batch encoded each over its own span (see _decode)
        self._own_spans = (
            self.runtime.encodes_windows_apart and self.runtime.decoder_device.type == "cpu" and not static_shapes
        )
        # a batch's log-mel features computed on the encoder's device in one batched STFT (a GPU's path: no frames
        # reused, so no digests of each window on the host), else on the host
        self._device_features = device_features
        # each stream's log-mel frames, reused by its next window (off: every window computed whole)
        self._features = IncrementalFeatures() if incremental_features and not device_features else None
        self._lock = threading.Lock()  # decode() is documented single-threaded; the lock makes misuse safe
        self._closed = False

    @property
    def info(self) -> EngineInfo:
        return self._info

    def warmup(self) -> None:
        """Run one short window end to end so the first real request pays no start-up cost (a server's first user);
        a one-shot command skips it and calls :meth:`probe`, since its first real window warms the same kernels.
        The tokenizer's encoder (the BPE merges, which prompts and keywords need) is loaded here too."""
        self.tokenizer.load_encoder()
        t = np.linspace(0, 1, SAMPLE_RATE, dtype=np.float32)
        tone = (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
        self.decode([DecodeRequest(audio=tone, options=DecodeOptions(temperatures=(0.0,)))])

    def probe(self) -> None:
        """Run each of the network's kernels once at a tiny size (see :meth:`WhisperRuntime.probe`); raises the
        RuntimeError of a precision torch's kernels cannot run here, as :meth:`warmup` would, in milliseconds."""
        with self._lock:
            self.runtime.probe()

    def forget_stream(self, stream_id: StreamId) -> None:
        """Drop the stream's draft (its previous hypothesis) and its log-mel frames."""
        self._drafts.pop(stream_id, None)
        if self._features is not None:
            self._features.forget(stream_id)

    def close(self) -> None:
        self._closed = True
        if self._features is not None:
            self._features.close()

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        """Decode a batch (one shared encoder pass); blocks; results in request order."""
        if self._closed:
            raise InvalidState("the engine is closed")
        if not requests:
            return []
        for request in requests:
            request.options.validate()
            if len(request.audio) > N_SAMPLES:
                raise ValueError(f"request {request.request_id}: a window holds at most 30 s of audio")
        with self._lock:
            try:
                return self._decode(requests)
            finally:
                release_free_memory()  # the batch's activations go back to the kernel: resident memory stays flat

    @torch.inference_mode()
    def _decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        share = 1 / len(requests)
        t0 = time.perf_counter()
        audio = [np.asarray(r.audio, dtype=np.float32) for r in requests]
        spans = [encoder_frames(len(a), r.options.encoder_pad_seconds) for r, a in zip(requests, audio, strict=True)]
        frames = max(spans)
        if self._device_features:
            features = batch_log_mel(audio, frames, self.runtime.encoder_device)
        elif self._features is None:
            features = log_mel_spectrogram(audio)
        else:
            windows = [(r.stream_id, r.stream_offset, a) for r, a in zip(requests, audio, strict=True)]
            features = self._features.compute(windows)
        if frames < features.shape[-1]:
            features = features[..., :frames]
        t1 = time.perf_counter()
        # each window over its own span where the encoder takes them one at a time and the decoder masks the
        # shorter ones' padding (on the CPU): as much silence as it would read alone, whoever shares its batch.
        # Else (a GPU's one product for the batch, and its static shapes) one span, the longest
        own_spans = self._own_spans and len(set(spans)) > 1
        states = self.runtime.encode(features, spans if own_spans else None)
        del features
        # the encoder's activations (tens of MB) are freed but stay in the heap, under the cross-attention keys and
        # values allocated next: handing them back now keeps the batch's peak to the larger of the two, not the sum
        release_free_memory()
        t2 = time.perf_counter()
        batch_cross = self.runtime.cross_kv(states)
        if own_spans:
            batch_cross.lengths = [span // 2 for span in spans]
        del states  # the features and states of a batch of 3: 6 MB that decoding no longer reads
        crosses = [batch_cross.row(i) for i in range(len(requests))]
        prepared = [
            self.decoder.prepare(c, r.options, r.prompt, len(r.audio)) for c, r in zip(crosses, requests, strict=True)
        ]
        decoded = self._decode_greedy(requests, crosses, prepared)
        release_free_memory()  # the greedy loop's logits and caches, before the alignment pass allocates its own
        t3 = time.perf_counter()
        decoder_seconds = {i: (t3 - t2) * share for i in decoded}
        for index, request in enumerate(requests):
            if index not in decoded:  # beam search or sampling first: one window at a time
                start = time.perf_counter()
                decoded[index] = self.decoder.decode(crosses[index], request.options, request.prompt, prepared[index])
                decoder_seconds[index] = time.perf_counter() - start
        start = time.perf_counter()
        aligned = self._align(requests, crosses, decoded)
        align_share = (time.perf_counter() - start) / len(requests)
        results = []
        for index, request in enumerate(requests):
            start = time.perf_counter() - align_share
            window = decoded[index]
            segments = self._segments(window, request, aligned[index])
            if request.stream_id is not None and self.draft_decoding:
                self._drafts[request.stream_id] = _Draft(window.tokens, request.stream_offset)
            timings = StageTimings(
                features=(t1 - t0) * share,
                encoder=(t2 - t1) * share,
                decoder=decoder_seconds[index] + time.perf_counter() - start,
            )
            results.append(
                DecodeResult(
                    request_id=request.request_id,
                    text="".join(s.text for s in segments),
                    language=window.language,
                    segments=segments,
                    avg_logprob=window.avg_logprob,
                    no_speech_prob=window.no_speech_prob,
                    compression_ratio=window.compression_ratio,
                    temperature=window.temperature,
                    decoder_passes=window.decoder_passes,
                    timings=timings,
                )
            )
        return results

    def _decode_greedy(
        self, requests: Sequence[DecodeRequest], crosses: list[CrossKV], prepared: list[Prepared]
    ) -> dict[int, WindowDecoding]:
        """Every request whose first temperature is 0 without beam search, decoded together in one batch with
        its stream's draft; those failing a quality check fall back to the next temperatures one by one."""
        chosen = [i for i, r in enumerate(requests) if r.options.temperatures[0] == 0 and r.options.beam_size == 1]
        rows = [
            GreedyRow(
                cross=crosses[i],
                initial=prepared[i].initial,
                sot_index=prepared[i].sot_index,
                sample_len=prepared[i].sample_len,
                options=requests[i].options,
                draft=self._draft_for(requests[i]),
            )
            for i in chosen
        ]
        outcomes = self._greedy(self.runtime, self.decoder.filters, self.tokenizer.special.eot, rows)
        decoded: dict[int, WindowDecoding] = {}
        for index, outcome in zip(chosen, outcomes, strict=True):
            request = requests[index]
            window = self.decoder.result(
                prepared[index],
                outcome.tokens,
                outcome.sum_logprob,
                outcome.no_speech_prob,
                0.0,
                outcome.passes,
                outcome.token_probs,
            )
            rest = request.options.temperatures[1:]
            if rest and self.decoder.needs_fallback(window, request.options):
                retry = replace(request.options, temperatures=rest)
                again = self.decoder.decode(crosses[index], retry, request.prompt, prepared[index])
                window = replace(again, decoder_passes=again.decoder_passes + outcome.passes)
            decoded[index] = window
        return decoded

    def _draft_for(self, request: DecodeRequest) -> list[int]:
        """The stream's previous hypothesis, its timestamps moved to the new window start."""
        if request.stream_id is None or not self.draft_decoding:
            return []
        draft = self._drafts.get(request.stream_id)
        if draft is None:
            return []
        shift = request.stream_offset - draft.offset
        if shift < 0 or shift % SAMPLES_PER_TOKEN:
            return []
        return shift_timestamps(draft.tokens, shift // SAMPLES_PER_TOKEN, self.tokenizer.special.timestamp_begin)

    def _is_silence(self, decoded: WindowDecoding, options: DecodeOptions) -> bool:
        """openai/whisper's skip rule: the model says no speech and is not confident in what it wrote."""
        if options.no_speech_threshold is None or decoded.no_speech_prob <= options.no_speech_threshold:
            return False
        return options.logprob_threshold is None or decoded.avg_logprob < options.logprob_threshold

    def _align(
        self, requests: Sequence[DecodeRequest], crosses: list[CrossKV], decoded: dict[int, WindowDecoding]
    ) -> list[list[AlignedWord]]:
        """Word timings of every window that asked for them, in one batched decoder pass."""
        items = []
        for index, request in enumerate(requests):
            window = decoded[index]
            wanted = request.options.word_timestamps and not self._is_silence(window, request.options)
            sot = self.tokenizer.sot_sequence(window.language, request.options.task)
            eot = self.tokenizer.special.eot
            probs = window.token_probs
            items.append(
                AlignmentItem(
                    cross=crosses[index],
                    sot_sequence=sot,
                    text_tokens=[t for t in window.tokens if t < eot] if wanted else [],
                    token_probs=None
                    if probs is None
                    else [p for t, p in zip(window.tokens, probs, strict=True) if t < eot],
                    num_samples=len(request.audio),
                    language=window.language,
                )
            )
        return align_words(self.runtime, self.tokenizer, self.files.alignment_heads, items)

    def _segments(
        self, decoded: WindowDecoding, request: DecodeRequest, words: list[AlignedWord]
    ) -> tuple[SegmentResult, ...]:
        if self._is_silence(decoded, request.options) or not decoded.tokens:
            return ()
        num_samples = len(request.audio)
        spans = split_segments(decoded.tokens, self.tokenizer.special.timestamp_begin, num_samples)
        segments = []
        word_index = 0
        for start, end, tokens in spans:
            text_tokens = [t for t in tokens if t < self.tokenizer.special.eot]
            text = self.tokenizer.decode(text_tokens)
            if not text.strip():
                continue
            seg_words: list[WordTiming] = []
            taken = 0
            while word_index < len(words) and taken < len(text_tokens):
                word = words[word_index]
                taken += len(word.tokens)
                word_index += 1
                if word.word.strip():
                    seg_words.append(WordTiming(word.word, word.start, max(word.start, word.end), word.probability))
            if seg_words:  # segment bounds from the words where the timestamps are coarse
                start = min(start, seg_words[0].start) if start >= seg_words[0].end else start
                end = max(end, seg_words[-1].end)
            segments.append(
                SegmentResult(
                    start=start, end=min(end, num_samples), text=text, tokens=tuple(tokens), words=tuple(seg_words)
                )  # fmt: skip
            )
        return tuple(segments)


@dataclass(frozen=True)
class _Draft:
    tokens: list[int]
    offset: int  # stream sample of the window start the tokens' timestamps are relative to


def shift_timestamps(tokens: list[int], shift: int, timestamp_begin: int) -> list[int]:
    """``tokens`` for a window that starts ``shift`` timestamp units later: segments that began before the new start
    are dropped, the timestamps of the rest move back by ``shift``."""
    if shift == 0:
        return list(tokens)
    out: list[int] = []
    keep = False
    expecting_open = True  # segments are <|open|> text <|close|>; the next timestamp after a close opens one
    for token in tokens:
        if token >= timestamp_begin:
            if expecting_open:
                keep = token - timestamp_begin >= shift
            expecting_open = not expecting_open
            if keep:
                out.append(token - shift)
        elif keep:
            out.append(token)
    return out


def split_segments(tokens: list[int], timestamp_begin: int, num_samples: int) -> list[tuple[int, int, list[int]]]:
    """Cut a window's tokens at consecutive timestamp pairs (openai/whisper ``transcribe``); spans in samples.

    Text after the last closed pair (the model ran out of window mid-segment) becomes a last segment that ends at
    the window's end, so nothing decoded is dropped.
    """
    is_ts = [t >= timestamp_begin for t in tokens]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    if len(tokens) >= 2 and is_ts[-1] and not is_ts[-2]:
        cuts.append(len(tokens))
    spans: list[tuple[int, int, list[int]]] = []
    last = 0
    for cut in cuts:
        piece = tokens[last:cut]
        stamps = [t for t in piece if t >= timestamp_begin]
        start = (stamps[0] - timestamp_begin) * SAMPLES_PER_TOKEN if stamps else 0
        end = (stamps[-1] - timestamp_begin) * SAMPLES_PER_TOKEN if stamps else num_samples
        spans.append((start, end, piece))
        last = cut
    rest = tokens[last:]
    if any(t < timestamp_begin for t in rest):
        stamps = [t for t in rest if t >= timestamp_begin]
        start = (stamps[0] - timestamp_begin) * SAMPLES_PER_TOKEN if stamps else (spans[-1][1] if spans else 0)
        spans.append((start, num_samples, rest))
    return spans
