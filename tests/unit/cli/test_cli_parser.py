"""The CLI builds only the named command's parser: a short command does not import every other command."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import ambient.cli
from ambient.cli import HOMES, _command_word, main


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["send", "x.yml"], "send"),
        (["--brain", "/b", "lock", "check", "f"], "lock"),
        (["--brain=/b", "status"], "status"),
        (["--version"], None),
        (["--", "send"], None),
        ([], None),
    ],
)
def test_the_command_word_skips_options_and_the_brain_value(argv: list[str], word: str | None) -> None:
    assert _command_word(argv) == word


@pytest.mark.slow
def test_a_command_imports_its_own_module_only() -> None:
    loaded = _modules_last_line("lock", "--help")
    assert "ambient.cli.lock" in loaded
    assert not loaded & {"ambient.cli.doctor", "ambient.cli.run", "ambient.cli.status", "ambient.cli.send"}


def _modules_last_line(*argv: str) -> set[str]:
    code = (
        "import sys\nfrom ambient.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('MODULES', *sorted(m for m in sys.modules if m.startswith('ambient.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith("MODULES")]
    return set(line.split()[1:])


def test_every_command_named_unlike_its_module_is_in_the_homes_table() -> None:
    """A command a module registers under another name is found through HOMES, else its start builds every parser."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(ambient.cli.__path__):
        if info.name.startswith("_"):
            continue
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"ambient.cli.{info.name}").register(sub)
        found |= {command: info.name for command in sub.choices if command != info.name}
    assert found == HOMES


@pytest.mark.slow
def test_a_command_of_another_module_imports_that_module_only() -> None:
    loaded = _modules_last_line("runs", "--help")
    assert "ambient.cli.status" in loaded
    assert not loaded & {"ambient.cli.doctor", "ambient.cli.run", "ambient.cli.lock", "ambient.cli.send"}


@pytest.mark.slow
def test_commands_registered_by_another_module_and_help_still_see_every_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "ambient.cli.status" in _modules_last_line("runs", "--help")  # `runs` lives in status.py
    assert main(["sned"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sned'" in err and "'send'" in err and "'demo'" in err


@pytest.mark.slow
@pytest.mark.parametrize("args", [["status"], ["validate"], ["runs"]])
def test_a_reader_that_went_away_stops_the_command_quietly(tmp_path: Path, args: list[str]) -> None:
    """``ambient status | head -1``: output into a pipe nobody reads any more ends the command with the shell's
    exit code for it (141), and no traceback on stderr (there was one from `ambient escalations | head`)."""
    import os

    from tests.e2e.helpers import make_brain

    paths = make_brain(tmp_path / "brain")
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the command writes anything: every write to the pipe fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ambient", "--brain", str(paths.root), *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
