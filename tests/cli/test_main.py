"""The command line: every command listed, and only the command that runs imported (issue 19: start-up time)."""

from __future__ import annotations

import subprocess
import sys

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
