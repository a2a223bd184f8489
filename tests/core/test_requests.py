from __future__ import annotations

import pytest

from streamer.core.errors import ConfigError
from streamer.core.requests import DecodeOptions


def test_the_encoder_pad_is_bounded() -> None:
    with pytest.raises(ConfigError, match="encoder_pad_seconds must be between 3 and 30"):
        DecodeOptions(encoder_pad_seconds=1.0).validate()
    DecodeOptions(encoder_pad_seconds=30.0).validate()
