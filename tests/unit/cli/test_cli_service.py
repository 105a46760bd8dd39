"""`ambient init` and `ambient config`: a brain that runs at once, settings with secrets masked (`ambient doctor`:
test_cli_doctor.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.config.scaffold import CONFIG_TEMPLATE, brain_files
from ambient.config.settings import Settings

CANARY = "CANARYtoken0123456789abcdefghijklmnopq"  # the shape of a Telegram bot token's secret part
TOKEN_URL = f"tgram://123456789:{CANARY}/987654"
SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AMBIENT_* or credentials from the developer's shell leak into these tests."""
    for var in list(os.environ):
        if var.startswith("AMBIENT_") or var in ("CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET"):
            monkeypatch.delenv(var)


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under root with its bytes (what a command must not change)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ init


def test_init_scaffolds_a_brain_that_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ambient init DIR` creates the folders and files, lists them, and `ambient validate` accepts the result."""
    root = tmp_path / "new"
    assert main(["init", str(root)]) == 0
    printed = capsys.readouterr().out
    for d in ("agents", "claims", "locks", "profil", "workflows"):
        assert (root / d).is_dir()
    for f in brain_files():
        assert (root / f.rel).read_text() == f.text
        assert f.rel in printed
    assert ".ambient/" in (root / ".gitignore").read_text().splitlines()
    assert os.access(root / "bin" / "hello_agent.py", os.X_OK)
    assert main(["validate", "--brain", str(root), "--strict"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]  # run as root, where agents would not start: said beside it
    assert re.fullmatch(
        r"ok: 1 workflow\(s\) \(0 draft\), 0 warning\(s\)(; \d+ warnings? about this machine above)?", last
    )


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One existing file: exit 2 naming it, and no file is written, changed or deleted."""
    root = tmp_path / "brain"
    (root / "profil").mkdir(parents=True)
    (root / "profil" / "ambient.yml").write_text("tick_seconds: 5\n")
    (root / "notes.md").write_text("mine\n")
    before = _files(root)
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err
    assert "profil/ambient.yml" in err and "never overwrites" in err
    assert _files(root) == before
    assert not (root / "agents").exists()


def test_init_twice_refuses_and_no_example_adds_only_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second init changes nothing (exit 2); --no-example into a brain with only workflows adds the config."""
    root = tmp_path / "brain"
    assert main(["init", str(root)]) == 0
    before = _files(root)
    assert main(["init", str(root)]) == 2
    assert "already has .gitignore" in capsys.readouterr().err
    assert _files(root) == before
    other = tmp_path / "existing"
    (other / "workflows").mkdir(parents=True)
    (other / "workflows" / "mine.yml").write_text("keep me\n")
    assert main(["--brain", str(other), "init", "--no-example"]) == 0
    assert (other / "profil" / "ambient.yml").read_text() == CONFIG_TEMPLATE
    assert (other / "workflows" / "mine.yml").read_text() == "keep me\n"
    assert not (other / "agents" / "hello.md").exists()


@pytest.mark.slow
def test_init_then_run_finishes_the_example(tmp_path: Path) -> None:
    """`ambient init` then `ambient run --until-idle` (a real subprocess) runs the example workflow to success."""
    root = tmp_path / "brain"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_")}
    env["PYTHONPATH"] = str(SRC)
    if os.geteuid() == 0:  # the unprivileged default reaches neither pytest's temp folders nor /root's interpreter
        env["AMBIENT_AGENT_USER"] = "root"
    cmd = [sys.executable, "-m", "ambient"]
    init = subprocess.run([*cmd, "init", str(root)], env=env, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    run = subprocess.run(
        [*cmd, "run", "--brain", str(root), "--until-idle"], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    records = [json.loads(line) for line in (root / ".ambient" / "runs.jsonl").read_text().splitlines()]
    assert [(r["workflow"], r["outcome"]) for r in records] == [("hello", "success")]
    assert len(records[0]["steps"]) == 3


def _uncomment(template: str) -> str:
    """The template with every setting line (``#key:``, ``#  key:``, ``#  # note``) uncommented."""
    lines = []
    for line in template.splitlines():
        if re.match(r"^#((?:  )*)[a-z_]+:", line) or re.match(r"^#(  )+#", line):
            line = line[1:]
        lines.append(line)
    return "\n".join(lines) + "\n"


def _leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "runners":
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out.add(f"{prefix}{key}")
    return out


def test_config_template_lists_every_setting_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    """Uncommenting every line of the template gives exactly the defaults, and every setting is there."""
    from ambient.storage.yamlfile import parse_yaml

    assert main(["config", "template"]) == 0
    assert capsys.readouterr().out == CONFIG_TEMPLATE

    data, _ = parse_yaml(CONFIG_TEMPLATE, source="template")
    assert data is None  # as written, everything is commented out: the defaults
    full, _ = parse_yaml(_uncomment(CONFIG_TEMPLATE), source="template")
    assert isinstance(full, dict)
    assert Settings.model_validate(full) == Settings()
    assert _leaves(full) == _leaves(Settings().model_dump())


# ------------------------------------------------------------------------------------------ config show


def test_config_show_redacts_env_and_file_urls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token in a tgram:// URL, given by the file or by AMBIENT_NOTIFY_URLS, never appears; sources are named."""
    root = tmp_path / "brain"
    (root / "profil").mkdir(parents=True)
    (root / "profil" / "ambient.yml").write_text(
        f"tick_seconds: 5\nnotify:\n  urls: ['{TOKEN_URL}']\nrunners:\n  coder:\n    kind: command\n"
        f"    argv: [/bin/true]\n    env: {{API_KEY: {CANARY}}}\n"
    )
    assert main(["config", "show", "--brain", str(root)]) == 0
    text = capsys.readouterr()
    assert CANARY not in text.out + text.err
    rows = {line.split()[0]: line for line in text.out.splitlines() if not line.startswith("#")}
    assert rows["tick_seconds"].endswith("profil/ambient.yml:1")
    assert rows["notify.urls"].endswith("profil/ambient.yml:3") and "tgram://" in rows["notify.urls"]
    assert rows["concurrency"].endswith("default")
    monkeypatch.setenv("AMBIENT_NOTIFY_URLS", f"{TOKEN_URL}, json://localhost/hook")
    monkeypatch.setenv("AMBIENT_CONCURRENCY", "7")
    assert main(["config", "show", "--brain", str(root), "--json"]) == 0
    raw = capsys.readouterr().out
    assert CANARY not in raw
    data = json.loads(raw)
    assert data["settings"]["concurrency"] == 7
    assert data["sources"]["concurrency"] == "$AMBIENT_CONCURRENCY"
    assert data["sources"]["notify.urls"] == "$AMBIENT_NOTIFY_URLS"
    assert len(data["settings"]["notify"]["urls"]) == 2
    assert data["settings"]["runners"]["coder"]["env"] == {"API_KEY": "****"}
    assert data["environment"] == ["AMBIENT_CONCURRENCY", "AMBIENT_NOTIFY_URLS"]


def test_config_show_without_file_gives_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No profil/ambient.yml: the defaults, each marked as such."""
    (tmp_path / "agents").mkdir()  # a brain without its configuration file
    assert main(["config", "show", "--brain", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["file_exists"] is False
    assert data["settings"] == Settings().redacted()
    assert set(data["sources"].values()) == {"default"}


def test_config_show_invalid_exits_1_with_file_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo and a bad value are reported at their lines, a bad override by its variable; exit 1 (as `validate`);
    no secret."""
    root = tmp_path / "brain"
    (root / "profil").mkdir(parents=True)
    (root / "profil" / "ambient.yml").write_text(
        f"tick_seconds: 30\nconcurency: 3\nnotify:\n  urls: ['{TOKEN_URL}']\n  retry_base_s: -1\n"
    )
    monkeypatch.setenv("AMBIENT_LOG_LEVEL", "loud")
    assert main(["config", "show", "--brain", str(root)]) == 1
    text = capsys.readouterr()
    err = text.err.splitlines()
    assert "profil/ambient.yml:2: concurency: unknown key; did you mean 'concurrency'? (got 3)" in err
    assert any(line.startswith("profil/ambient.yml:5: notify.retry_base_s: ") for line in err)
    assert any(line.startswith("$AMBIENT_LOG_LEVEL: log_level: ") for line in err)
    assert "# profil/ambient.yml and $AMBIENT_LOG_LEVEL are invalid (3 error(s), 0 warning(s) on stderr)" in text.out
    assert CANARY not in text.out + text.err
    (root / "profil" / "ambient.yml").write_text("notify: [\n")
    monkeypatch.delenv("AMBIENT_LOG_LEVEL")
    assert main(["config", "show", "--brain", str(root)]) == 1
    assert re.search(r"^profil/ambient\.yml:\d+: ", capsys.readouterr().err, re.M)


def test_an_unknown_key_of_an_optional_section_lists_the_keys_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cluster:`` is optional (``ClusterSettings | None``): a key it does not know lists the keys it does (the
    list came out empty: ``the keys here:  (got 10)``)."""
    root = tmp_path / "brain"
    (root / "profil").mkdir(parents=True)
    (root / "profil" / "ambient.yml").write_text("cluster:\n  urls: [nats://127.0.0.1:4222]\n  zzz: 10\n")
    assert main(["config", "show", "--brain", str(root)]) == 1
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "cluster.zzz" in ln]
    assert line.startswith("profil/ambient.yml:3: cluster.zzz: unknown key; the keys here: "), line
    assert "lease_s" in line and "dispatch" in line, line


def test_bad_override_is_blamed_on_its_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`validate` names $AMBIENT_X for a bad override; a non-mapping section under an override is its file line."""
    root = tmp_path / "brain"
    assert main(["init", str(root)]) == 0
    monkeypatch.setenv("AMBIENT_CONCURRENCY", "lots")
    assert main(["validate", "--brain", str(root)]) == 1
    assert "$AMBIENT_CONCURRENCY: concurrency: " in capsys.readouterr().out
    monkeypatch.delenv("AMBIENT_CONCURRENCY")
    (root / "profil" / "ambient.yml").write_text("log_level: info\nnotify: none\n")
    monkeypatch.setenv("AMBIENT_NOTIFY_URLS", TOKEN_URL)
    assert main(["config", "show", "--brain", str(root)]) == 1
    err = capsys.readouterr().err
    assert "profil/ambient.yml:2: notify: expected a mapping (key: value)" in err
    assert CANARY not in err
