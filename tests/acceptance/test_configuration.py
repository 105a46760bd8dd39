"""README, "Configuration": profil/ambient.yml, `ambient config`, the environment overrides, and what they change."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from tests.acceptance.harness import AMBIENT, Brain, Webhook, ambient, clean_env, wait

README = Path(__file__).resolve().parents[2] / "README.md"

OK_AGENT = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"status": "ok"}))
"""

FAILING_AGENT = """
    import sys
    print("the instance is down", file=sys.stderr)
    sys.exit(1)
"""

# Ignores SIGTERM and would run for a minute: only the end of the grace period (SIGKILL of its group) stops it.
STUBBORN_AGENT = """
    import os, pathlib, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace").mkdir(exist_ok=True)
    pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace", os.environ["AMBIENT_ITEM"] + ".started").write_text("")
    time.sleep(60)
"""


def _readme_block() -> str:
    """The configuration block of the README's "Configuration" section, as printed there."""
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _workflow(brain: Brain, name: str, agent: str = "ok", items: str = "[a]") -> None:
    brain.workflow(
        name,
        f"""
        workflow: {name}
        for_each:
          items: {items}
          spawn: {agent}
          scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}
    """,
    )


def _run_idle(brain: Brain, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ambient run --until-idle` with its output in a pipe (not a terminal), as under systemd."""
    return subprocess.run(
        [*AMBIENT, "--brain", str(brain.root), "run", "--until-idle", *args],
        capture_output=True,
        text=True,
        env=clean_env(env),
        timeout=120,
        check=False,
    )


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# ---------------------------------------------------------------- the file


def test_every_key_of_the_readme_block_is_accepted(brain: Brain) -> None:
    """Every key of the README's configuration block is accepted, and `config show` reports it from the file."""
    block = _readme_block()
    brain.config(block)
    checked = brain.cli("validate")
    assert checked.rc == 0, checked
    shown = brain.ok("config", "show", "--json").json()
    assert shown["file_exists"] is True
    effective = _leaves(shown["settings"])
    lines = block.splitlines()
    for key, value in _leaves(yaml.safe_load(block)).items():
        assert key in effective, key
        if key != "notify.urls":
            assert effective[key] == value, (key, effective[key], value)
        source = shown["sources"][key]
        assert source.startswith("profil/ambient.yml:"), (key, source)
        line = lines[int(source.rsplit(":", 1)[1]) - 1]
        assert key.split(".")[-1] in line or key.split(".")[0] in line, (key, source, line)


def test_a_typo_is_an_error_with_its_line(brain: Brain) -> None:
    """A typo in profil/ambient.yml is an error with its line (validate, config show and doctor say so)."""
    brain.config("tick_seconds: 5\nnotify:\n  results: failures\n  retry_bse_s: 2\nlog_level: loud\n")
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert re.search(r"^profil/ambient\.yml:4: .*retry_bse_s", res.out, re.M), res
    assert re.search(r"^profil/ambient\.yml:5: .*log_level", res.out, re.M), res
    shown = brain.cli("config", "show")
    assert shown.rc == 2, shown
    assert "profil/ambient.yml:4:" in shown.err and "retry_bse_s" in shown.err, shown
    doctor = brain.cli("doctor", "--json")
    assert doctor.rc == 1
    assert any(f.get("line") == 4 or "profil/ambient.yml:4" in f["message"] for f in doctor.json()["findings"]), doctor


def test_config_show_prints_effective_values_with_their_source_and_masks_secrets(brain: Brain) -> None:
    """`ambient config show [--json]`: each effective value and where it comes from (file:line, $VAR, default);
    notification URLs masked."""
    secret = "s3cretPassw0rd"
    token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    brain.config(
        f'tick_seconds: 5\nnotify:\n  urls: ["json://ops:{secret}@127.0.0.1:9/hook", "tgram://{token}/123456789"]\n'
    )
    env = {"AMBIENT_LOG_LEVEL": "debug"}
    text = brain.ok("config", "show", env=env).out
    rows = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith("#")}
    assert re.search(r"5(\.0)?\s+profil/ambient\.yml:1$", rows["tick_seconds"]), rows["tick_seconds"]
    assert rows["log_level"].endswith("$AMBIENT_LOG_LEVEL") and '"debug"' in rows["log_level"]
    assert rows["lock_ttl_min"].endswith("default") and " 60 " in rows["lock_ttl_min"]
    assert rows["notify.urls"].endswith("profil/ambient.yml:3")
    data = brain.ok("config", "show", "--json", env=env)
    for out in (text, data.out):
        assert secret not in out and token not in out and token.split(":")[1] not in out
        assert "****" in out or "***" in out
    shown = data.json()
    assert shown["sources"]["tick_seconds"] == "profil/ambient.yml:1"
    assert shown["sources"]["log_level"] == "$AMBIENT_LOG_LEVEL"
    assert shown["sources"]["breaker_threshold"] == "default"
    assert shown["settings"]["tick_seconds"] == 5
    assert len(shown["settings"]["notify"]["urls"]) == 2


def test_config_template_is_the_commented_file(tmp_path: Path) -> None:
    """`ambient config template` prints the configuration with every setting commented (`ambient init` writes it)."""
    template = ambient("config", "template", cwd=tmp_path)
    assert template.rc == 0, template
    assert yaml.safe_load(template.out) is None  # every setting commented out
    for key in _leaves(yaml.safe_load(_readme_block())):
        leaf = key.split(".")[-1]
        assert re.search(rf"^#\s*{leaf}:", template.out, re.M), key
    made = Brain.init(tmp_path / "brain", "--no-example")
    assert made.read("profil/ambient.yml") == template.out


# ---------------------------------------------------------------- what the settings change


def test_tick_seconds_paces_the_timed_tick(brain: Brain) -> None:
    """`tick_seconds`: without file events (`--no-watch`) a dropped workflow is found at the next timed tick."""
    brain.config("tick_seconds: 0.3\n")
    brain.python_agent("ok", OK_AGENT)
    with brain.daemon("--no-watch"):
        _workflow(brain, "found")
        brain.wait_finished("found", timeout=10)  # the default (30 s) would not find it in time


def test_the_environment_tick_seconds_wins_over_the_file(brain: Brain) -> None:
    """`AMBIENT_TICK_SECONDS` wins over the file's tick_seconds."""
    brain.config("tick_seconds: 3600\n")
    brain.python_agent("ok", OK_AGENT)
    assert (
        brain.ok("config", "show", "--json", env={"AMBIENT_TICK_SECONDS": "0.3"}).json()["settings"]["tick_seconds"]
        == 0.3
    )
    with brain.daemon("--no-watch", env={"AMBIENT_TICK_SECONDS": "0.3"}):
        _workflow(brain, "found")
        brain.wait_finished("found", timeout=10)


def test_log_level_from_the_file_and_the_environment(brain: Brain) -> None:
    """`log_level` changes what the daemon logs; `AMBIENT_LOG_LEVEL` wins over the file."""
    brain.python_agent("ok", OK_AGENT)
    _workflow(brain, "hello")
    brain.config("log_level: warning\n")
    quiet = _run_idle(brain, "--log-format", "json")
    assert quiet.returncode == 0, quiet.stderr
    assert "daemon_ready" not in quiet.stdout + quiet.stderr
    assert all(r["level"] in ("warning", "error", "critical") for r in _json_lines(quiet.stdout + quiet.stderr))
    assert len(brain.finished("hello")) == 1

    brain.ok("start", "hello")
    loud = _run_idle(brain, "--log-format", "json", env={"AMBIENT_LOG_LEVEL": "debug"})
    records = _json_lines(loud.stdout + loud.stderr)
    levels = {r["level"] for r in records}
    assert "debug" in levels and "info" in levels, levels
    assert any(r["event"] == "agent_started" for r in records)

    brain.config("log_level: debug\n")
    brain.ok("start", "hello")
    ran = _run_idle(brain, "--log-format", "json")
    from_file = _json_lines(ran.stdout + ran.stderr)
    assert any(r["level"] == "debug" for r in from_file)
    brain.config("log_level: info\n")
    brain.ok("start", "hello")
    ran = _run_idle(brain, "--log-format", "json")
    info = _json_lines(ran.stdout + ran.stderr)
    assert info and not any(r["level"] == "debug" for r in info)
    assert any(r["event"] == "daemon_ready" for r in info)


def test_log_format_from_the_file_and_the_environment(brain: Brain) -> None:
    """`log_format`: auto gives JSON lines when not on a terminal; console from the file; `AMBIENT_LOG_FORMAT` wins."""
    brain.python_agent("ok", OK_AGENT)
    _workflow(brain, "hello")
    auto = _run_idle(brain)
    assert auto.returncode == 0, auto.stderr
    assert any(r.get("event") == "daemon_ready" for r in _json_lines(auto.stdout + auto.stderr)), auto.stdout

    brain.config("log_format: console\n")
    brain.ok("start", "hello")
    console = _run_idle(brain)
    text = console.stdout + console.stderr
    assert "daemon_ready" in text and not _json_lines(text), text

    brain.ok("start", "hello")
    env_json = _run_idle(brain, env={"AMBIENT_LOG_FORMAT": "json"})
    assert any(r.get("event") == "daemon_ready" for r in _json_lines(env_json.stdout + env_json.stderr))
    assert len(brain.finished("hello")) == 3


def _time_to_stop(brain: Brain, env: dict[str, str] | None = None) -> float:
    """Seconds from SIGTERM to the daemon's exit (0 required) while an agent ignores SIGTERM."""
    brain.python_agent("stubborn", STUBBORN_AGENT)
    _workflow(brain, "long", agent="stubborn")
    with brain.daemon(env=env) as daemon:
        wait(lambda: brain.path("workspace/a.started").exists(), "the agent to start")
        t0 = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert daemon.stop(timeout=90) == 0
        return time.monotonic() - t0


def test_shutdown_grace_from_the_file(brain: Brain) -> None:
    """`shutdown_grace_s`: the time running agents get at SIGTERM before their groups are killed."""
    brain.config("shutdown_grace_s: 0.5\n")
    assert _time_to_stop(brain) < 8  # the default grace is 10 s


def test_the_environment_shutdown_grace_wins_over_the_file(brain: Brain) -> None:
    """`AMBIENT_SHUTDOWN_GRACE` wins over the file's shutdown_grace_s."""
    brain.config("shutdown_grace_s: 120\n")
    assert _time_to_stop(brain, env={"AMBIENT_SHUTDOWN_GRACE": "0.5"}) < 8


def test_the_environment_notify_urls_replace_the_files_list(brain: Brain) -> None:
    """`AMBIENT_NOTIFY_URLS` replaces notify.urls of the file: escalations go to its URLs only."""
    with Webhook() as in_file, Webhook() as in_env:
        brain.config(f"""
            notify:
              urls: ["{in_file.url}"]
        """)
        brain.python_agent("deploy", FAILING_AGENT)
        _workflow(brain, "rollout", agent="deploy")
        with brain.daemon(env={"AMBIENT_NOTIFY_URLS": in_env.url}):
            [esc] = brain.wait_escalation("the failed item")
            wait(lambda: any(esc["id"] in t for t in in_env.texts()), "the escalation at the environment's URL")
            wait(brain.outbox_empty, "the outbox to be empty")
        assert in_file.posts == []


def test_ambient_brain_names_the_brain(brain: Brain, tmp_path: Path) -> None:
    """`AMBIENT_BRAIN` names the brain for the daemon and every command."""
    brain.python_agent("ok", OK_AGENT)
    _workflow(brain, "hello")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"AMBIENT_BRAIN": str(brain.root)}
    ran = ambient("run", "--until-idle", "--log-format", "json", cwd=elsewhere, env=env)
    assert ran.rc == 0, ran
    assert ambient("config", "show", "--json", cwd=elsewhere, env=env).json()["brain"] == str(brain.root)
    assert [r["workflow"] for r in ambient("runs", "--json", cwd=elsewhere, env=env).json()["finished"]] == ["hello"]
    assert not (elsewhere / ".ambient").exists()


def test_a_broken_file_at_reload_keeps_the_previous_version_and_says_why(brain: Brain) -> None:
    """A broken profil/ambient.yml at a reload keeps the previous settings and the log says why (file:line)."""
    brain.config("tick_seconds: 7\n")
    brain.python_agent("ok", OK_AGENT)
    with brain.daemon() as daemon:
        brain.config("tick_seconds: 7\nlog_levl: debug\n")
        daemon.signal(signal.SIGHUP)
        [problem] = daemon.wait_log("brain_problem", count=1)
        assert "profil/ambient.yml:2" in problem["problem"] and "log_levl" in problem["problem"], problem
        daemon.wait_log("config_invalid_kept_previous")
        brain.config("tick_seconds: [\n")
        wait(
            lambda: any(
                "profil/ambient.yml" in str(r.get("problem")) and "YAML" in str(r.get("problem"))
                for r in daemon.logged("brain_problem")
            ),
            "the YAML error in the log",
        )
        daemon.wait_log("config_invalid_kept_previous", count=2)
        reloads = daemon.wait_log("reloaded", count=2)
        assert all(r["tick_seconds"] == 7 for r in reloads), reloads
        _workflow(brain, "after")  # the daemon goes on, with the settings it had
        brain.wait_finished("after")
        assert daemon.proc is not None and daemon.proc.poll() is None


def test_breaker_threshold_trips_the_circuit_breaker(brain: Brain) -> None:
    """`breaker_threshold`: consecutive failures on one scope that trip the circuit breaker (1: the first one)."""
    brain.config("breaker_threshold: 1\n")
    brain.python_agent("coder", FAILING_AGENT)
    brain.workflow(
        "feature",
        """
        name: feature
        chain:
          - {step: 1, type: brain-write, scope: projets/feature/, agents: [coder]}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "circuit_break", esc
    assert "1 consecutive failure" in esc["question"], esc["question"]


def test_lock_ttl_min_is_the_ttl_of_the_locks_a_step_takes(brain: Brain) -> None:
    """`lock_ttl_min`: the TTL of the locks a step takes on its scope."""
    brain.config("lock_ttl_min: 7\n")
    brain.python_agent(
        "coder",
        """
        import json, os, pathlib, sys, time
        json.load(sys.stdin)
        work = pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace")
        work.mkdir(exist_ok=True)
        (work / "started").write_text("")
        deadline = time.monotonic() + 60
        while not (work / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "feature",
        """
        name: feature
        chain:
          - {step: 1, type: brain-write, scope: projets/feature/, agents: [coder]}
    """,
    )
    with brain.daemon():
        try:
            wait(lambda: brain.path("workspace/started").exists(), "the step's agent to run")
            [lock] = wait(lambda: brain.ok("lock", "list", "--json").json(), "the step's lock")
        finally:
            brain.write("workspace/go", "")
        brain.wait_finished("feature")
    info = lock["info"]
    assert lock["file"].startswith("projets/feature"), lock
    assert info["ttl_min"] == 7, info
    claimed, expires = (datetime.fromisoformat(info[k]) for k in ("claimed_at", "expires_at"))
    assert expires - claimed == timedelta(minutes=7)


def test_an_unquoted_chat_id_is_the_chat_it_names(brain: Brain) -> None:
    """`chat_id: 123456789` (YAML reads a number) is taken as written, not refused as "not a valid string"."""
    brain.config("telegram: {chat_id: -100123456}\n")
    shown = brain.ok("config", "show", "--json").json()
    assert shown["settings"]["telegram"]["chat_id"] == "-100123456", shown
