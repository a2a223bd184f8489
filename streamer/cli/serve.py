"""``streamer serve``: its command line, and the process around the server (:class:`streamer.app.App`): listen at
once, load the model off the event loop, serve until SIGTERM or SIGINT, then shut down.

The option builders here are shared with the benchmarks that start servers and streams of their own
(:func:`add_policy_arguments`, :func:`core_options_from`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamer.app import App
from streamer.cli.event_loop import run_event_loop
from streamer.cli.transcribe import add_engine_arguments, engine_options_from
from streamer.cli.workers import Supervisor, worker_place_from, worker_threads
from streamer.core.agreement import Policy
from streamer.core.errors import ConfigError
from streamer.core.options import CoreOptions
from streamer.core.vad import VadBackend
from streamer.engine.fake import ScriptedCost
from streamer.engine.types import MIN_ENCODER_PAD_SECONDS
from streamer.integrations.call_centre import TWILIO_AUTH_TOKEN_ENV, WEBHOOK_SECRET_ENV, CallCentreOptions
from streamer.integrations.delivery import DeliveryOptions
from streamer.integrations.hub import HubOptions
from streamer.integrations.twilio_session import TwilioOptions
from streamer.server import auth, logs
from streamer.server.listen_query import LISTEN_PATH
from streamer.server.ratelimit import RateLimitOptions
from streamer.server.redis_link import REDIS_URL_ENV, RedisOptions
from streamer.server.scheduler import SchedulerOptions
from streamer.server.serve import ServerConfig
from streamer.server.session_options import SessionOptions
from streamer.server.tracing import NO_TRACING, Tracer, otel_tracer

if TYPE_CHECKING:
    from streamer.engine import EngineOptions
    from streamer.engine.types import Engine

__all__ = [
    "add_auth_arguments",
    "add_call_centre_arguments",
    "add_policy_arguments",
    "add_scripted_cost_arguments",
    "auth_options_from",
    "call_centre_options_from",
    "config_from_args",
    "configure_parser",
    "core_options_from",
    "engine_loader_from",
    "load_vad",
    "max_batch_size_for",
    "run",
    "scripted_cost_from",
]

# ``--engine``: the model (the engine options below), or the model-free scripted engine
ENGINES = ("whisper", "scripted")
# windows per engine call with the decoder on a GPU (issue 37): a GPU steps a batch's rows together in about the time
# of one (measured on an H200: a decoder step 2.0 ms at batch 1, 1.7 ms at 64), so a window's wait is its batch's
# duration while the batch shares the work; bench/gpu.sh's profile and capacity sweep the size
GPU_MAX_BATCH_SIZE = 64
# decode results kept for identical windows (--cache-entries) with the decoder on a CPU. None with it on a GPU: the
# cache's key is a SHA-256 of each window's audio, taken on the engine's thread before every batch (about a
# millisecond for a 20 s window at SHA-256's ~2 GB/s), nothing beside a CPU's hundreds of milliseconds of engine time
# a window, but more than a GPU's share of one in a batch of 64 (the H200 reading above: 1.7 ms a decoder step for 64
# rows); live streams' windows never repeat, so only replays of the same clip lose it there
CPU_CACHE_ENTRIES = 256


class EngineLoader(Protocol):
    def __call__(self, config: ServerConfig) -> Engine:
        """Load and warm up the engine (blocks: run it off the event loop)."""
        ...


def configure_parser(parser: argparse.ArgumentParser) -> None:
    s = SessionOptions()
    q = SchedulerOptions()
    c = CoreOptions()
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (default: %(default)s)")
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument(
        "--max-sessions", type=int, default=q.max_sessions, help="refuse sessions beyond this (each worker's)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes on the one port, each with its own engine, taking connections by load; more than one "
        "needs --redis, which they share as replicas do (default: %(default)s)",
    )
    # what the supervisor of --workers tells each worker (streamer.cli.workers)
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-cores", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help=f"windows per engine call (default: {q.max_batch_size} on a CPU, {GPU_MAX_BATCH_SIZE} with a GPU decoder)",
    )
    parser.add_argument(
        "--round-robin",
        action="store_true",
        help="schedule windows in strict rotation (default: windows that close an utterance go first)",
    )
    add_opening_arguments(parser)
    parser.add_argument("--max-frame-bytes", type=int, default=s.max_frame_bytes, help="largest binary frame")
    parser.add_argument("--idle-timeout", type=float, default=s.idle_timeout, help="seconds without a frame")
    parser.add_argument(
        "--max-session-seconds", type=float, default=s.max_session_seconds, help="wall-clock limit of a session"
    )
    parser.add_argument(
        "--max-audio-rate",
        type=float,
        default=s.rate_limit.max_rate,
        help="sustained audio per wall-clock second, as a multiple of real time; 0: no limit (default: %(default)s)",
    )
    parser.add_argument(
        "--audio-burst-seconds",
        type=float,
        default=s.rate_limit.burst_seconds,
        help="seconds of audio a client may send ahead of --max-audio-rate (default: %(default)s)",
    )
    parser.add_argument(
        "--flush-timeout",
        type=float,
        default=s.flush_timeout,
        help="once a stream has ended, seconds the engine may go without progress (on it or any stream) before the "
        "rest of its audio is reported lost; it waits while the engine works. Every endpoint (default: %(default)s)",
    )
    parser.add_argument(
        "--resume-grace-seconds",
        type=float,
        default=s.resume_grace_seconds,
        help="how long a dropped session waits for its client to resume it; 0: no resume (default: %(default)s)",
    )
    parser.add_argument("--step-ms", type=int, default=c.step_ms, help="new speech between decodes (partials)")
    parser.add_argument("--endpoint-ms", type=int, default=c.endpoint_ms, help="pause that makes text final")
    add_policy_arguments(parser)
    parser.add_argument(
        "--cache-entries",
        type=int,
        default=None,
        help=f"decode results kept for identical windows; 0: no cache (default: {CPU_CACHE_ENTRIES} on a CPU, none "
        "with a GPU decoder, where hashing each window costs more than decoding it)",
    )
    parser.add_argument(
        "--no-diarization",
        dest="diarization",
        action="store_false",
        help="refuse speaker labels (diarize=true) even when the voice encoder's weights are installed",
    )
    parser.add_argument(
        "--log-format", choices=logs.LOG_FORMATS, default="text", help="json: one object per line (default: text)"
    )
    parser.add_argument(
        "--otel", action="store_true", help="OpenTelemetry spans per session and batch (needs the otel extra)"
    )
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=None,
        help=f"share resume, call followers and single-use tokens with other replicas through this Redis "
        f"(redis://host:6379/0; also ${REDIS_URL_ENV}); without it, all of that is per process",
    )
    add_engine_arguments(parser, model=False)
    add_scripted_arguments(parser)
    add_auth_arguments(parser)
    add_call_centre_arguments(parser)


def add_scripted_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine`` and the scripted engine's decode cost (:func:`streamer.engine.fake.scripted_engine`)."""
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="whisper",
        help="whisper: the model (--model); scripted: no model, a word every 0.35 s of any speech, each engine call "
        "taking --scripted-batch-ms + --scripted-window-ms per window of wall time, to load-test the host, a proxy "
        "or autoscaling (default: %(default)s)",
    )
    add_scripted_cost_arguments(parser)


def add_scripted_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """``--scripted-window-ms`` and ``--scripted-batch-ms``: the scripted engine's decode cost (:class:`ScriptedCost`;
    ``serve`` and ``streamer bench load``, which passes them on to the server it starts)."""
    cost = ScriptedCost()
    for flag, default, what in (
        ("--scripted-window-ms", cost.window_ms, "wall time each window of an engine call adds to it"),
        ("--scripted-batch-ms", cost.batch_ms, "fixed wall time of every engine call, whatever its size"),
    ):
        parser.add_argument(
            flag, type=float, default=default, metavar="MS", help=f"scripted engine: {what} (default: %(default)s)"
        )


def scripted_cost_from(args: argparse.Namespace) -> ScriptedCost:
    """The scripted engine's cost from :func:`add_scripted_cost_arguments`' options; validated."""
    cost = ScriptedCost(window_ms=args.scripted_window_ms, batch_ms=args.scripted_batch_ms)
    cost.validate()
    return cost


def engine_loader_from(args: argparse.Namespace) -> EngineLoader:
    """What loads the engine ``--engine`` names; raises :class:`~streamer.core.errors.ConfigError` for a bad
    scripted cost, or a scripted cost given to the model."""
    cost = scripted_cost_from(args)
    if args.engine == "scripted":
        return functools.partial(_load_scripted, cost)
    if cost != ScriptedCost():
        raise ConfigError("--scripted-window-ms and --scripted-batch-ms need --engine scripted")
    return lambda config: _load_engine(config)  # looked up when called: tests replace _load_engine


def add_opening_arguments(parser: argparse.ArgumentParser) -> None:
    """How the scheduler treats the windows that open an utterance's text (SchedulerOptions.openings_first)."""
    q = SchedulerOptions()
    parser.add_argument(
        "--openings-first",
        action=argparse.BooleanOptionalAction,
        default=q.openings_first,
        help="windows that open an utterance's text go right after closing ones, in batches of at most "
        "--opening-batch-size (default: %(default)s)",
    )
    parser.add_argument(
        "--opening-batch-size",
        type=int,
        default=q.opening_batch_size,
        help="with --openings-first, the most windows a batch holding an opening window takes (default: %(default)s)",
    )


def scheduler_openings(args: argparse.Namespace) -> dict[str, Any]:
    """The SchedulerOptions fields :func:`add_opening_arguments` sets (their defaults where a parser lacks them)."""
    q = SchedulerOptions()
    return {
        "openings_first": getattr(args, "openings_first", q.openings_first),
        "opening_batch_size": getattr(args, "opening_batch_size", q.opening_batch_size),
    }


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--policy``, ``--alignatt-margin-ms``, ``--agreement-margin-ms``, ``--commit-hold-ms``, ``--resume-after-ms``,
    ``--context-ms``, ``--first-step-ms``, the webrtc gate and ``--vad``: how a stream finds speech, cuts windows and
    commits words (``serve`` and the benchmarks)."""
    defaults = CoreOptions()
    parser.add_argument(
        "--policy",
        type=Policy,
        choices=list(Policy),
        default=defaults.policy,
        help="commit policy: local-agreement (words two successive windows agree on), alignatt (words the decoder's"
        " attention has moved past) or auto (local-agreement, alignatt for a window that waited for a busy engine);"
        " default: %(default)s",
    )
    parser.add_argument(
        "--auto-wait-ms",
        type=int,
        default=defaults.auto_wait_ms,
        help="auto: a window that ends more than a step and this much after the stream's previous one (it waited"
        " for a busy engine) commits by alignatt (default: %(default)s)",
    )
    parser.add_argument(
        "--alignatt-margin-ms",
        type=int,
        default=defaults.alignatt_margin_ms,
        help="alignatt: a word is final once its alignment ends this long before the decoded audio"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--agreement-margin-ms",
        type=int,
        default=defaults.agreement_margin_ms,
        help="local-agreement: an agreed word is final once it also ends this long before the decoded audio"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--commit-hold-ms",
        type=int,
        default=defaults.commit_hold_ms,
        help="words settled while an utterance goes on stay partial until its uncommitted speech is longer than this;"
        " the end point then commits it from one decode of the whole utterance (0: commit at once; default:"
        " %(default)s)",
    )
    parser.add_argument(
        "--closing-like-offline",
        action=argparse.BooleanOptionalAction,
        default=defaults.closing_like_offline,
        help="the window that closes an utterance is decoded as streamer transcribe decodes one (6 s of encoder"
        " silence, the temperature fallback; default: %(default)s)",
    )
    parser.add_argument(
        "--close-ahead",
        action=argparse.BooleanOptionalAction,
        default=defaults.close_ahead,
        help="the window that closes an utterance is decoded once its speech pauses (the VAD's 300 ms of padding"
        " after it), and an end point with no more speech then takes its words without a decode of its own (default:"
        " %(default)s)",
    )
    parser.add_argument(
        "--resume-after-ms",
        type=int,
        default=defaults.resume_after_ms,
        help="the window that closes an utterance and whose words stop this long before its speech does is decoded"
        " again from its last word but one, rather than committing the rest without words (0: never; default:"
        " %(default)s)",
    )
    parser.add_argument(
        "--context-ms",
        type=int,
        default=defaults.context_ms,
        help="an utterance's windows start up to this long before it, at a word already committed, so the model hears"
        " what led up to it (0: at the utterance; default: %(default)s)",
    )
    parser.add_argument(
        "--late-context-ms",
        type=int,
        default=defaults.late_context_ms,
        help="a window that waited for a busy engine (more than a step and --auto-wait-ms after its stream's last)"
        " reads at most this much context before its utterance (default: %(default)s)",
    )
    parser.add_argument(
        "--late-encoder-pad-seconds",
        type=_optional_seconds,
        default=defaults.late_encoder_pad_seconds,
        metavar="S",
        help="... and its encoder reads S s of silence after its audio ('none': as the other windows; default:"
        " %(default)s)",
    )
    parser.add_argument(
        "--first-step-ms",
        type=int,
        default=defaults.first_step_ms,
        help="windows come after this much new speech until the segment shows words (default: the step)",
    )
    parser.add_argument(
        "--vad-gate-db",
        type=float,
        default=defaults.vad.energy_gate_db,
        help="webrtc: a voiced frame must stand this many dB above the noise floor (default: %(default)s)",
    )
    parser.add_argument(
        "--vad-floor-ms",
        type=int,
        default=defaults.vad.noise_floor_ms,
        help="webrtc: the noise floor is the 10th percentile of this much recent audio (default: %(default)s)",
    )
    parser.add_argument(
        "--vad",
        type=VadBackend,
        choices=list(VadBackend),
        default=defaults.vad.backend,
        help="voice activity detector: webrtc (WebRTC's GMM detector) or silero (Silero's neural network; pip install"
        " 'streamer[silero]'), under the same hysteresis and padding; default: %(default)s",
    )
    parser.add_argument(
        "--encoder-pad-seconds",
        type=float,
        default=defaults.decode.encoder_pad_seconds,
        metavar="S",
        help=f"the encoder reads each window's audio and S s of the silence after it ({MIN_ENCODER_PAD_SECONDS:g} to"
        " 30; 30 is Whisper's whole window): fewer frames to encode, sooner partials; default:"
        " %(default)s",
    )


def _optional_seconds(text: str) -> float | None:
    """A number of seconds, or ``none``."""
    return None if text.strip().lower() == "none" else float(text)


def core_options_from(args: argparse.Namespace) -> CoreOptions:
    """The stream core's options from ``--step-ms``, ``--endpoint-ms`` and :func:`add_policy_arguments`' options."""
    defaults = CoreOptions()
    return dataclasses.replace(
        defaults,
        step_ms=args.step_ms,
        endpoint_ms=args.endpoint_ms,
        policy=getattr(args, "policy", defaults.policy),
        alignatt_margin_ms=getattr(args, "alignatt_margin_ms", defaults.alignatt_margin_ms),
        auto_wait_ms=getattr(args, "auto_wait_ms", defaults.auto_wait_ms),
        agreement_margin_ms=getattr(args, "agreement_margin_ms", defaults.agreement_margin_ms),
        commit_hold_ms=getattr(args, "commit_hold_ms", defaults.commit_hold_ms),
        resume_after_ms=getattr(args, "resume_after_ms", defaults.resume_after_ms),
        closing_like_offline=getattr(args, "closing_like_offline", defaults.closing_like_offline),
        close_ahead=getattr(args, "close_ahead", defaults.close_ahead),
        first_step_ms=getattr(args, "first_step_ms", defaults.first_step_ms),
        context_ms=getattr(args, "context_ms", defaults.context_ms),
        late_context_ms=getattr(args, "late_context_ms", defaults.late_context_ms),
        late_encoder_pad_seconds=getattr(args, "late_encoder_pad_seconds", defaults.late_encoder_pad_seconds),
        vad=dataclasses.replace(
            defaults.vad,
            backend=getattr(args, "vad", defaults.vad.backend),
            energy_gate_db=getattr(args, "vad_gate_db", defaults.vad.energy_gate_db),
            noise_floor_ms=getattr(args, "vad_floor_ms", defaults.vad.noise_floor_ms),
        ),
        decode=dataclasses.replace(
            defaults.decode,
            encoder_pad_seconds=getattr(args, "encoder_pad_seconds", defaults.decode.encoder_pad_seconds),
        ),
    )


def load_vad(options: CoreOptions) -> None:
    """Load the voice activity detector's model now, if it has one (``--vad silero``), so that a missing package is a
    :class:`~streamer.core.errors.ConfigError` at start-up rather than in every stream; the streams share it."""
    if options.vad.backend is VadBackend.SILERO:
        from streamer.engine.silero_vad import load_model

        load_model()


def decoder_on_gpu(args: argparse.Namespace, engine: EngineOptions) -> bool:
    """Whether the model's decoder will run on CUDA: placed there, or left to the machine and it has CUDA (never with
    the scripted engine)."""
    if getattr(args, "engine", "whisper") != "whisper":
        return False
    device = engine.decoder_device
    if device is None:
        from streamer.engine import cuda_available

        device = "cuda" if cuda_available() else "cpu"
    return device.startswith("cuda")


def max_batch_size_for(args: argparse.Namespace, engine: EngineOptions) -> int:
    """``--max-batch-size``, or its default for where the decoder runs: the scheduler's on a CPU (or with the
    scripted engine), :data:`GPU_MAX_BATCH_SIZE` with the decoder on a GPU (:func:`decoder_on_gpu`)."""
    if args.max_batch_size is not None:
        return int(args.max_batch_size)
    return GPU_MAX_BATCH_SIZE if decoder_on_gpu(args, engine) else SchedulerOptions().max_batch_size


def cache_entries_for(args: argparse.Namespace, engine: EngineOptions) -> int:
    """``--cache-entries``, or its default for where the decoder runs: :data:`CPU_CACHE_ENTRIES` on a CPU (or with
    the scripted engine, whose cache lookups are host work to measure), none with the decoder on a GPU."""
    if args.cache_entries is not None:
        return int(args.cache_entries)
    return 0 if decoder_on_gpu(args, engine) else CPU_CACHE_ENTRIES


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's configuration from ``streamer serve``'s command line (and environment); validated."""
    engine = engine_options_from(args)
    if getattr(args, "workers", 1) < 1:
        raise ConfigError("--workers must be at least 1")
    placed = worker_place_from(args)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        scheduler=SchedulerOptions(
            max_batch_size=max_batch_size_for(args, engine),
            max_sessions=args.max_sessions,
            finals_first=not args.round_robin,
            **scheduler_openings(args),
        ),
        session=dataclasses.replace(
            SessionOptions(),
            max_frame_bytes=args.max_frame_bytes,
            idle_timeout=args.idle_timeout,
            max_session_seconds=args.max_session_seconds,
            rate_limit=RateLimitOptions(max_rate=args.max_audio_rate, burst_seconds=args.audio_burst_seconds),
            resume_grace_seconds=args.resume_grace_seconds,
            flush_timeout=args.flush_timeout,
        ),
        core=core_options_from(args),
        auth=auth_options_from(args, os.environ),
        engine=engine,
        cache_entries=cache_entries_for(args, engine),
        diarization=args.diarization,
        redis=RedisOptions(url=getattr(args, "redis", None) or os.environ.get(REDIS_URL_ENV) or None),
        listen_fd=None if placed is None else placed[0],
        worker=None if placed is None else placed[1],
    )
    config.validate()
    if getattr(args, "workers", 1) > 1 and not config.redis.enabled:
        raise ConfigError(
            "--workers above 1 needs --redis URL (or $" + REDIS_URL_ENV + "): the workers share resume, call followers "
            "and single-use tokens through it, as replicas do"
        )
    return config


def run(args: argparse.Namespace) -> int:
    """``streamer serve``: listen at once, load the model, serve until SIGTERM or SIGINT, then shut down. With
    ``--workers N`` (N > 1), this process supervises N such servers on its port (:mod:`streamer.cli.workers`)."""
    config = config_from_args(args)
    if args.workers > 1 and config.worker is None:
        call_centre_options_from(args, os.environ)  # refused here rather than in every worker
        logs.configure(args.log_format)
        threads = worker_threads(args.workers, args.threads)
        argv = getattr(args, "argv", None) or sys.argv[1:]
        return Supervisor(argv, config.host, config.port, args.workers, threads).run()
    load = engine_loader_from(args)
    call_centre = call_centre_options_from(args, os.environ)
    load_vad(config.core)
    logs.configure(args.log_format)
    tracer = otel_tracer() if args.otel else NO_TRACING
    run_event_loop(_serve(config, call_centre, tracer, load))
    return 0


def _load_engine(config: ServerConfig) -> Engine:
    """Load and warm up the model (blocks for seconds: run it off the event loop)."""
    from streamer.engine import load_engine  # heavy: torch and the model
    from streamer.engine.cache import CachingEngine

    engine = load_engine(config.model, config.engine)
    return CachingEngine(engine, max_entries=config.cache_entries) if config.cache_entries else engine


def _load_scripted(cost: ScriptedCost, config: ServerConfig) -> Engine:
    """The scripted engine at ``cost``, behind the same cache as the model: its lookups are host work too."""
    from streamer.engine.cache import CachingEngine
    from streamer.engine.fake import scripted_engine

    engine = scripted_engine(cost)
    return CachingEngine(engine, max_entries=config.cache_entries) if config.cache_entries else engine


async def _serve(
    config: ServerConfig,
    call_centre: CallCentreOptions,
    tracer: Tracer = NO_TRACING,
    load: EngineLoader | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine: Engine | None = None
    async with App(config, None, tracer, call_centre) as server:
        print(f"streamer: listening on ws://{config.host}:{server.port}{LISTEN_PATH}", file=sys.stderr)
        print(f"streamer: browser client at http://{config.host}:{server.port}/", file=sys.stderr)
        loading = asyncio.ensure_future(loop.run_in_executor(None, load or _load_engine, config))
        stopping = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {loading, stopping}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            engine = loading.result()
            server.set_engine(engine)
            print(f"streamer: model {engine.info.model} loaded; serving", file=sys.stderr)
            await stopping
        print("streamer: shutting down", file=sys.stderr)
    stopping.cancel()
    if engine is not None:
        engine.close()
    elif not loading.done():
        with contextlib.suppress(Exception):
            loading.cancel()


def add_call_centre_arguments(parser: argparse.ArgumentParser) -> None:
    """The call centre's options (:mod:`streamer.integrations.call_centre`): Twilio, followers, delivery."""
    group = parser.add_argument_group("call centre (Twilio, OpenAI Realtime, transcript delivery)")
    group.add_argument(
        "--twilio-auth-token",
        help=f"validate X-Twilio-Signature on /twilio with this auth token (or ${TWILIO_AUTH_TOKEN_ENV})",
    )
    group.add_argument("--twilio-public-url", help="the wss:// base URL Twilio connects to, if a proxy rewrites it")
    group.add_argument(
        "--twilio-call-grace",
        type=float,
        default=TwilioOptions.call_end_grace,
        metavar="SECONDS",
        help="once a call's last stream ended, wait this long for another stream of the call before call_ended "
        f"(default {TwilioOptions.call_end_grace:g})",
    )
    group.add_argument("--webhook-url", help="POST every call's finals here as signed JSON")
    group.add_argument("--webhook-secret", help=f"HMAC key of X-Streamer-Signature (or ${WEBHOOK_SECRET_ENV})")
    group.add_argument("--transcripts-dir", type=Path, help="append every call's finals to DIR/<callSid>.jsonl")
    hub = HubOptions()
    group.add_argument(
        "--max-followers",
        type=int,
        default=hub.max_followers,
        help=f"call-event followers open at once, over every call (default {hub.max_followers})",
    )
    group.add_argument(
        "--follower-idle-timeout",
        type=float,
        default=hub.follower_idle_timeout,
        metavar="SECONDS",
        help=f"close a follower whose call sends nothing for this long (default {hub.follower_idle_timeout:g})",
    )


def call_centre_options_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> CallCentreOptions:
    env = os.environ if env is None else env
    options = CallCentreOptions(
        twilio=TwilioOptions(
            auth_token=getattr(args, "twilio_auth_token", None) or env.get(TWILIO_AUTH_TOKEN_ENV) or None,
            public_url=getattr(args, "twilio_public_url", None),
            call_end_grace=getattr(args, "twilio_call_grace", TwilioOptions.call_end_grace),
        ),
        hub=HubOptions(
            max_followers=getattr(args, "max_followers", HubOptions.max_followers),
            follower_idle_timeout=getattr(args, "follower_idle_timeout", HubOptions.follower_idle_timeout),
        ),
        delivery=DeliveryOptions(
            webhook_url=getattr(args, "webhook_url", None),
            webhook_secret=getattr(args, "webhook_secret", None) or env.get(WEBHOOK_SECRET_ENV) or None,
            jsonl_dir=getattr(args, "transcripts_dir", None),
        ),
    )
    options.validate()
    return options


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--api-key``, ``--admin-key``, ``--allowed-origin`` and ``--no-auth`` (:mod:`streamer.server.auth`)."""
    for flag, metavar, help_text in (
        (
            "--api-key",
            "KEY",
            f"accept this API key (repeatable; also ${auth.API_KEYS_ENV}, comma-separated); turns auth on. Replicas "
            f"accept each other's browser tokens when they share ${auth.TOKEN_SECRET_ENV} (32 bytes or more)",
        ),
        (
            "--admin-key",
            "KEY",
            f"an API key that also sees every session on /status (repeatable; also ${auth.ADMIN_KEYS_ENV})",
        ),
        (
            "--allowed-origin",
            "ORIGIN",
            "let pages from this origin (https://host[:port], or *) open streams (repeatable)",
        ),
    ):
        parser.add_argument(flag, action="append", default=[], metavar=metavar, help=help_text)
    parser.add_argument(
        "--no-auth", action="store_true", help="serve a non-loopback address without API keys (anyone can connect)"
    )


def auth_options_from(args: argparse.Namespace, environ: Mapping[str, str]) -> auth.AuthOptions:
    """The :class:`AuthOptions` of the command line and environment. Raise :class:`~streamer.core.errors.ConfigError`
    when the server would listen beyond this machine with nobody checked, unless ``--no-auth`` says so."""

    def given(flag: list[str], variable: str) -> set[str]:
        return {key.strip() for key in [*flag, *environ.get(variable, "").split(",")] if key.strip()}

    keys = given(args.api_key, auth.API_KEYS_ENV)
    admins = given(getattr(args, "admin_key", []), auth.ADMIN_KEYS_ENV)
    if admins and args.no_auth:
        raise ConfigError(f"--no-auth contradicts the admin keys given (--admin-key or ${auth.ADMIN_KEYS_ENV})")
    keys -= admins
    if (keys or admins) and args.no_auth:
        raise ConfigError(f"--no-auth contradicts the API keys given (--api-key or ${auth.API_KEYS_ENV})")
    if not keys and not admins and not args.no_auth and not auth.is_loopback(args.host):
        raise ConfigError(
            f"refusing to serve {args.host} without authentication: give --api-key KEY (or ${auth.API_KEYS_ENV}), "
            "or --no-auth to let anyone who can reach this address connect"
        )
    secret = environ.get(auth.TOKEN_SECRET_ENV, "").encode() or None
    options = auth.AuthOptions(
        api_keys=frozenset(keys),
        admin_keys=frozenset(admins),
        allowed_origins=tuple(args.allowed_origin),
        token_secret=secret,
    )
    options.validate()
    return options
