"""The ``streamer`` command line: one subcommand per job, each living in its own module.

Each command module exposes ``configure_parser(parser)`` and ``run(args) -> int`` and keeps heavy imports (torch,
transformers) inside ``run`` so that ``streamer --help`` stays instant. :func:`main` imports only the module of the
command it runs: ``streamer transcribe`` never loads the server's modules (asyncio, websockets, prometheus_client,
every endpoint), a tenth of a second or more of its start-up (issue 19).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

from streamer import __version__
from streamer.core.errors import AudioFileError, ConfigError, ModelError, ProtocolError, StreamerError

__all__ = ["EXIT_CODES", "LOADS_A_MODEL", "ONE_SHOT", "build_parser", "command_in", "entry", "main"]

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("streamer.cli.serve", "run the real-time WebSocket transcription server"),
    "stream": ("streamer.cli.terminal", "stream a file or the microphone to a server and show the live transcript"),
    "transcribe": ("streamer.cli.transcribe", "transcribe audio files offline"),
    "eval": ("streamer.cli.evaluate", "word error rate and speed over a TSV of audio and references"),
    "models": ("streamer.cli.models", "list the available models or export one"),
    "bench": ("streamer.bench", "benchmarks printed as side-by-side ratios"),
    "twilio-replay": ("streamer.cli.twilio_replay", "play a recording to /twilio as a Twilio Media Stream"),
    "top": ("streamer.cli.top", "a live view of a running server's sessions and engine (its /status)"),
}

# The commands whose process ends when they return, having loaded torch: :func:`entry` ends the process at once
# (``os._exit``) once their output is flushed. Python's orderly shutdown tears down every module torch loaded, about
# 0.45 s on this machine, a fifth of `streamer transcribe one.wav` from process start to exit (`streamer bench
# offline --startup`). Nothing of theirs runs at exit: their files are written and closed before they return.
ONE_SHOT = frozenset({"transcribe", "eval"})
# commands that load a model as they start: Python's collector is paused until it is loaded (streamer.startup)
LOADS_A_MODEL = frozenset({"transcribe", "eval", "serve"})

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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the ``argv`` it will parse, only the command named there gets its options (and
    its module imported): the others are listed by name and help line alone, which is all ``--help`` shows."""
    parser = argparse.ArgumentParser(prog="streamer", description="Streaming speech-to-text on Whisper.")
    parser.add_argument("--version", action="version", version=f"streamer {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = None if argv is None else command_in(argv)
    for name, (_module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv is None or name == chosen:
            _load(name).configure_parser(p)
    return parser


def command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def exit_code_for(error: StreamerError) -> int:
    for cls, code in EXIT_CODES.items():
        if isinstance(error, cls):
            return code
    return 1


def entry() -> NoReturn:
    """The process entry point (the ``streamer`` console script and ``python -m streamer``): :func:`main` on the
    process's arguments, then exit; a :data:`ONE_SHOT` command's process defers torch's meta registrations and skips
    Python's shutdown, and one of :data:`LOADS_A_MODEL` starts with Python's collector paused until the model is
    loaded (:mod:`streamer.startup`)."""
    command = command_in(sys.argv[1:])
    if command in LOADS_A_MODEL or command in ONE_SHOT:
        from streamer import startup

        if command in LOADS_A_MODEL:
            startup.pause_collection()
        if command in ONE_SHOT:  # a server lives long enough to keep torch whole, whatever it imports later
            startup.defer_meta_registrations()
    code = main()
    if command in ONE_SHOT:
        _exit_now(code)
    raise SystemExit(code)


def _exit_now(code: int) -> NoReturn:
    logging.shutdown()  # flushes the log handlers, as the interpreter's shutdown would
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`) or a stream closed: nothing to flush to
            code = code or 1
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line on ``argv`` (default: the process's arguments); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what a command that starts copies of itself passes on (streamer serve --workers)
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
