"""The ``streamer`` command line: one subcommand per job, each living in its own module.

Each command module exposes ``configure_parser(parser)`` and ``run(args) -> int`` and keeps heavy imports (torch,
transformers) inside ``run`` so that ``streamer --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from streamer import __version__
from streamer.core.errors import AudioFileError, ConfigError, ModelError, ProtocolError, StreamerError

__all__ = ["EXIT_CODES", "build_parser", "main"]

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("streamer.server.serve", "run the real-time WebSocket transcription server"),
    "stream": ("streamer.cli.terminal", "stream a file or the microphone to a server and show the live transcript"),
    "transcribe": ("streamer.offline.transcribe", "transcribe audio files offline"),
    "eval": ("streamer.offline.evaluate", "word error rate and speed over a TSV of audio and references"),
    "models": ("streamer.engine.models", "list the available models or export one"),
    "bench": ("streamer.bench", "benchmarks printed as side-by-side ratios"),
    "twilio-replay": ("streamer.cli.twilio_replay", "play a recording to /twilio as a Twilio Media Stream"),
    "top": ("streamer.cli.top", "a live view of a running server's sessions and engine (its /status)"),
}

# Documented exit codes (README): 0 ok, 1 failure, 2 bad usage/config, 3 model, 4 audio input, 5 server/protocol.
EXIT_CODES: dict[type[StreamerError], int] = {
    ConfigError: 2,
    ModelError: 3,
    AudioFileError: 4,
    ProtocolError: 5,
}


class CommandModule(Protocol):
    def configure_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(name: str) -> CommandModule:
    return cast(CommandModule, importlib.import_module(COMMANDS[name][0]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamer", description="Streaming speech-to-text on Whisper.")
    parser.add_argument("--version", action="version", version=f"streamer {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _load(name).configure_parser(p)
    return parser


def exit_code_for(error: StreamerError) -> int:
    for cls, code in EXIT_CODES.items():
        if isinstance(error, cls):
            return code
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``streamer`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return _load(args.command).run(args)
    except StreamerError as error:
        print(f"streamer: error: {error}", file=sys.stderr)
        return exit_code_for(error)
    except KeyboardInterrupt:
        print("streamer: interrupted", file=sys.stderr)
        return 130
