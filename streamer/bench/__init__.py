"""``streamer bench``: performance figures printed as ratios measured side by side in one run.

Timings on shared machines are noisy, so no claim is a single absolute number: each benchmark runs the contenders
interleaved on the same inputs in one process and prints their ratio. One module per benchmark.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Protocol, cast

__all__ = ["BENCHMARKS", "configure_parser", "run"]

# name -> (module, help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "offline": ("streamer.bench.offline", "real-time factor and WER of streamer against faster-whisper, same weights"),
    "stream": ("streamer.bench.stream", "one real-time stream: latency, decoder work, WER against offline"),
    "capacity": ("streamer.bench.capacity", "the most concurrent real-time streams that keep final latency"),
    "load": (
        "streamer.bench.load",
        "the host's CPU per real-time stream: many clients in several processes against serve --engine scripted",
    ),
    "quant": ("streamer.bench.quant", "WER, speed and peak memory of each engine precision configuration"),
    "narrowband": (
        "streamer.bench.narrowband",
        "WER on 8 kHz mu-law telephone audio next to the same speech at 16 kHz",
    ),
    "profile": (
        "streamer.bench.profile",
        "offline speed in batches, and kernel launches, host waits and GPU busy share per decoder pass",
    ),
    "draft": ("streamer.bench.draft", "decoder passes per update: draft verification against plain greedy"),
    "gains": ("streamer.bench.gains", "what each engine optimisation buys: the same streaming windows, each one off"),
    "soak": ("streamer.bench.soak", "server memory and latency over a long run of N streams"),
    "scheduling": ("streamer.bench.scheduling", "final latency with closing windows first against strict rotation"),
    "accuracy": (
        "streamer.bench.accuracy",
        "streamed against offline WER over the evaluation set, with the speaker-measured final delay",
    ),
    "nonspeech": (
        "streamer.bench.nonspeech",
        "silence, noise, tones and music through /v1/listen: words shown (must be 0)",
    ),
    "compare": (
        "streamer.bench.compare",
        "stream, capacity and soak: this tree against an earlier commit",
    ),
    "keywords": ("streamer.bench.keywords", "recall of rare words with and without keywords; prompts on non-speech"),
    "speakers": (
        "streamer.bench.speakers",
        "speaker labels on synthetic conversations: word attribution, speaker count, DER; --realtime through a server",
    ),
    "vad": ("streamer.bench.vad", "the voice detectors side by side: speech recall, non-speech rejection, CPU"),
}


class Benchmark(Protocol):
    def configure_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(name: str) -> Benchmark:
    return cast(Benchmark, importlib.import_module(BENCHMARKS[name][0]))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (_module, help_text) in BENCHMARKS.items():
        _load(name).configure_parser(sub.add_parser(name, help=help_text, description=help_text))


def run(args: argparse.Namespace) -> int:
    return _load(args.benchmark).run(args)
