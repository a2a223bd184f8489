"""Past one machine, with real parts (issue 18): three ``streamer serve --redis`` processes on tiny.en behind HAProxy
(round-robin, no stickiness) and a real ``redis-server``, all started and stopped by the fixture
(:mod:`tests.reliability.replicas`); the clients are :mod:`streamer.client`, which resumes on its own.

- a replica killed with SIGKILL mid-stream: four clients streaming real speech reconnect through the proxy, their
  sessions are taken over by the other replicas, and each transcript is its no-fault one, with nothing lost or
  repeated;
- a follower connected through the proxy sees every final of a Twilio call streaming into another replica;
- a browser token redeemed on one replica is refused on the others;
- Redis stopped mid-run: the streams go on; Redis back: a resume lands on another replica again.

The tests share one cluster (the model loads once per replica) and each leaves it whole: every replica up, Redis up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import secrets
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from streamer.cli.terminal import paced_chunks
from streamer.client import StreamerClient, connect
from streamer.offline.normalize import normalize_english, word_edits, word_error_rate
from streamer.server.auth import TOKEN_SECRET_ENV, TOKEN_SUBPROTOCOL_PREFIX
from streamer.server.server_messages import FinalMessage, Ready
from tests.conftest import SHARED_DATA
from tests.helpers import until
from tests.redis_server import REDIS_SERVER, RedisProcess
from tests.reliability.replicas import HAPROXY, Cluster
from tests.reliability.tally import TALLY

pytestmark = [pytest.mark.replicas, pytest.mark.model]

KEY = "replicas-test-key-0123456789"
# four LibriSpeech test-clean utterances of 9.6 to 14 s (../shared/data), a second of silence after each so that the
# last utterance ends by the VAD
CLIPS = (
    "test-clean/1320/122617/1320-122617-0001.flac",
    "test-clean/7021/79730/7021-79730-0001.flac",
    "test-clean/1089/134686/1089-134686-0000.flac",
    "test-clean/8555/284447/8555-284447-0000.flac",
)
# the kill test's four streams: test-clean utterances joined, about 30 s and 85 words each (344 in all), so that one
# point of pooled WER is three words: a stream taken over mid-utterance re-reads it in other windows than the no-fault
# runs, and the model may spell a word of it differently there, as it does from one no-fault run to the next. Streamed
# at this load (two replicas of one thread each on two cores), the no-fault runs differed by more than spellings until
# the core resumed a closing window that stopped early (CoreOptions.resume_after_ms): 5 of 6 on an AVX2-only Zen 2
# dropped the 16 words "unluckily, fell asleep in the window, and in this position was found by her mistress" of
# 8463-287645-0007, which offline tiny.en writes (4.7 points: the decoder stopped after "and" in every window up to
# the pause after "mistress", and the utterance's last window committed its audio to the end with no word for it),
# and their pooled WER ranged 4.4 to 9.9 %. With the resumption the worst of three no-fault runs was 4.9 % and the
# run with a kill 4.1 % (same machine, 2026-12-03).
KILL_RUNS = tuple(
    "+".join(f"test-clean/{name}" for name in run)
    for run in (
        ("1320/122617/1320-122617-0001.flac", "8463/287645/8463-287645-0007.flac"),
        ("7021/79730/7021-79730-0001.flac", "121/127105/121-127105-0000.flac", "260/123286/260-123286-0006.flac"),
        (
            "1089/134686/1089-134686-0000.flac",
            "1089/134686/1089-134686-0001.flac",
            "1089/134691/1089-134691-0001.flac",
            "6829/68769/6829-68769-0004.flac",
        ),
        ("8555/284447/8555-284447-0000.flac", "1320/122612/1320-122612-0008.flac", "1995/1837/1995-1837-0001.wav"),
    )
)
REPLICA_ARGS = ["--model", "tiny.en", "--api-key", KEY, "--threads", "1", "--resume-grace-seconds", "30"]
# 0.4 times real time: four real-time streams of tiny.en on two shared cores finish their finals too late at the end
# (flush_timeout, 10 s) on a busy machine; what is measured here is continuity, not speed. At half real time a fresh-
# clone CI on an AVX2-only Zen 2 (2026-12-03) saw a replica left with its own stream and one taken over fall 3.7 s
# behind (final latency p95) and give up on the last 1.44 s at the flush timeout; the same stream fed in process makes
# as many decodes with the closing-window resumption as without it, so the load, not the resumption, did it. Since
# then the flush waits as long as the engine keeps finishing a stream's audio (streamer.server.adapter.FlushBound), so
# such a replica sends those finals late instead; the slower pace stays, so the test does not lean on that
SPEED = 0.4
# the words either side of a killed replica's cut in which a lost or repeated word would show
CUT_WORDS = 3
# runs without a fault, the worst of which bounds the run with one: the more of them, the likelier the worst shows a
# skip like the one above when the run with the fault does (each run is 75 s at SPEED)
NO_FAULT_RUNS = 3
# how much worse than that the run with a fault may be, as a share of the words: against the worst no-fault run it
# came out 1.2 points better to 1.2 points worse (five runs: two in fresh-clone CI, three by hand), none of it at the
# cut, all of it the windows reading the same words another way ("Stuff" or "Stuffered", "rush" or "rushed", a skip);
# two points is seven words
QUALITY_SLACK = 0.02


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = [name for name, path in (("haproxy", HAPROXY), ("redis-server", REDIS_SERVER)) if path is None]
    if missing:
        message = f"{' and '.join(missing)} not installed (apt-get install -y haproxy redis-server; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (it sits beside the checkout on the project's machines)")
    directory = tmp_path_factory.mktemp("replicas")
    redis = RedisProcess(directory)
    redis.start()
    # the replicas share the secret that signs browser tokens, as a Kubernetes Secret would give them
    env = {TOKEN_SECRET_ENV: secrets.token_hex(32)}
    try:
        with Cluster(directory, redis, REPLICA_ARGS, env) as running:
            yield running
    finally:
        redis.stop()


@pytest.fixture
def whole(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, made whole again after the test: every replica up, Redis up."""
    try:
        yield cluster
    finally:
        if not cluster.redis.answers():
            cluster.redis.start()
        for replica in cluster.replicas:
            if replica.process is None:
                cluster.restart(replica.index)


def load(name: str) -> npt.NDArray[np.float32]:
    """A clip with a second of silence after it; ``a+b+...`` joins clips one after the other."""
    import soundfile as sf

    if "+" in name:
        return np.concatenate([load(part) for part in name.split("+")])

    samples, rate = sf.read(SHARED_DATA / "librispeech" / name, dtype="float32")
    assert rate == 16000
    return np.concatenate([samples.astype(np.float32), np.zeros(16000, dtype=np.float32)])


def reference(name: str) -> str:
    if "+" in name:
        return " ".join(reference(part) for part in name.split("+"))
    for line in (SHARED_DATA / "librispeech" / "transcripts.tsv").read_text(encoding="utf-8").splitlines():
        path, _, text = line.partition("\t")
        if path == name:
            return text
    raise KeyError(name)


def wer(reference_text: str, hypothesis: str) -> float:
    return word_error_rate([normalize_english(reference_text)], [normalize_english(hypothesis)]).wer


@dataclass
class Stream:
    """One client's stream through the proxy, filled in as it goes."""

    name: str
    client: StreamerClient | None = None
    finals: list[FinalMessage] = field(default_factory=list)
    readies: list[Ready] = field(default_factory=list)  # one per reconnection
    cuts: list[int] = field(default_factory=list)  # for each reconnection, how many finals had come before it

    @property
    def text(self) -> str:
        return " ".join(f.text.strip() for f in self.finals if f.text.strip())

    def describe(self) -> str:
        """What came back, for an assertion's message."""
        finals = "\n".join(f"  {f.seq} {f.start:.2f}-{f.end:.2f} {f.text}" for f in self.finals)
        assert self.client is not None
        return f"{self.name} {self.client.session_id} {self.readies} {self.client.done}\n{finals}"

    def check_exact(self) -> None:
        """Done, nothing lost, every final once: seqs 1..n and spans that never overlap."""
        client = self.client
        assert client is not None and client.done is not None, f"{self.name}: no done"
        assert [f.seq for f in self.finals] == list(range(1, len(self.finals) + 1)), self.name
        assert all(b.start >= a.end - 1e-6 for a, b in itertools.pairwise(self.finals)), self.name
        assert client.cursor.lost == [], f"{self.name}: the client's buffer lost {client.cursor.lost}"
        assert client.done.lost_seconds == 0, f"{self.name}: the server lost {client.done.lost_seconds} s"


async def stream(url: str, stream: Stream, audio: npt.NDArray[np.float32], seed: int) -> Stream:
    """Stream ``audio`` to ``url`` in real time with the resuming client, recording what comes back in ``stream``."""
    client = connect(url, api_key=KEY, rng=random.Random(seed))
    stream.client = client
    async with client:

        async def send() -> None:
            async for piece in paced_chunks(audio, 1600, SPEED):
                await client.send_audio(piece)
            await client.end()

        sender = asyncio.create_task(send())
        async for message in client:
            if isinstance(message, FinalMessage):
                stream.finals.append(message)
            elif isinstance(message, Ready):
                stream.readies.append(message)
                stream.cuts.append(len(stream.finals))
        await sender
    return stream


async def stream_all(url: str, names: tuple[str, ...]) -> tuple[list[Stream], list[asyncio.Task[Stream]]]:
    streams = [Stream(name) for name in names]
    tasks = [asyncio.create_task(stream(url, s, load(s.name), seed)) for seed, s in enumerate(streams)]
    return streams, tasks


def http_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def sessions_by_replica(cluster: Cluster) -> dict[int, set[str]]:
    """The ``/v1/listen`` sessions each live replica serves (its ``/status``)."""
    found = {}
    for replica in cluster.replicas:
        if replica.process is not None:
            status = http_json(f"http://127.0.0.1:{replica.port}/status")
            found[replica.index] = {s["id"] for s in status["sessions"] if s.get("kind", "listen") == "listen"}
    return found


def redis_queue(cluster: Cluster, index: int) -> float:
    """Writes replica ``index`` still has to make to Redis (``streamer_redis_queue_depth`` on its ``/metrics``)."""
    port = cluster.replicas[index].port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("streamer_redis_queue_depth "):
                return float(line.split()[1])
    raise AssertionError("no streamer_redis_queue_depth on /metrics")


# -- a replica dies --------------------------------------------------------------------------------------------------


async def test_a_replica_killed_mid_stream_loses_no_word(whole: Cluster) -> None:
    cluster = whole
    # 1. Three no-fault runs: the four clients through the proxy, nothing happens. Streamed transcripts vary from run
    #    to run (the windows are cut where the decoding stood when audio came), so the bound below takes the worst.
    clean: list[list[Stream]] = []
    for _ in range(NO_FAULT_RUNS):
        streams, tasks = await stream_all(cluster.url, KILL_RUNS)
        await asyncio.gather(*tasks)
        for s in streams:
            s.check_exact()
        clean.append(streams)
    # 2. Again; once every client has a final, the replica serving the most of them is killed.
    faulty, tasks = await stream_all(cluster.url, KILL_RUNS)
    await until(lambda: all(s.finals for s in faulty), timeout=120)
    served = sessions_by_replica(cluster)
    ours = {s.client.session_id for s in faulty if s.client is not None}
    victim = max(served, key=lambda index: len(served[index] & ours))
    cut = {s.name for s in faulty if s.client is not None and s.client.session_id in served[victim]}
    assert cut, served
    cluster.kill(victim)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=180)
    # 3. Every client finished, exactly: nothing lost, every final once, spans that never overlap; those of the dead
    #    replica came back through the proxy once each, taken over by another replica (or, had their record not
    #    reached Redis before the kill, as a new session from their last final: nothing lost either way).
    for index, after in enumerate(faulty):
        after.check_exact()
        assert len(after.readies) == (1 if after.name in cut else 0), after.name
        if after.name in cut:
            # no word lost or repeated at the cut: a lost word is a deletion against the no-fault transcript there, a
            # repeated one an insertion. Only the words about the cut count: the stream taken over re-reads the rest
            # of its utterance in other windows than the no-fault runs, where the model may write a word differently,
            # as it does from one no-fault run to the next ("sailorman" as "sailor man" is an insertion too); step 4
            # bounds those. Against the nearest of the no-fault runs, one word of slack.
            (finals_before,) = after.cuts
            hypothesis = normalize_english(after.text).split()
            at = len(normalize_english(" ".join(f.text for f in after.finals[:finals_before])).split())
            near = min(
                (
                    [
                        edit
                        for edit in word_edits(normalize_english(run[index].text).split(), hypothesis)
                        if edit.kind != "substitution" and abs(edit.hyp_index - at) <= CUT_WORDS
                    ]
                    for run in clean
                ),
                key=len,
            )
            TALLY["words deleted or inserted at a killed replica's cut"] += len(near)
            assert len(near) <= 1, (at, hypothesis[max(0, at - CUT_WORDS) : at + CUT_WORDS], near, after.describe())
    # 4. The transcripts are as good as the no-fault ones: within QUALITY_SLACK of the worst of them over the four
    #    streams (344 words). A lost sentence (10 words or more) is 3 points.
    references = [normalize_english(reference(name)) for name in KILL_RUNS]
    no_fault = max(word_error_rate(references, [normalize_english(s.text) for s in run]).wer for run in clean)
    fault = word_error_rate(references, [normalize_english(s.text) for s in faulty]).wer
    texts = "\n".join(
        f"{'cut ' if s.name in cut else ''}{s.name}\n  fault: {s.text}\n"
        + "\n".join(f"  clean: {run[i].text}" for run in clean)
        for i, s in enumerate(faulty)
    )
    assert fault <= no_fault + QUALITY_SLACK, (no_fault, fault, texts)
    TALLY["sessions cut by a killed replica"] += len(cut)
    TALLY["sessions taken over by another replica"] += sum(1 for s in faulty for r in s.readies if r.resumed)
    TALLY["pooled WER x1000 after a kill (worse no-fault run)"] += round(fault * 1000)
    TALLY["pooled WER x1000 without fault (worse run)"] += round(no_fault * 1000)


# -- a call followed through the proxy --------------------------------------------------------------------------------


async def test_a_follower_through_the_proxy_sees_every_final_of_a_call_on_another_replica(whole: Cluster) -> None:
    from streamer.cli.twilio_replay import load_tracks, replay

    cluster = whole
    call_sid = "CA" + secrets.token_hex(16)
    path = f"/v1/calls/{call_sid}/events"
    headers = {"Authorization": f"Bearer {KEY}"}

    async def follow(url: str) -> list[dict[str, Any]]:
        events = []
        async with ws_connect(url + path, additional_headers=headers) as ws:
            try:
                async for frame in ws:
                    events.append(json.loads(frame))
                    if events[-1]["type"] == "call_ended":
                        break
            except ConnectionClosed:
                pass
        return events

    # the call goes to replica 0; a follower there sees it from the process itself, three more come through the
    # proxy, round-robin: at least two of them on the other replicas
    home = cluster.replicas[0]
    followers = [asyncio.create_task(follow(home.url))]
    followers += [asyncio.create_task(follow(cluster.url)) for _ in range(3)]
    tracks = load_tracks(SHARED_DATA / "librispeech" / CLIPS[2], stereo=False)
    code = await replay(f"{home.url}/twilio", tracks, call_sid=call_sid, speed=2.0)
    assert code == 1000
    local, *remote = await asyncio.wait_for(asyncio.gather(*followers), timeout=60)
    finals = [e for e in local if e["type"] == "final"]
    assert finals and local[-1]["type"] == "call_ended"
    for events in remote:
        assert [e for e in events if e["type"] == "final"] == finals
    TALLY["call finals followed across replicas"] += len(finals) * len(remote)


# -- tokens -----------------------------------------------------------------------------------------------------------


async def test_a_token_redeemed_on_one_replica_is_refused_on_the_others(whole: Cluster) -> None:
    cluster = whole

    def token(port: int) -> str:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/token", method="POST", headers={"Authorization": f"Bearer {KEY}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(json.loads(response.read())["token"])

    async def first_message(port: int, credential: str) -> tuple[dict[str, Any], int | None]:
        protocol = Subprotocol(TOKEN_SUBPROTOCOL_PREFIX + credential)
        async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen", subprotocols=[protocol]) as ws:
            message = json.loads(await ws.recv())
            if message["type"] == "ready":
                await ws.close()
            else:
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
        return message, ws.close_code

    one, two, three = (r.port for r in cluster.replicas)
    # a token issued by one replica opens a stream on another: they share the signing secret
    fresh = token(one)
    assert (await first_message(two, fresh))[0]["type"] == "ready"
    # once redeemed, it opens nothing anywhere: not on the replica that took it, not on the others
    for port in (one, three, two):
        message, close_code = await first_message(port, fresh)
        assert message["code"] == "unauthorized" and close_code == 4401, port


# -- Redis goes away and comes back -----------------------------------------------------------------------------------


async def test_streams_go_on_without_redis_and_resume_across_replicas_when_it_is_back(whole: Cluster) -> None:
    cluster = whole
    # 1. Two streams; once both have a final, Redis dies. They finish, nothing lost.
    streams, tasks = await stream_all(cluster.url, CLIPS[:2])
    await until(lambda: all(s.finals for s in streams), timeout=120)
    ours = {s.client.session_id for s in streams if s.client is not None}
    serving = [cluster.replicas[i] for i, ids in sessions_by_replica(cluster).items() if ids & ours]
    cluster.redis.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    for s in streams:
        s.check_exact()
        assert wer(reference(s.name), s.text) <= 0.3, s.text
    # the replicas that served them found Redis gone (the others have not asked it anything yet) and say so, ready
    await until(lambda: all(_readyz(r.port) == "ready; redis down" for r in serving), timeout=30)
    # 2. Redis comes back (empty, on the same port): each replica finds it by itself.
    cluster.redis.start()
    await until(lambda: all(_readyz(r.port) == "ready; redis up" for r in cluster.replicas), timeout=60)
    # 3. A stream whose replica is killed once it has a final resumes on another one, through the proxy.
    [again], tasks = await stream_all(cluster.url, CLIPS[2:3])
    await until(lambda: bool(again.finals), timeout=120)
    served = sessions_by_replica(cluster)
    assert again.client is not None
    [victim] = [index for index, ids in served.items() if again.client.session_id in ids]
    await until(lambda: redis_queue(cluster, victim) == 0)  # its record is in Redis
    cluster.kill(victim)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    again.check_exact()
    assert [r.resumed for r in again.readies] == [True]
    assert wer(reference(again.name), again.text) <= 0.3, again.text


def _readyz(port: int) -> str:
    """The first part of the body of ``/readyz`` (always 200 here), and what it says of Redis."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
        assert response.status == 200
        ready, _, redis = response.read().decode().strip().partition("; ")
        return f"{ready}; {redis.partition(':')[0]}"


def test_the_proxy_configuration_has_no_stickiness(tmp_path: Path) -> None:
    from tests.reliability.replicas import haproxy_config

    config = haproxy_config(8000, [8001, 8002, 8003], tmp_path / "stats.sock")
    assert "balance roundrobin" in config and config.count("server r") == 3
    assert not any(word in config for word in ("cookie", "stick", "hash-type", "balance source"))
