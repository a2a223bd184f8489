"""``streamer serve``'s command line (:mod:`streamer.cli.serve`): every option reaches the part of the server it
configures, and a configuration that cannot be served is refused before anything starts."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from streamer.app import App
from streamer.bench.harness import stream_file
from streamer.bench.server_process import free_port, running_server
from streamer.cli.serve import (
    add_auth_arguments,
    add_call_centre_arguments,
    auth_options_from,
    call_centre_options_from,
    config_from_args,
    configure_parser,
    engine_loader_from,
)
from streamer.core.agreement import Policy
from streamer.core.errors import ConfigError
from streamer.core.options import STREAM_ENCODER_PAD_SECONDS, CoreOptions
from streamer.core.units import SAMPLE_RATE
from streamer.engine.cache import CachingEngine
from streamer.engine.fake import STEADY_WORDS, ScriptedEngine, synthetic_silence, synthetic_voice
from streamer.server import auth

KEY = "key-0123456789abcdef"
OTHER_KEY = "other-0123456789abcdef"


# -- the server's options ----------------------------------------------------------------------------------------------


def test_serve_options_reach_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streamer.engine.cuda_available", lambda: False)
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    default = config_from_args(parser.parse_args([]))
    assert default.scheduler.finals_first and default.scheduler.finals_alone and default.scheduler.max_batch_size == 4
    assert default.scheduler.openings_first and default.scheduler.opening_batch_size == 2
    chosen = config_from_args(parser.parse_args(["--round-robin", "--max-batch-size", "3", "--max-sessions", "9"]))
    assert not chosen.scheduler.finals_first
    assert (chosen.scheduler.max_batch_size, chosen.scheduler.max_sessions) == (3, 9)
    openings = config_from_args(parser.parse_args(["--no-openings-first", "--opening-batch-size", "3"]))
    assert not openings.scheduler.openings_first and openings.scheduler.opening_batch_size == 3


def test_a_decoder_on_a_gpu_gets_batches_sized_for_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)

    def batch(*argv: str) -> int:
        return config_from_args(parser.parse_args(list(argv))).scheduler.max_batch_size

    monkeypatch.setattr("streamer.engine.cuda_available", lambda: False)
    assert (batch(), batch("--device", "cuda"), batch("--decoder-device", "cuda")) == (4, 64, 64)
    assert batch("--device", "cuda", "--max-batch-size", "8") == 8
    assert batch("--device", "cuda", "--engine", "scripted") == 4  # no decoder at all
    monkeypatch.setattr("streamer.engine.cuda_available", lambda: True)  # the machine's choice: its GPU
    assert (batch(), batch("--device", "cpu")) == (64, 4)


def test_a_decoder_on_a_gpu_gets_no_result_cache_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # hashing every window for the cache costs a GPU more than decoding it; a CPU keeps the cache
    parser = argparse.ArgumentParser()
    configure_parser(parser)

    def entries(*argv: str) -> int:
        return config_from_args(parser.parse_args(list(argv))).cache_entries

    monkeypatch.setattr("streamer.engine.cuda_available", lambda: False)
    assert (entries(), entries("--device", "cuda"), entries("--decoder-device", "cuda")) == (256, 0, 0)
    assert entries("--device", "cuda", "--cache-entries", "32") == 32
    assert entries("--device", "cuda", "--engine", "scripted") == 256  # no decoder: the host's cache work stays
    monkeypatch.setattr("streamer.engine.cuda_available", lambda: True)  # the machine's choice: its GPU
    assert (entries(), entries("--device", "cpu")) == (0, 256)


def test_one_flush_timeout_reaches_every_endpoint_that_takes_audio() -> None:
    from streamer.core.errors import ConfigError

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert config_from_args(parser.parse_args([])).session.flush_timeout == 10.0
    config = config_from_args(parser.parse_args(["--flush-timeout", "45"]))
    server = App(config, engine=None)
    # /v1/listen and Deepgram's take the session options; /twilio and /v1/realtime get the same value from them
    assert config.session.flush_timeout == 45.0
    assert server.call_centre.options.twilio.flush_timeout == 45.0
    assert server.call_centre.options.realtime.flush_timeout == 45.0
    with pytest.raises(ConfigError, match="flush_timeout"):
        config_from_args(parser.parse_args(["--flush-timeout", "0"]))
    # a shutdown caps each flush at flush_timeout, and waits for the sessions that long and the time to say so
    assert config_from_args(parser.parse_args([])).shutdown_wait == 15.0
    assert config.shutdown_wait == 50.0


def test_the_encoder_span_option_reaches_every_window() -> None:
    from streamer.core.errors import ConfigError

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert config_from_args(parser.parse_args([])).core.decode.encoder_pad_seconds == STREAM_ENCODER_PAD_SECONDS
    chosen = config_from_args(parser.parse_args(["--encoder-pad-seconds", "30"])).core  # the whole window
    assert chosen.decode.encoder_pad_seconds == 30.0
    assert chosen.decode.temperatures == (0.0,)  # the rest of the streaming decode options kept
    with pytest.raises(ConfigError, match="encoder_pad_seconds"):
        config_from_args(parser.parse_args(["--encoder-pad-seconds", "1"])).core.validate()


def test_the_commit_policy_options_reach_the_streams() -> None:

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert config_from_args(parser.parse_args([])).core.policy is CoreOptions().policy
    chosen = config_from_args(parser.parse_args(["--policy", "auto", "--auto-wait-ms", "800"])).core
    assert (chosen.policy, chosen.auto_wait_ms) == (Policy.AUTO, 800)
    with pytest.raises(ConfigError, match="auto_wait_ms"):
        config_from_args(parser.parse_args(["--auto-wait-ms", "-5"])).core.validate()
    assert config_from_args(parser.parse_args([])).core.resume_after_ms == CoreOptions().resume_after_ms == 2000
    assert config_from_args(parser.parse_args(["--resume-after-ms", "0"])).core.resume_after_ms == 0
    with pytest.raises(ConfigError, match="resume_after_ms"):
        config_from_args(parser.parse_args(["--resume-after-ms", "300"])).core.validate()


# -- credentials ------------------------------------------------------------------------------------------------------


def auth_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    add_auth_arguments(parser)
    return parser.parse_args(argv)


def test_keys_come_from_flags_and_the_environment() -> None:
    options = auth_options_from(auth_args("--api-key", KEY), {auth.API_KEYS_ENV: f"{OTHER_KEY}, ,"})
    assert options.api_keys == {KEY, OTHER_KEY}
    assert options.enabled
    admin = "admin-key-0123456789"
    both = auth_options_from(auth_args("--admin-key", admin), {auth.ADMIN_KEYS_ENV: OTHER_KEY})
    assert both.admin_keys == {admin, OTHER_KEY} and both.api_keys == set() and both.enabled
    # a key given as both is an admin key, and an admin key alone is enough to serve beyond loopback
    assert auth_options_from(auth_args("--api-key", admin, "--admin-key", admin), {}).api_keys == set()
    assert auth_options_from(auth_args("--host", "0.0.0.0", "--admin-key", admin), {}).enabled
    with pytest.raises(ConfigError, match="--no-auth contradicts the admin keys"):
        auth_options_from(auth_args("--admin-key", admin, "--no-auth"), {})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_without_keys_means_auth_off(host: str) -> None:
    assert not auth_options_from(auth_args("--host", host), {}).enabled


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "myhost.example"])
def test_a_public_address_without_keys_is_refused_unless_no_auth(host: str) -> None:
    with pytest.raises(ConfigError, match="--no-auth"):
        auth_options_from(auth_args("--host", host), {})
    assert not auth_options_from(auth_args("--host", host, "--no-auth"), {}).enabled
    assert auth_options_from(auth_args("--host", host, "--api-key", KEY), {}).enabled


def test_no_auth_with_keys_is_a_contradiction() -> None:
    with pytest.raises(ConfigError, match="contradicts"):
        auth_options_from(auth_args("--no-auth"), {auth.API_KEYS_ENV: KEY})


def test_the_token_secret_comes_from_the_environment_and_a_short_one_is_refused() -> None:
    secret = "s" * 32
    assert (
        auth_options_from(auth_args("--api-key", KEY), {auth.TOKEN_SECRET_ENV: secret}).token_secret == secret.encode()
    )
    with pytest.raises(ConfigError, match="token_secret"):
        auth_options_from(auth_args("--api-key", KEY), {auth.TOKEN_SECRET_ENV: "short"})


# -- the call centre --------------------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_call_centre_arguments(parser)
    return parser.parse_args(argv)


def test_options_from_flags_and_environment(tmp_path: Path) -> None:
    env = {"TWILIO_AUTH_TOKEN": "tok", "STREAMER_WEBHOOK_SECRET": "sec"}
    options = call_centre_options_from(
        parse("--webhook-url", "http://127.0.0.1:9/h", "--transcripts-dir", str(tmp_path)), env
    )
    assert options.twilio.auth_token == "tok" and options.delivery.webhook_secret == "sec"
    assert options.delivery.jsonl_dir == tmp_path
    assert call_centre_options_from(parse("--twilio-auth-token", "flag"), env).twilio.auth_token == "flag"
    assert call_centre_options_from(parse(), {}).twilio.auth_token is None


def test_webhook_without_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match="secret"):
        call_centre_options_from(parse("--webhook-url", "http://127.0.0.1:9/h"), {})


def test_the_call_grace_period_comes_from_its_flag_and_a_negative_one_is_refused() -> None:
    assert call_centre_options_from(parse(), {}).twilio.call_end_grace == 5.0
    assert call_centre_options_from(parse("--twilio-call-grace", "0"), {}).twilio.call_end_grace == 0.0
    with pytest.raises(ConfigError, match="call_end_grace"):
        call_centre_options_from(parse("--twilio-call-grace", "-1"), {})


# -- the engine -------------------------------------------------------------------------------------------------------


def test_the_scripted_engine_and_its_cost_are_chosen_on_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert parser.parse_args([]).engine == "whisper"
    argv = ["--engine", "scripted", "--scripted-window-ms", "3", "--scripted-batch-ms", "5", "--cache-entries", "0"]
    args = parser.parse_args(argv)
    engine = engine_loader_from(args)(config_from_args(args))
    assert engine.info.model == "scripted"
    assert isinstance(engine, ScriptedEngine)
    assert (engine.behaviour.window_seconds, engine.behaviour.batch_seconds) == (0.003, 0.005)
    cached = parser.parse_args(["--engine", "scripted"])  # behind the model's cache, whose lookups are host work too
    assert isinstance(engine_loader_from(cached)(config_from_args(cached)), CachingEngine)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "scripted", "--scripted-window-ms", "-1"], "window_ms must be between 0 and 60000"),
        (["--engine", "scripted", "--scripted-batch-ms", "nan"], "batch_ms must be between 0 and 60000"),
        (["--scripted-window-ms", "3"], "need --engine scripted"),  # the model's cost is its own
    ],
)
def test_a_bad_scripted_cost_is_refused(argv: list[str], message: str) -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    with pytest.raises(ConfigError, match=message):
        engine_loader_from(parser.parse_args(argv))


def test_an_unknown_engine_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine", "tiny"])
    assert "invalid choice: 'tiny'" in capsys.readouterr().err


def test_serve_with_the_scripted_engine_in_its_own_process_transcribes_any_speech() -> None:
    port = free_port()
    command = [sys.executable, "-m", "streamer", "serve", "--engine", "scripted", "--port", str(port)]
    command += ["--scripted-window-ms", "1", "--scripted-batch-ms", "1", "--max-audio-rate", "0"]
    speech = np.concatenate([synthetic_voice(3 * SAMPLE_RATE), synthetic_silence(2 * SAMPLE_RATE)])
    with running_server(command, port, ready_timeout=120) as server:
        run = asyncio.run(stream_file(server.url, "voice", speech, speed=5, chunk_ms=100))
        log = server.log_tail()
    assert run.errors == () and run.done is not None and run.done.lost_seconds == 0
    assert run.finals and set(run.text.split()) <= set(STEADY_WORDS)  # the steady script's words, final
    assert "model scripted loaded" in log
