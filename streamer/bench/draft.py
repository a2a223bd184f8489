"""``streamer bench draft``: decoder passes per streaming update with draft verification against plain greedy.

Two engines decode the same sequence of growing windows of one long recording (an update per ``--step-ms`` of
new audio, the window start moving forward like the streaming core's trims), one feeding each update the previous
hypothesis as a draft, one plain greedy. Prints passes per update for each, their ratio, the wall-time ratio, and
how many updates differed in any token (the two must be identical).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from streamer.bench.report import Report, add_docs_argument, command_line, machine_note, write_report

__all__ = ["configure_parser", "run"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from streamer.bench.harness import LIBRISPEECH_LONGFORM

    parser.add_argument("--file", type=Path, default=LIBRISPEECH_LONGFORM, help="the recording (default: LibriSpeech)")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds of it to stream (default: 40)")
    parser.add_argument("--step-ms", type=int, default=1000, help="new audio per update (default: 1000)")
    parser.add_argument("--trim-s", type=float, default=12.0, help="the window start moves on past this (default: 12)")
    parser.add_argument("--model", default="tiny.en", help="model (default: tiny.en)")
    add_docs_argument(parser)


def run(args: argparse.Namespace) -> int:
    from streamer.core.units import SAMPLE_RATE
    from streamer.engine import DecodeOptions, DecodeRequest, EngineOptions, StreamId, load_engine
    from streamer.offline.audiofile import load_audio

    machine = machine_note()
    audio = load_audio(args.file).samples[: int(args.seconds * SAMPLE_RATE)]
    engines = {
        "draft": load_engine(args.model, EngineOptions(draft_decoding=True)),
        "plain": load_engine(args.model, EngineOptions(draft_decoding=False)),
    }
    options = DecodeOptions(temperatures=(0.0,), word_timestamps=False)
    step = args.step_ms * SAMPLE_RATE // 1000
    trim = int(args.trim_s * SAMPLE_RATE)
    passes = dict.fromkeys(engines, 0)
    seconds = dict.fromkeys(engines, 0.0)
    updates = differing = 0
    start = 0
    for end in range(step, len(audio) + 1, step):
        if end - start > trim:
            start += trim // 2
        tokens = {}
        for name, engine in engines.items():
            request = DecodeRequest(
                audio=audio[start:end], options=options, stream_id=StreamId("bench"), stream_offset=start
            )
            began = time.perf_counter()
            result = engine.decode([request])[0]
            seconds[name] += time.perf_counter() - began
            passes[name] += result.decoder_passes
            tokens[name] = result.tokens
        updates += 1
        differing += tokens["draft"] != tokens["plain"]
    lines = [
        f"{args.file.name}, {len(audio) / SAMPLE_RATE:.0f} s, {updates} updates of {args.step_ms} ms of new audio; the "
        f"window start moves on by half of {args.trim_s:g} s whenever the window grows past it. Both engines decode "
        "every update, one after the other.",
        "",
        "```",
        f"{'decoding':<10} {'passes/update':>14} {'s/update':>9}",
        *(f"{name:<10} {passes[name] / updates:>14.1f} {seconds[name] / updates:>9.3f}" for name in engines),
        f"passes ratio (plain / draft): {passes['plain'] / passes['draft']:.2f}x",
        f"time ratio (plain / draft): {seconds['plain'] / seconds['draft']:.2f}x",
        f"updates whose tokens differ: {differing} of {updates}",
        "```",
    ]
    body = "\n".join(lines)
    print(f"draft benchmark: {body}")
    figures = {
        "machine": machine,
        "file": str(args.file),
        "updates": updates,
        "passes_per_update": {name: passes[name] / updates for name in engines},
        "seconds_per_update": {name: seconds[name] / updates for name in engines},
        "differing_updates": differing,
    }
    report = Report("draft", command_line("draft", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0 if differing == 0 else 1
