"""Clients in processes of their own (streamer.bench.clients): started and loaded before the common start, each
stream's outcome brought back in the share's order, a failed stream named without taking the others down."""

from __future__ import annotations

import os

import numpy as np
import pytest

from streamer.bench.clients import ClientProcesses, ClientShare, ClientStream
from streamer.bench.server_process import free_port
from streamer.core.errors import StreamerError


def test_each_streams_failure_comes_back_named_in_order_from_another_process() -> None:
    url = f"ws://127.0.0.1:{free_port()}"  # nothing listens there: every connection is refused
    samples = np.zeros(1600, dtype=np.float32)
    share = ClientShare(url, (ClientStream("first", samples, 0.0), ClientStream("second", samples, 0.2)), 1.0, 100)
    assert share.seconds == pytest.approx(0.3)
    with ClientProcesses([share], grace_seconds=60) as clients:
        [result] = clients.run()
    assert result.runs == ()
    assert [f.split(":")[0] for f in result.failed] == ["first", "second"]
    assert result.pid != os.getpid()


def test_no_share_is_refused() -> None:
    with pytest.raises(StreamerError, match="no client process"):
        ClientProcesses([], grace_seconds=1)
