"""``streamer bench gains``: what each engine optimisation buys, measured side by side in one run.

The streaming windows are recorded once: ``--streams`` streams run the streaming core (sans-I/O, no server) over the
long-form recording, each starting at a different point of it, decoded by the full engine in lockstep. Every
configuration then decodes exactly those windows as the scheduler does when the engine is saturated: the k-th
window of every stream in one engine call. Each configuration turns one optimisation off (or, the last, all of
them); the table prints engine milliseconds and decoder passes per window and the ratio to the full engine.
``streams at 1 window/s`` is 1000 / (ms per window): how many streams' one-second updates the engine could decode
back to back, an upper bound that ``streamer bench capacity`` turns into a measured, latency-bound number.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.core.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from streamer.core.stream import StreamCore
    from streamer.engine.types import DecodeRequest, Engine

__all__ = ["VARIANTS", "Variant", "configure_parser", "run"]


@dataclass(frozen=True)
class Variant:
    """One engine configuration of the comparison."""

    name: str
    turned_off: str  # what it lacks compared with the full engine
    encoder_precision: str | None = None
    draft_decoding: bool = True
    incremental_features: bool = True
    batched: bool = True  # the windows of all streams in one engine call, or one call per window
    early_stop: bool = True  # the streaming decode options' loop stop and token budget
    projection_precision: str | None = None  # None: the engine's default (INT8 on the CPU)


VARIANTS: tuple[Variant, ...] = (
    Variant("full engine", "nothing (the default)"),
    Variant("one stream at a time", "batching across streams", batched=False),
    Variant("no draft", "draft-verified decoding", draft_decoding=False),
    Variant("whole log-mel", "incremental log-mel", incremental_features=False),
    Variant("no early stop", "loop stop and token budget", early_stop=False),
    Variant("fp32 encoder", "half-precision encoder (bf16 on this CPU)", encoder_precision="fp32"),
    Variant("int8 encoder", "bf16 encoder, INT8 instead", encoder_precision="int8"),
    Variant("fp32 projection", "INT8 vocabulary projection", projection_precision="fp32"),
    Variant(
        "none of them",
        "all of the above (fp32 encoder)",
        encoder_precision="fp32",
        projection_precision="fp32",
        draft_decoding=False,
        incremental_features=False,
        batched=False,
        early_stop=False,
    ),
)


@dataclass(frozen=True)
class VariantMeasured:
    variant: Variant
    windows: int
    seconds: float
    passes: int

    @property
    def ms_per_window(self) -> float:
        return 1000 * self.seconds / self.windows if self.windows else 0.0

    @property
    def passes_per_window(self) -> float:
        return self.passes / self.windows if self.windows else 0.0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from streamer.bench.harness import LIBRISPEECH_LONGFORM

    parser.add_argument("--file", type=Path, default=LIBRISPEECH_LONGFORM, help="the recording (default: LibriSpeech)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams (default: 8)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds each stream sends (default: 30)")
    parser.add_argument("--model", default="tiny.en", help="model (default: tiny.en)")
    parser.add_argument(
        "--only", action="append", default=None, help="measure just this variant (repeatable; 'full engine' is kept)"
    )
    add_docs_argument(parser)


def record_windows(
    engine: Engine, audio: npt.NDArray[np.float32], streams: int, seconds: float
) -> list[list[DecodeRequest]]:
    """Each stream's decode requests, in order, from running the streaming core over ``audio`` (stream ``k``
    starting ``k / streams`` of the way into it), with every ready window of every stream decoded together."""
    import numpy as np

    from streamer.bench.harness import tiled
    from streamer.core.options import CoreOptions, for_the_model
    from streamer.core.stream import StreamCore
    from streamer.core.units import SAMPLE_RATE
    from streamer.engine import StreamId, silero_vad

    samples = np.asarray(audio, dtype=np.float32)
    length = int(seconds * SAMPLE_RATE)
    options = for_the_model(CoreOptions(), engine.info.multilingual)
    classifiers = silero_vad.CLASSIFIERS
    cores = [StreamCore(options, StreamId(f"gains-{k}"), vad_classifiers=classifiers) for k in range(streams)]
    inputs = [tiled(np.roll(samples, -k * len(samples) // streams), seconds) for k in range(streams)]
    recorded: list[list[DecodeRequest]] = [[] for _ in range(streams)]
    chunk = SAMPLE_RATE // 10
    for at in range(0, length + chunk, chunk):
        now = at / SAMPLE_RATE
        for core, signal in zip(cores, inputs, strict=True):
            if at < length:
                core.receive_audio(signal[at : at + chunk])
            elif not core.done:
                core.receive_end_of_stream()
        _decode_ready(engine, cores, recorded, now)
    while any(core.pending for core in cores):
        if not _decode_ready(engine, cores, recorded, length / SAMPLE_RATE):
            break
    return recorded


def _decode_ready(engine: Engine, cores: list[StreamCore], recorded: list[list[DecodeRequest]], now: float) -> bool:
    ready = [(k, request) for k, core in enumerate(cores) for request in core.windows_to_decode()]
    if not ready:
        return False
    results = engine.decode([request for _, request in ready])
    for (k, request), result in zip(ready, results, strict=True):
        recorded[k].append(request)
        cores[k].receive_decode_result(result)
    return True


def measure(variants: Sequence[Variant], model: str, recorded: list[list[DecodeRequest]]) -> list[VariantMeasured]:
    """Decode the recorded windows with each variant's engine (all loaded at once): round ``k`` holds the k-th window
    of every stream, and every variant decodes round ``k`` before any decodes round ``k + 1``, so a slow spell of
    a shared machine falls on all of them alike."""
    from streamer.engine import EngineOptions, load_engine

    engines = [
        load_engine(
            model,
            EngineOptions(
                encoder_precision=v.encoder_precision,
                draft_decoding=v.draft_decoding,
                incremental_features=v.incremental_features,
                projection_precision=v.projection_precision,
            ),
        )
        for v in variants
    ]
    rounds = max((len(windows) for windows in recorded), default=0)
    windows = [0] * len(variants)
    passes = [0] * len(variants)
    seconds = [0.0] * len(variants)
    for index in range(rounds):
        for slot, (variant, engine) in enumerate(zip(variants, engines, strict=True)):
            batch = [_variant_request(variant, w[index]) for w in recorded if index < len(w)]
            for call in [batch] if variant.batched else [[request] for request in batch]:
                began = time.perf_counter()
                results = engine.decode(call)
                seconds[slot] += time.perf_counter() - began
                windows[slot] += len(call)
                passes[slot] += sum(r.decoder_passes for r in results)
    for engine in engines:
        engine.close()
    return [VariantMeasured(v, windows[i], seconds[i], passes[i]) for i, v in enumerate(variants)]


def _variant_request(variant: Variant, request: DecodeRequest) -> DecodeRequest:
    if variant.early_stop:
        return request
    return replace(request, options=replace(request.options, max_tokens_per_second=None, stop_on_repeats=None))


def format_results(results: list[VariantMeasured]) -> str:
    full = results[0].ms_per_window
    rows = [
        [
            m.variant.name,
            m.variant.turned_off,
            f"{m.ms_per_window:.0f}",
            f"{m.passes_per_window:.1f}",
            f"{m.ms_per_window / full:.2f}x" if full else "-",
            f"{1000 / m.ms_per_window:.1f}" if m.ms_per_window else "-",
        ]
        for m in results
    ]
    header = ["configuration", "turned off", "ms/window", "passes/window", "time vs full", "streams at 1 window/s"]
    return format_table(header, rows)


def run(args: argparse.Namespace) -> int:
    from streamer.engine import load_engine
    from streamer.offline.audiofile import load_audio

    if args.streams < 1:
        raise ConfigError("--streams must be at least 1")
    if args.seconds <= 0:
        raise ConfigError("--seconds must be > 0")
    if not args.file.exists():
        raise ConfigError(f"{args.file}: no such file")
    variants = [v for v in VARIANTS if args.only is None or v.name in args.only or v is VARIANTS[0]]
    unknown = set(args.only or ()) - {v.name for v in VARIANTS}
    if unknown:
        raise ConfigError(f"unknown variant(s) {', '.join(sorted(unknown))}: use {', '.join(v.name for v in VARIANTS)}")
    machine = machine_note()
    audio = load_audio(args.file).samples
    print(f"recording the windows of {args.streams} streams of {args.seconds:g} s ...", file=sys.stderr)
    recorder = load_engine(args.model)
    recorded = record_windows(recorder, audio, args.streams, args.seconds)
    recorder.close()
    print(f"decoding them with {len(variants)} engines, interleaved ...", file=sys.stderr)
    results = measure(variants, args.model, recorded)
    total = sum(len(w) for w in recorded)
    body = (
        f"{args.streams} streams of {args.seconds:g} s from `{args.file.name}`, {total} windows, decoded in "
        f"{max(len(w) for w in recorded)} rounds of one window per stream; each configuration has its own engine and "
        "decodes the same windows, the configurations taking turns round by round.\n\n" + format_results(results)
    )
    print(body)
    figures = {
        "machine": machine,
        "file": str(args.file),
        "streams": args.streams,
        "windows": total,
        "results": [
            {
                "configuration": m.variant.name,
                "turned_off": m.variant.turned_off,
                "ms_per_window": m.ms_per_window,
                "passes_per_window": m.passes_per_window,
                "windows": m.windows,
            }
            for m in results
        ],
    }
    report = Report("gains", command_line("gains", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
