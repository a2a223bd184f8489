"""The command line: every command listed, and only the command that runs imported (issue 19: start-up time)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.cli.main import COMMANDS, build_parser, command_in


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["transcribe", "a.wav"], "transcribe"),
        (["-vv", "--verbose", "serve", "--port", "1"], "serve"),
        (["--help"], None),
        ([], None),
    ],
)
def test_the_command_is_the_first_word_that_is_not_an_option(argv: list[str], command: str | None) -> None:
    assert command_in(argv) == command


def test_help_lists_every_command_and_a_command_keeps_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    text = build_parser(["--help"]).format_help()
    assert all(name in text and help_text.split()[0] in text for name, (_, help_text) in COMMANDS.items())
    argv = ["transcribe", "--help"]
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)
    assert "--word-timestamps" in capsys.readouterr().out


def test_transcribe_imports_none_of_the_server() -> None:
    script = (
        "import sys\n"
        "from streamer.cli.main import main\n"
        "try:\n    main(['transcribe', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('streamer.server', 'streamer.integrations', "
        "'websockets', 'prometheus_client', 'torch'))))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "--word-timestamps" in result.stdout  # the command's own help, whole
    assert result.stdout.strip().splitlines()[-1] == "[]"


def _entry(argv: list[str], first: str = "") -> subprocess.CompletedProcess[str]:
    """``entry()`` in a fresh process given ``argv``, with an exit handler that says whether Python's shutdown ran;
    ``first``: a line of Python run before."""
    script = (
        f"{first}\n"
        "import atexit, sys\n"
        "atexit.register(lambda: print('shutdown ran', flush=True))\n"
        f"sys.argv = ['streamer', *{argv!r}]\n"
        "from streamer.cli.main import entry\n"
        "entry()\n"
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120)


def test_a_one_shot_command_flushes_its_output_and_keeps_its_exit_code_but_skips_pythons_shutdown(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing.wav"
    result = _entry(["transcribe", str(missing)])
    assert result.returncode == 4  # the documented code for a bad audio file
    assert f"{missing}: no such file" in result.stderr  # written before the process ended
    assert "shutdown ran" not in result.stdout


def test_other_commands_end_through_pythons_shutdown() -> None:
    result = _entry(["models"])
    assert result.returncode == 0
    assert "tiny.en" in result.stdout
    assert result.stdout.rstrip().endswith("shutdown ran")


def _entry_watching_the_collector(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``entry()`` in a fresh process, printing the collector's state when the engine resumes it."""
    script = (
        "import gc, sys\n"
        "import streamer.startup as startup\n"
        "resume = startup.resume_collection\n"
        "def watched():\n"
        "    print('on before the resume:', gc.isenabled(), flush=True)\n"
        "    print('meta registrations imported:', 'torch._meta_registrations' in sys.modules, flush=True)\n"
        "    resumed = resume()\n"
        "    print('resumed:', resumed, gc.isenabled(), gc.get_freeze_count() > 100_000, flush=True)\n"
        "    return resumed\n"
        "startup.resume_collection = watched\n"
        f"sys.argv = ['streamer', *{argv!r}]\n"
        "from streamer.cli.main import entry\n"
        "entry()\n"
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=300)


@pytest.mark.model
def test_a_command_that_loads_a_model_starts_with_the_collector_paused_until_the_model_is_loaded() -> None:
    clip = Path(__file__).resolve().parents[1] / "data" / "1089-134686-0000.flac"
    result = _entry_watching_the_collector(["transcribe", "--model", "tiny.en", str(clip)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # paused through torch's import and the model load; then on, with start-up's objects (torch's) frozen; torch's
    # meta registrations not imported by then, nor by the end (streamer.startup)
    assert lines[:3] == ["on before the resume: False", "meta registrations imported: False", "resumed: True True True"]
    assert "stew for dinner" in result.stdout.lower()  # the transcript followed


@pytest.mark.model
@pytest.mark.parametrize("precision", [[], ["--encoder-precision", "int8"], ["--encoder-precision", "fp32"]])
def test_a_one_shot_command_transcribes_the_same_with_torchs_meta_registrations_deferred(precision: list[str]) -> None:
    clips = sorted(str(clip) for clip in (Path(__file__).resolve().parents[1] / "data").glob("*.flac"))
    argv = ["transcribe", "--model", "tiny.en", *precision, *clips]
    deferred = _entry(argv)
    whole = _entry(argv, first="import torch")  # torch imported whole before entry() could defer anything
    assert deferred.returncode == whole.returncode == 0, deferred.stderr + whole.stderr
    assert deferred.stdout == whole.stdout
    assert len(deferred.stdout.splitlines()) == len(clips)


def test_other_commands_leave_the_collector_alone() -> None:
    script = (
        "import gc, sys\n"
        "sys.argv = ['streamer', 'models']\n"
        "import atexit\n"
        "atexit.register(lambda: print('collector on:', gc.isenabled(), flush=True))\n"
        "from streamer.cli.main import entry\n"
        "entry()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.rstrip().endswith("collector on: True")


@pytest.mark.parametrize(
    ("command", "defers"), [("transcribe", True), ("eval", True), ("serve", False), ("models", False)]
)
def test_only_a_one_shot_command_defers_torchs_meta_registrations(
    monkeypatch: pytest.MonkeyPatch, command: str, defers: bool
) -> None:
    from streamer import startup
    from streamer.cli import main as cli

    calls: list[str] = []
    monkeypatch.setattr(startup, "defer_meta_registrations", lambda: calls.append("deferred") or True)
    monkeypatch.setattr(startup, "pause_collection", lambda: None)
    monkeypatch.setattr(cli, "main", lambda: 0)
    monkeypatch.setattr(cli, "_exit_now", lambda code: sys.exit(code))
    monkeypatch.setattr(sys, "argv", ["streamer", command])
    with pytest.raises(SystemExit):
        cli.entry()
    assert calls == (["deferred"] if defers else [])


@pytest.mark.skipif(
    importlib.util.find_spec("resemblyzer") is None,
    reason="the Resemblyzer package is not installed (pip install --no-deps Resemblyzer==0.1.4)",
)
def test_transcribe_diarize_writes_each_reader_s_turn_as_rttm(tmp_path: Path) -> None:
    import soundfile as sf

    from tests.server.test_speaker_worker import AUDIO, B_STARTS

    recording = tmp_path / "two readers.wav"
    sf.write(recording, AUDIO, 16000)
    result = _entry(["transcribe", "--model", "tiny.en", "--diarize", "--format", "rttm", str(recording)])
    assert result.returncode == 0, result.stderr
    turns = [line.split() for line in result.stdout.splitlines() if line.startswith("SPEAKER")]
    assert [t[1] for t in turns] == ["two_readers"] * len(turns)
    # A's turn, then B's (a pause of over 0.5 s inside it may split it in two)
    assert list(dict.fromkeys(t[7] for t in turns)) == ["speaker_0", "speaker_1"], result.stdout
    first_b = next(t for t in turns if t[7] == "speaker_1")
    assert all(t[7] == "speaker_1" for t in turns[turns.index(first_b) :]), result.stdout
    # the turns are the segments' spans, as timed by the model: each reader's within DER's 0.25 s collar of the
    # change (B's first segment starts a little before B's voice, in the silence between them)
    assert float(turns[0][3]) + float(turns[0][4]) <= B_STARTS / 16000 + 0.25
    assert float(first_b[3]) >= B_STARTS / 16000 - 0.25
    refused = _entry(["transcribe", "--format", "rttm", str(recording)])
    assert refused.returncode == 2 and "--format rttm needs --diarize" in refused.stderr
