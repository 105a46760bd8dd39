"""The CLI builds only the named command's parser: a short command does not import every other command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ambient.cli import _command_word, main


@pytest.mark.parametrize(("argv", "word"), [
    (["send", "x.yml"], "send"),
    (["--brain", "/b", "lock", "check", "f"], "lock"),
    (["--brain=/b", "status"], "status"),
    (["--version"], None),
    (["--", "send"], None),
    ([], None),
])
def test_the_command_word_skips_options_and_the_brain_value(argv: list[str], word: str | None) -> None:
    assert _command_word(argv) == word


def test_a_command_imports_its_own_module_only() -> None:
    loaded = _modules_last_line("lock", "--help")
    assert "ambient.cli.lock" in loaded
    assert not loaded & {"ambient.cli.doctor", "ambient.cli.run", "ambient.cli.status", "ambient.cli.send"}


def _modules_last_line(*argv: str) -> set[str]:
    code = ("import sys\nfrom ambient.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('MODULES', *sorted(m for m in sys.modules if m.startswith('ambient.cli.')))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith("MODULES")]
    return set(line.split()[1:])


def test_commands_registered_by_another_module_and_help_still_see_every_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "ambient.cli.status" in _modules_last_line("runs", "--help")  # `runs` lives in status.py
    assert main(["sned"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sned'" in err and "'send'" in err and "'demo'" in err
