from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from streamer.core.errors import ConfigError
from streamer.integrations.endpoints import IntegrationOptions, Integrations, configure_parser, options_from_args


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
