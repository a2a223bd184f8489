"""``streamer bench offline``: streamer's engine against faster-whisper on the same tiny.en weights, same threads,
beam 1, interleaved file by file in one run; prints WER for each and the real-time-factor ratio."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.errors import ConfigError

__all__ = ["configure_parser", "run"]

DEFAULT_TSV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "librispeech" / "transcripts.tsv"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tsv", type=Path, default=DEFAULT_TSV, help="audio<TAB>reference list (default: LibriSpeech)")
    parser.add_argument("--model", default="tiny.en", help="bundled CTranslate2 model both engines load")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files")
    parser.add_argument("--config", default="default", help="streamer engine configuration (see streamer eval)")
    parser.add_argument("--compute-type", default="int8", help="faster-whisper compute type (int8, float32)")
    add_docs_argument(parser)


def run(args: argparse.Namespace) -> int:
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise ConfigError("this benchmark needs faster-whisper: pip install 'streamer[bench]'") from None
    from streamer.audiofile import load_audio
    from streamer.engine import CONFIGS, DecodeOptions, load_engine
    from streamer.engine.models import resolve
    from streamer.evaluate import read_dataset
    from streamer.normalize import normalize_english, word_error_rate
    from streamer.transcribe import TranscribeOptions, transcribe

    if args.config not in CONFIGS:
        raise ConfigError(f"unknown --config {args.config!r}: use one of {', '.join(CONFIGS)}")
    machine = machine_note()
    items = read_dataset(args.tsv)
    if args.limit:
        items = items[: args.limit]
    ours = load_engine(args.model, replace(CONFIGS[args.config], threads=args.threads))
    source = resolve(args.model)
    theirs = WhisperModel(str(source.directory), device="cpu", compute_type=args.compute_type, cpu_threads=args.threads)
    # both sides decode whole files without VAD, greedy, so the comparison is engine against engine
    options = TranscribeOptions(decode=DecodeOptions(word_timestamps=False), vad=None)
    refs: list[str] = []
    ours_hyps: list[str] = []
    theirs_hyps: list[str] = []
    ours_time = theirs_time = audio_seconds = 0.0
    for index, item in enumerate(items):
        audio = load_audio(item.path).samples
        audio_seconds += len(audio) / 16000
        refs.append(normalize_english(item.reference))
        # alternate who goes first so neither gets a systematically warmer cache
        order = ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours")
        for who in order:
            start = time.perf_counter()
            if who == "ours":
                text = transcribe(ours, audio, options).text
                ours_time += time.perf_counter() - start
                ours_hyps.append(normalize_english(text))
            else:
                segments, _ = theirs.transcribe(audio, beam_size=1, language="en", vad_filter=False)
                text = " ".join(s.text for s in segments)
                theirs_time += time.perf_counter() - start
                theirs_hyps.append(normalize_english(text))
        print(f"\r{index + 1}/{len(items)} files", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    ours_wer = word_error_rate(refs, ours_hyps).wer * 100
    theirs_wer = word_error_rate(refs, theirs_hyps).wer * 100
    ours_rtf, theirs_rtf = ours_time / audio_seconds, theirs_time / audio_seconds
    table = format_table(
        ["engine", "WER %", "RTF"],
        [
            [f"streamer {args.config}", f"{ours_wer:.2f}", f"{ours_rtf:.4f}"],
            [f"faster-whisper {args.compute_type}", f"{theirs_wer:.2f}", f"{theirs_rtf:.4f}"],
        ],
    )
    body = (
        f"{len(items)} files, {audio_seconds:.1f} s of audio (`{args.tsv.name}`), {args.threads} threads, beam 1, "
        "no VAD, the two engines taking turns file by file (who goes first alternates).\n\n"
        f"{table}\n\nspeed ratio (faster-whisper time / streamer time): {theirs_time / ours_time:.2f}x"
    )
    print(f"offline benchmark: {body}")
    figures = {
        "machine": machine,
        "files": len(items),
        "audio_seconds": audio_seconds,
        "threads": args.threads,
        "streamer": {"config": args.config, "wer": ours_wer, "rtf": ours_rtf},
        "faster_whisper": {"compute_type": args.compute_type, "wer": theirs_wer, "rtf": theirs_rtf},
        "speed_ratio": theirs_time / ours_time,
    }
    report = Report("offline", command_line("offline", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
