from __future__ import annotations

import pytest

from streamer.core.errors import ConfigError
from streamer.core.origin import StreamOrigin

SR = 16000


def test_a_new_stream_starts_at_zero_and_is_fed_from_there() -> None:
    origin = StreamOrigin()
    origin.validate()
    assert (origin.start, origin.segment_id, origin.first_sample) == (0, 0, 0)


def test_a_takeover_is_fed_from_its_replay_point() -> None:
    assert StreamOrigin(start=5 * SR).first_sample == 5 * SR  # no context to re-read
    assert StreamOrigin(start=5 * SR, replay_from=2 * SR).first_sample == 2 * SR


def test_an_origin_replaying_more_than_a_window_or_after_its_start_is_refused() -> None:
    with pytest.raises(ConfigError, match="replay_from"):
        StreamOrigin(start=SR, replay_from=SR + 1).validate()
    with pytest.raises(ConfigError, match="replay_from"):
        StreamOrigin(start=31 * SR, replay_from=SR - 1).validate()
    with pytest.raises(ConfigError, match="segment_id"):
        StreamOrigin(start=SR, segment_id=-1).validate()
    StreamOrigin(start=31 * SR, replay_from=SR).validate()
