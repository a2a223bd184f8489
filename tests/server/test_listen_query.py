from __future__ import annotations

import pytest

from streamer.core.audio import Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import UnsupportedAudio
from streamer.server.listen_query import ListenParams, ResumeRequest, parse_listen_query, parse_resume_query


class TestListenQuery:
    def test_defaults(self) -> None:
        assert parse_listen_query("/v1/listen") == ListenParams(16000, Encoding.PCM_S16LE, 1, None)

    def test_every_field(self) -> None:
        params = parse_listen_query("/v1/listen?sample_rate=8000&encoding=mulaw&channels=2&language=de")
        assert params == ListenParams(8000, Encoding.MULAW, 2, "de")

    @pytest.mark.parametrize("encoding", [e.value for e in (*Encoding, *ContainerEncoding)])
    def test_every_encoding(self, encoding: str) -> None:
        assert parse_listen_query(f"/v1/listen?encoding={encoding}").encoding.value == encoding

    def test_a_container_takes_its_rate_from_the_stream_and_channels_from_the_query(self) -> None:
        params = parse_listen_query("/v1/listen?encoding=opus&sample_rate=48000&channels=2")
        assert params.container is ContainerEncoding.OPUS and params.channels == 2
        assert parse_listen_query("/v1/listen?encoding=container").container is ContainerEncoding.CONTAINER
        assert parse_listen_query("/v1/listen").container is None
        with pytest.raises(UnsupportedAudio, match="channels 3"):
            parse_listen_query("/v1/listen?encoding=container&channels=3")

    def test_round_trip_through_to_query(self) -> None:
        params = ListenParams(44100, Encoding.PCM_F32LE, 2, "en")
        assert parse_listen_query(f"/v1/listen?{params.to_query()}") == params

    def test_prompt_and_keywords(self) -> None:
        params = parse_listen_query("/v1/listen?prompt=A+talk+on+Kubernetes.&keywords=kubectl,%20etcd,&keywords=Istio")
        assert params.prompt == "A talk on Kubernetes."
        assert params.keywords == ("kubectl", "etcd", "Istio")  # commas and repeats both list; empties dropped

    def test_prompt_and_keywords_round_trip_through_to_query(self) -> None:
        params = ListenParams(prompt="Names: Zoë & Ådne, 100% sure?", keywords=("Zoë", "C++", "a b"))
        assert parse_listen_query(f"/v1/listen?{params.to_query()}") == params

    @pytest.mark.parametrize(
        ("query", "complaint"),
        [
            ("sample_rate=7999", "from 8000 to 48000 Hz"),
            ("sample_rate=48001", "from 8000 to 48000 Hz"),
            ("sample_rate=fast", "must be an integer"),
            ("encoding=mp3", "encoding must be one of pcm_s16le, pcm_f32le, mulaw, alaw, opus, container, not 'mp3'"),
            ("channels=3", "channels 3 is not supported; use 1 or 2"),
            ("channels=0", "use 1 or 2"),
            ("language=english", "ISO 639-1"),
            ("samplerate=8000", "unknown query parameter 'samplerate'"),
            ("channels=1&channels=2", "given twice"),
            ("prompt=a&prompt=b", "given twice"),
            ("prompt=" + "x" * 801, "initial_prompt must be at most 800 characters"),
            ("keywords=" + "y" * 51, "at most 50 characters each"),
            ("keywords=" + ",".join(f"k{i}" for i in range(101)), "keywords: at most 100"),
        ],
    )
    def test_bad_values_are_unsupported_audio(self, query: str, complaint: str) -> None:
        with pytest.raises(UnsupportedAudio, match=complaint) as info:
            parse_listen_query(f"/v1/listen?{query}")
        assert info.value.close_code == 4415
        assert info.value.code == "unsupported_audio"


class TestResumeQuery:
    def test_no_resume_parameter_is_a_new_session(self) -> None:
        assert parse_resume_query("/v1/listen?sample_rate=8000") is None

    def test_session_and_last_seq(self) -> None:
        assert parse_resume_query("/v1/listen?resume=3f9a1c0b2e4d&last_seq=12") == ResumeRequest("3f9a1c0b2e4d", 12)
        assert parse_resume_query("/v1/listen?resume=abc") == ResumeRequest("abc", 0)

    def test_resend_from_names_the_oldest_audio_the_client_holds(self) -> None:
        request = parse_resume_query("/v1/listen?resume=abc&last_seq=2&resend_from=12.345678")
        assert request == ResumeRequest("abc", 2, 12.345678)
        assert parse_resume_query("/v1/listen?resume=abc&resend_from=7") == ResumeRequest("abc", 0, 7.0)

    def test_the_listen_query_ignores_the_resume_parameters(self) -> None:
        assert parse_listen_query("/v1/listen?resume=abc&last_seq=3&resend_from=1.5").sample_rate == 16000

    @pytest.mark.parametrize(
        "query",
        [
            "resume=",
            "resume=a/b",
            "resume=abc&last_seq=-1",
            "resume=abc&last_seq=x",
            "resume=abc&resend_from=-1",
            "resume=abc&resend_from=nan",
            "resume=abc&resend_from=1e9",
            "resume=abc&resend_from=1.",
            "resume=abc&resend_from=.5",
        ],
    )
    def test_bad_values_are_refused_like_any_bad_parameter(self, query: str) -> None:
        with pytest.raises(UnsupportedAudio):
            parse_resume_query(f"/v1/listen?{query}")
