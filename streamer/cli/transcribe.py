"""``streamer transcribe``: audio files in, transcripts out (:func:`streamer.offline.transcribe.transcribe`), one
line per bad file while the others still run; and the engine's options, shared with ``eval``, ``serve`` and the
benchmarks (:func:`add_engine_arguments`, :func:`engine_options_from`)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, TextIO

from streamer.core.errors import ConfigError, ModelError
from streamer.core.units import samples_to_seconds
from streamer.engine.types import MIN_ENCODER_PAD_SECONDS, DecodeOptions, Engine
from streamer.offline.transcribe import (
    OFFLINE_ENCODER_PAD_SECONDS,
    TranscribeOptions,
    check_engine_serves,
    transcribe,
)

if TYPE_CHECKING:
    from streamer.engine import EngineOptions

__all__ = ["add_engine_arguments", "configure_parser", "engine_options_from", "run"]

logger = logging.getLogger(__name__)

_EXTENSIONS = {"text": "txt", "json": "json", "srt": "srt", "vtt": "vtt", "rttm": "rttm"}


def add_engine_arguments(parser: argparse.ArgumentParser, *, model: bool = True) -> None:
    """``--model`` and the engine's precision and placement options (shared with ``eval`` and ``serve``)."""
    from streamer.engine import PRECISIONS

    if model:
        parser.add_argument("--model", default="tiny.en", help="model name or directory (default: tiny.en)")
    engine = parser.add_argument_group(
        "engine placement (default: bf16 encoder where the CPU's kernels run it, else int8; fp16 on a GPU)"
    )
    engine.add_argument("--encoder-precision", choices=PRECISIONS, help="precision of the encoder")
    engine.add_argument("--decoder-precision", choices=PRECISIONS, help="precision of the decoder")
    engine.add_argument("--device", choices=["cpu", "cuda"], help="device of both encoder and decoder")
    engine.add_argument("--encoder-device", help="device of the encoder: cpu or cuda[:N] (overrides --device)")
    engine.add_argument("--decoder-device", help="device of the decoder: cpu or cuda[:N] (overrides --device)")
    engine.add_argument("--threads", type=int, help="CPU threads for the model (default: one per core)")
    engine.add_argument(
        "--weight-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="load the model's weights as cast and quantized on an earlier run, from the cache folder (default: on)",
    )


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="audio files (wav, flac, ogg, mp3; more with ffmpeg)")
    add_engine_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=list(_EXTENSIONS), default="text", help="output format (default: text)")
    out.add_argument("--output-dir", metavar="DIR", help="write FILE's stem plus .txt/.json/.srt/.vtt here")
    out.add_argument("--word-timestamps", action="store_true", help="time every word (JSON words, DTW alignment)")
    out.add_argument(
        "--diarize",
        action="store_true",
        help="label who speaks: a speaker on every word and segment (JSON, SRT, VTT), and --format rttm; needs the "
        "Resemblyzer weights (pip install --no-deps Resemblyzer==0.1.4)",
    )
    out.add_argument("--max-speakers", type=int, help="with --diarize: the most speakers (1 to 32)")
    out.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bar on stderr for long files (default: when stderr is a terminal)",
    )
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--language", help="ISO 639-1 code (default: detect; English for .en models)")
    decoding.add_argument("--task", choices=["transcribe", "translate"], default="transcribe")
    decoding.add_argument("--beam-size", type=int, default=1, help="1 is greedy (default)")
    decoding.add_argument("--initial-prompt", default="", help="text to condition the first window on")
    decoding.add_argument(
        "--encoder-pad-seconds",
        type=float,
        default=OFFLINE_ENCODER_PAD_SECONDS,
        metavar="S",
        help=(
            f"the encoder reads each window's audio and S s of the silence after it, not Whisper's whole 30 s "
            f"({MIN_ENCODER_PAD_SECONDS:g} to 30; 30 is the whole window; default: %(default)s)"
        ),
    )
    decoding.add_argument(
        "--condition-on-previous-text",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prompt each window with the text before it (default: on)",
    )
    decoding.add_argument(
        "--vad", action=argparse.BooleanOptionalAction, default=True, help="skip silence (default: on)"
    )


def engine_options_from(args: argparse.Namespace) -> EngineOptions:
    """The :class:`~streamer.engine.EngineOptions` the command-line flags ask for."""
    from streamer.engine import EngineOptions

    return EngineOptions(
        encoder_precision=args.encoder_precision,
        decoder_precision=args.decoder_precision,
        encoder_device=args.encoder_device or args.device,
        decoder_device=args.decoder_device or args.device,
        threads=args.threads,
        weight_cache=args.weight_cache,
    )


def _transcribe_options_from(args: argparse.Namespace) -> TranscribeOptions:
    from streamer.engine.types import Task

    decode = DecodeOptions(
        language=args.language,
        task=Task(args.task),
        beam_size=args.beam_size,
        word_timestamps=args.word_timestamps or getattr(args, "diarize", False),  # --diarize labels words
        encoder_pad_seconds=args.encoder_pad_seconds,
    )
    options = TranscribeOptions(
        decode=decode,
        vad=TranscribeOptions().vad if args.vad else None,
        condition_on_previous_text=args.condition_on_previous_text,
        initial_prompt=args.initial_prompt,
    )
    options.validate()
    return options


class _ProgressBar:
    """``name [#####.....]  48%  01:47/03:41`` redrawn in place on stderr."""

    WIDTH = 30

    def __init__(self, name: str, stream: TextIO) -> None:
        self.name = name
        self.stream = stream

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        clock = f"{_clock(done)}/{_clock(total)}"
        self.stream.write(f"\r{self.name} [{bar}] {fraction:4.0%}  {clock}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def _clock(samples: int) -> str:
    minutes, seconds = divmod(int(samples_to_seconds(samples)), 60)
    return f"{minutes:02d}:{seconds:02d}"


def run(args: argparse.Namespace) -> int:
    """Transcribe each file in turn; a bad file is reported on one line and the others still run."""
    import sys
    import time
    from pathlib import Path

    from streamer.cli.main import exit_code_for
    from streamer.core.errors import StreamerError
    from streamer.engine import load_engine
    from streamer.engine.kernels import limit_openmp_spinning
    from streamer.offline.audiofile import load_audio
    from streamer.offline.formats import OutputFormat, render

    # 1. Check every option before loading anything. No warm-up decode: the first file's first window warms the
    #    same kernels, so a warm-up would only add a window's decode to the command's time (the engine probes its
    #    kernels instead, falling back from a default they cannot run as a warm-up would).
    options = _transcribe_options_from(args)
    engine_options = replace(engine_options_from(args), warmup=False)
    limit_openmp_spinning(args.threads)  # before torch loads libgomp: on cores other work takes (see kernels.py)
    engine_options.validate()
    output_format = OutputFormat(args.format)
    output_dir = Path(args.output_dir) if args.output_dir else None
    several = len(args.files) > 1
    if several and output_dir is None and output_format in (OutputFormat.SRT, OutputFormat.VTT):
        raise ConfigError(f"--format {output_format.value} with several files needs --output-dir")
    if output_format is OutputFormat.RTTM and not args.diarize:
        raise ConfigError("--format rttm needs --diarize")
    speaker_options = None
    if args.diarize or args.max_speakers is not None:
        from streamer.core.speakers import SpeakerOptions
        from streamer.engine.speaker_encoder import load_speaker_encoder, weights_path

        if not args.diarize:
            raise ConfigError("--max-speakers needs --diarize")
        speaker_options = SpeakerOptions(max_speakers=args.max_speakers)
        speaker_options.validate()
        weights_path()  # the package is there, before any file is read
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    engine: Engine | None = None
    status = 0
    audio_seconds = busy_seconds = 0.0
    try:
        for name in args.files:
            try:
                # 2. Decode the file first, so a bad file costs no model load.
                audio = load_audio(name)
                if engine is None:
                    engine = load_engine(args.model, engine_options)
                    check_engine_serves(engine, options.decode)
                long_file = len(audio.samples) > options.max_window
                progress = _ProgressBar(Path(name).name, sys.stderr) if show_progress and long_file else None
                # 3. Transcribe, timing the engine's work only (not the file decoding or the model load).
                started = time.perf_counter()
                transcript = transcribe(engine, audio.samples, options, progress=progress)
                busy_seconds += time.perf_counter() - started
                if speaker_options is not None:
                    from streamer.offline.speakers import diarize_transcript

                    transcript = diarize_transcript(transcript, audio.samples, load_speaker_encoder(), speaker_options)
                audio_seconds += audio.duration
            except (ConfigError, ModelError):
                raise  # nothing else can succeed either
            except StreamerError as error:
                print(f"streamer: error: {error}", file=sys.stderr)
                status = status or exit_code_for(error)
                continue
            except Exception as error:  # one file's surprise must not lose the others' transcripts
                logger.debug("transcribing %s failed", name, exc_info=True)
                print(f"streamer: error: {name}: {type(error).__name__}: {error}", file=sys.stderr)
                status = status or 1
                continue
            # 4. Write: JSON lines name their file; several text transcripts become "file<TAB>text" lines.
            document = render(transcript, output_format, file=name)
            if output_dir is not None:
                (output_dir / f"{Path(name).stem}.{_EXTENSIONS[output_format.value]}").write_text(document)
            elif output_format is OutputFormat.TEXT and several:
                sys.stdout.write(f"{name}\t{document}")
            else:
                sys.stdout.write(document)
            sys.stdout.flush()
    finally:
        if engine is not None:
            engine.close()
    # 5. The real-time factor: engine seconds per second of audio (below 1 is faster than real time).
    if audio_seconds > 0:
        rtf = busy_seconds / audio_seconds
        print(
            f"streamer: {audio_seconds:.1f} s of audio in {busy_seconds:.1f} s, real-time factor {rtf:.3f}",
            file=sys.stderr,
        )
    return status
