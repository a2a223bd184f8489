from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from streamer.core.errors import ConfigError
from streamer.integrations.endpoints import IntegrationOptions, Integrations, configure_parser, options_from_args
from streamer.integrations.twilio import Start, TrackName, parse_message, recorded_messages


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(argv)


def test_options_from_flags_and_environment(tmp_path: Path) -> None:
    env = {"TWILIO_AUTH_TOKEN": "tok", "STREAMER_WEBHOOK_SECRET": "sec"}
    options = options_from_args(parse("--webhook-url", "http://127.0.0.1:9/h", "--transcripts-dir", str(tmp_path)), env)
    assert options.twilio.auth_token == "tok" and options.delivery.webhook_secret == "sec"
    assert options.delivery.jsonl_dir == tmp_path
    assert options_from_args(parse("--twilio-auth-token", "flag"), env).twilio.auth_token == "flag"
    assert options_from_args(parse(), {}).twilio.auth_token is None


def test_webhook_without_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match="secret"):
        options_from_args(parse("--webhook-url", "http://127.0.0.1:9/h"), {})


def test_no_webhook_without_a_url() -> None:
    assert Integrations(IntegrationOptions()).webhook is None


def test_the_call_grace_period_comes_from_its_flag_and_a_negative_one_is_refused() -> None:
    assert options_from_args(parse(), {}).twilio.call_end_grace == 5.0
    assert options_from_args(parse("--twilio-call-grace", "0"), {}).twilio.call_end_grace == 0.0
    with pytest.raises(ConfigError, match="call_end_grace"):
        options_from_args(parse("--twilio-call-grace", "-1"), {})


async def test_stopping_ends_the_calls_that_wait_for_another_stream() -> None:
    integrations = Integrations(IntegrationOptions())
    ended: list[str] = []
    integrations.hub.add_listener(lambda event: ended.append(event.type.value))
    start = parse_message(json.dumps(list(recorded_messages({TrackName.INBOUND: np.zeros(160, np.float32)}))[1]))
    assert isinstance(start, Start)
    integrations.calls.open(start, {TrackName.INBOUND: "customer"}, now=0.0).end("stopped", {})
    assert ended[-1] == "stream_ended" and start.call_sid in integrations.calls  # waiting out its grace period
    await integrations.stop()
    assert ended[-1] == "call_ended" and start.call_sid not in integrations.calls
