from __future__ import annotations

from dataclasses import replace

import pytest

from streamer.core.errors import ConfigError
from streamer.core.options import STREAM_ENCODER_PAD_SECONDS, CoreOptions, for_the_model


def test_the_defaults_are_valid_and_stream_windows_read_a_short_pad() -> None:
    options = CoreOptions()
    options.validate()
    assert options.decode.word_timestamps  # the commit policies need word timings
    assert options.decode.encoder_pad_seconds == STREAM_ENCODER_PAD_SECONDS


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (CoreOptions(step_ms=100), "step_ms"),
        (CoreOptions(agreement_n=0), "agreement_n"),
        (CoreOptions(max_window_ms=40000), "max_window_ms"),
        (CoreOptions(endpoint_ms=5), "endpoint_ms"),
        (CoreOptions(auto_wait_ms=-1), "auto_wait_ms"),
        (CoreOptions(auto_wait_ms=30001), "auto_wait_ms"),
        (CoreOptions(resume_after_ms=500), "resume_after_ms"),
        (CoreOptions(resume_after_ms=30001), "resume_after_ms"),
        (CoreOptions(late_context_ms=-1), "late_context_ms"),
        (CoreOptions(late_context_ms=10001), "late_context_ms"),
        (CoreOptions(late_encoder_pad_seconds=0.1), "late_encoder_pad_seconds"),
        (CoreOptions(late_encoder_pad_seconds=31.0), "late_encoder_pad_seconds"),
    ],
)
def test_invalid_options_are_rejected_naming_the_field(options: CoreOptions, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        options.validate()


def test_a_multilingual_model_detecting_each_utterance_s_language_gets_no_context() -> None:
    options = CoreOptions()
    assert options.context_ms > 0
    model = for_the_model(options, multilingual=True)
    assert model.context_ms == model.late_context_ms == 0  # German context made French come out German
    fixed = replace(options, decode=replace(options.decode, language="fr"))
    assert for_the_model(fixed, multilingual=True) == fixed
    assert for_the_model(options, multilingual=False) == options
