"""docs/configuration.md: profil/ambient.yml, `ambient config`, the environment overrides, and what they change."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.acceptance.harness import (
    AMBIENT,
    OK_AGENT,
    Brain,
    Webhook,
    ai_agent_md,
    ambient,
    clean_env,
    docs_section,
    run,
    wait,
)

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


def _documented_block() -> str:
    """The configuration block of the "Configuration" section (docs/configuration.md), as printed there."""
    return docs_section("Configuration").split("```yaml\n", 1)[1].split("```", 1)[0]


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


def test_every_key_of_the_documented_block_is_accepted(brain: Brain) -> None:
    """Every key of the documented configuration block is accepted, and `config show` reports it from the file."""
    block = _documented_block()
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
    assert shown.rc == 1, shown
    assert "profil/ambient.yml:4:" in shown.err and "retry_bse_s" in shown.err, shown
    doctor = brain.cli("doctor", "--json")
    assert doctor.rc == 1
    assert any(f.get("line") == 4 or "profil/ambient.yml:4" in f["message"] for f in doctor.json()["findings"]), doctor


def test_a_string_where_a_block_is_expected_says_a_mapping_is_expected_in_plain_words(brain: Brain) -> None:
    """`notify: "json://..."` (a URL where the notify block goes) is an error at its line that says a mapping is
    expected and shows its keys, never pydantic's "instance of NotifySettings"."""
    brain.config('tick_seconds: 5\nnotify: "json://127.0.0.1:9/hook"\n')
    res = brain.cli("validate")
    assert res.rc == 1, res
    [line] = [row for row in res.out.splitlines() if row.startswith("profil/ambient.yml:2: ")]
    assert "notify: expected a mapping" in line and "urls: [...]" in line, res
    assert "instance of" not in res.out and "NotifySettings" not in res.out, res


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


def test_config_show_of_an_invalid_file_shows_what_the_daemon_runs_with(brain: Brain, webhook: Webhook) -> None:
    """With an invalid profil/ambient.yml, `config show` prints the problems, then the
    settings a daemon starting on it uses (every valid key of the file, the others at their defaults), labelled
    as such; exit 1, as `validate` exits on the same file."""
    brain.config(f'tick_seconds: 7\nconcurency: 2\nlog_level: loud\nnotify:\n  urls: ["{webhook.url}"]\n')
    assert brain.cli("validate").rc == 1
    shown = brain.cli("config", "show")
    assert shown.rc == 1, shown
    assert "profil/ambient.yml:2:" in shown.err and "concurency" in shown.err, shown
    assert "profil/ambient.yml:3:" in shown.err and "log_level" in shown.err, shown
    assert "the configuration is invalid" not in shown.text, shown
    assert re.search(r"^# profil/ambient\.yml is invalid .*the valid keys", shown.out, re.M), shown
    rows = {line.split()[0]: line for line in shown.out.splitlines() if line and not line.startswith("#")}
    assert re.search(r"7(\.0)?\s+profil/ambient\.yml:1$", rows["tick_seconds"]), rows
    assert rows["concurrency"].endswith("default"), rows
    assert '"info"' in rows["log_level"] and "profil/ambient.yml:3 is invalid" in rows["log_level"], rows
    assert rows["notify.urls"].endswith("profil/ambient.yml:5"), rows
    data = brain.cli("config", "show", "--json")
    assert data.rc == 1, data
    report = data.json()
    assert report["valid"] is False and report["settings"]["tick_seconds"] == 7, report
    assert any("concurency" in p for p in report["problems"]), report
    brain.config("tick_seconds: 7\n")
    assert brain.ok("config", "show", "--json").json()["valid"] is True


def test_config_template_is_the_commented_file(tmp_path: Path) -> None:
    """`ambient config template` prints the configuration with every setting commented (`ambient init` writes it)."""
    template = ambient("config", "template", cwd=tmp_path)
    assert template.rc == 0, template
    assert yaml.safe_load(template.out) is None  # every setting commented out
    for key in _leaves(yaml.safe_load(_documented_block())):
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
    """A broken profil/ambient.yml at a reload keeps the previous settings and the log says why (file:line); one
    that does not parse runs on the last copy that loaded."""
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
        # A file that does not parse at all: the last copy that loaded runs (here the previous settings' own file).
        [kept] = daemon.wait_log("config_invalid_last_good_used")
        assert "profil/ambient.yml" in str(kept), kept
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


# ---------------- the settings a person writes hold, in the running daemon too

EXIT_1_AGENT = """
    import sys
    sys.exit(1)
"""

# Counts the agents running at once across every run: each one holds a file in running/ while it works, and the
# highest count it saw goes to peak.txt (under an flock, so two agents never count at the same moment).
COUNTING_AGENT = """
    import fcntl, json, os, pathlib, sys, time
    packet = json.load(sys.stdin)
    base = pathlib.Path(os.environ["AMBIENT_BRAIN"], "count")
    (base / "running").mkdir(parents=True, exist_ok=True)
    me = base / "running" / os.environ["AMBIENT_KEY"].replace("/", "_")

    def counted(change):
        with open(base / "lock", "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            change()
            now = len(list((base / "running").iterdir()))
            peak = base / "peak.txt"
            best = int(peak.read_text()) if peak.exists() else 0
            peak.write_text(str(max(best, now)))

    counted(me.touch)
    time.sleep(0.4)  # the agent's work: long enough for the others to start beside it if they may
    counted(me.unlink)
    print(json.dumps({"status": "ok"}))
"""


def _fan_out(brain: Brain, name: str, items: int, concurrency: int | None) -> None:
    own = f"\n  concurrency: {concurrency}" if concurrency is not None else ""
    names = ", ".join(f"{name}-{i}" for i in range(items))
    brain.workflow(
        name,
        f"""
workflow: {name}
for_each:
  items: [{names}]
  spawn: counter{own}
  scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}
""",
    )


def test_concurrency_caps_every_run_together(brain: Brain) -> None:
    """`concurrency:` in profil/ambient.yml caps the agents running at once, all runs together."""
    brain.config("concurrency: 2\n")
    brain.python_agent("counter", COUNTING_AGENT)
    _fan_out(brain, "left", 4, concurrency=4)
    _fan_out(brain, "right", 4, concurrency=4)
    brain.until_idle()
    assert [r["outcome"] for r in brain.finished()] == ["success", "success"]
    assert brain.read("count/peak.txt") == "2"


def test_a_for_each_without_its_own_concurrency_uses_the_daemons(brain: Brain) -> None:
    """A for_each that sets no concurrency runs as many at once as the daemon allows."""
    brain.config("concurrency: 3\n")
    brain.python_agent("counter", COUNTING_AGENT)
    _fan_out(brain, "batch", 6, concurrency=None)
    brain.until_idle()
    assert brain.read("count/peak.txt") == "3"


def test_the_environment_override_caps_too(brain: Brain) -> None:
    """AMBIENT_CONCURRENCY wins over the file, as every environment override does."""
    brain.config("concurrency: 4\n")
    brain.python_agent("counter", COUNTING_AGENT)
    _fan_out(brain, "left", 3, concurrency=3)
    _fan_out(brain, "right", 3, concurrency=3)
    res = brain.cli("run", "--until-idle", "--log-format", "json", env={"AMBIENT_CONCURRENCY": "1"})
    assert res.rc == 0, res
    assert brain.read("count/peak.txt") == "1"


def test_a_bad_environment_override_is_the_variables_fault_and_the_file_still_holds(brain: Brain) -> None:
    """A bad AMBIENT_CONCURRENCY is reported as the variable's (not the file's line), and the file's valid
    `concurrency: 1` holds instead of a default; `config show` says the same."""
    brain.config("concurrency: 1\n")
    brain.python_agent("counter", COUNTING_AGENT)
    _fan_out(brain, "batch", 3, concurrency=None)
    res = brain.cli("run", "--until-idle", "--log-format", "json", env={"AMBIENT_CONCURRENCY": "abc"})
    assert res.rc == 0, res
    assert "$AMBIENT_CONCURRENCY: concurrency:" in res.err and "profil/ambient.yml:1" not in res.err, res.err
    assert brain.read("count/peak.txt") == "1"
    shown = brain.cli("config", "show", env={"AMBIENT_CONCURRENCY": "abc"})
    assert shown.rc == 1 and "$AMBIENT_CONCURRENCY: concurrency:" in shown.err, shown
    assert re.search(r"^concurrency\s+1\s+profil/ambient\.yml:1$", shown.out, re.M), shown


def _header(shown: Any) -> str:
    """The line of `config show` that says what is wrong (the one after the file and environment lines)."""
    heads = [line for line in shown.out.splitlines() if line.startswith("# ")]
    assert len(heads) >= 3, shown
    return str(heads[2])


def test_config_show_blames_a_bad_environment_variable_not_the_file(brain: Brain) -> None:
    """`AMBIENT_CONCURRENCY=abc` with a valid file: `config show` says the variable is invalid, not the file, and
    shows the file's value in effect, as the daemon runs."""
    brain.config("concurrency: 1\n")
    shown = brain.cli("config", "show", env={"AMBIENT_CONCURRENCY": "abc"})
    assert shown.rc == 1 and "$AMBIENT_CONCURRENCY: concurrency:" in shown.err, shown
    assert _header(shown).startswith("# $AMBIENT_CONCURRENCY is invalid (1 error(s), 0 warning(s) on stderr)"), shown
    assert "profil/ambient.yml is invalid" not in shown.out, shown
    assert re.search(r"^concurrency\s+1\s+profil/ambient\.yml:1$", shown.out, re.M), shown
    both = brain.cli("config", "show", env={"AMBIENT_CONCURRENCY": "abc", "AMBIENT_LOG_LEVEL": "loud"})
    assert _header(both).startswith("# $AMBIENT_CONCURRENCY and $AMBIENT_LOG_LEVEL are invalid (2 error(s)"), both
    brain.config("concurrency: 1\nconcurency: 2\n")
    mixed = brain.cli("config", "show", env={"AMBIENT_CONCURRENCY": "abc"})
    assert _header(mixed).startswith("# profil/ambient.yml and $AMBIENT_CONCURRENCY are invalid (2 error(s)"), mixed


def _summary(res: Any) -> str:
    """`validate`'s count: `2 error(s), 1 warning(s)`."""
    found = re.search(r"^(\d+ error\(s\), \d+ warning\(s\)) in ", res.out, re.M)
    assert found, res
    return str(found[1])


def test_config_show_marks_a_runner_the_daemon_refuses_and_counts_as_validate(brain: Brain) -> None:
    """A `runners:` entry that does not validate (argv a string) is refused by the daemon: `config show` marks it
    refused with its problem, not in effect, and one whose agent has its own runner as not used; its count of the
    file's problems is `ambient validate profil/ambient.yml`'s."""
    brain.write("agents/greeter.md", ai_agent_md("greeter", "Greets."))  # no runner of its own
    brain.python_agent("ok", OK_AGENT)  # a runner of its own, which wins over `runners: ok:`
    brain.config(
        "tick_seconds: 5\n"
        "concurency: 2\n"
        "runners:\n"
        '  greeter: {kind: command, argv: "python bin/greeter.py"}\n'
        '  ok: {kind: command, argv: ["true"]}\n'
    )
    _workflow(brain, "greet", agent="greeter")
    shown = brain.cli("config", "show")
    assert shown.rc == 1, shown
    assert "profil/ambient.yml:4: runner of greeter: argv: Input should be a valid list" in shown.err, shown
    rows = {line.split()[0]: line for line in shown.out.splitlines() if line and not line.startswith("#")}
    assert "refused (profil/ambient.yml:4: runner of greeter: argv:" in rows["runners.greeter"], rows
    assert not rows["runners.greeter"].endswith("profil/ambient.yml:4"), rows
    assert "not used (profil/ambient.yml:5: " in rows["runners.ok"] and "its own ambient.runner" in rows["runners.ok"]
    checked = brain.cli("validate", "profil/ambient.yml")
    assert checked.rc == 1, checked
    assert _summary(checked) == "2 error(s), 1 warning(s)", checked
    assert f"({_summary(checked)} on stderr)" in _header(shown), shown
    report = brain.cli("config", "show", "--json").json()
    assert report["refused"]["runners.greeter"].startswith("profil/ambient.yml:4: runner of greeter: argv:"), report
    assert "runners.ok" in report["refused"] and "tick_seconds" not in report["refused"], report
    assert len(report["problems"]) == 3, report
    assert brain.until_idle().rc == 0  # the daemon: that runner refused, the agent's items fail on it
    [greet] = [r for r in brain.status()["runs"] if r["workflow"] == "greet"]
    [item] = greet["items"]
    assert "has no runner that validates: profil/ambient.yml:4: runner of greeter: argv" in item["error"], greet


def test_a_misspelt_setting_is_named_with_the_one_it_looks_like(brain: Brain) -> None:
    """`concurency: 3` is an error at its line that names `concurrency`, in `validate` and `config show` alike."""
    brain.config("tick_seconds: 5\nconcurency: 3\n")
    for res in (brain.cli("validate"), brain.cli("config", "show")):
        assert res.rc != 0, res
        assert "profil/ambient.yml:2: concurency: unknown key; did you mean 'concurrency'?" in res.text, res


def test_validate_reads_default_agents_as_the_daemon_does(brain: Brain) -> None:
    """`default_agents:` of profil/ambient.yml names the agent of a step that names none, for `validate` too."""
    brain.config("default_agents: {search: finder}\n")
    brain.python_agent("finder", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'status': 'ok'}))\n")
    brain.workflow("look", "name: look\nchain:\n  - {step: 1, type: search, scope: projets/d/}\n")
    res = brain.cli("validate", "--strict")
    assert res.rc == 0 and "scout" not in res.text, res
    brain.until_idle()
    assert [r["outcome"] for r in brain.finished("look")] == ["success"]


def test_validate_reads_default_agents_from_the_last_good_settings_when_the_file_does_not_parse(brain: Brain) -> None:
    """A YAML syntax error in profil/ambient.yml: the daemon runs with the last good copy, whose `default_agents:`
    `validate` reads too (the syntax error is the one problem, no step blamed for an agent it would not use)."""
    brain.config("default_agents: {search: finder}\n")
    assert brain.until_idle().rc == 0  # the file loads: the daemon keeps it as the last good settings
    brain.python_agent("finder", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'status': 'ok'}))\n")
    brain.workflow("look", "name: look\nchain:\n  - {step: 1, type: search, scope: projets/d/}\n")
    brain.write("profil/ambient.yml", "default_agents: {search: finder}\ntick_seconds: [1\n")
    res = brain.cli("validate")
    assert res.rc == 1 and "scout" not in res.text, res
    assert res.out.splitlines()[-1] == "1 error(s), 0 warning(s) in 1 file(s)", res


def _machine_warnings(res: Any) -> int:
    return sum(1 for line in res.err.splitlines() if line.startswith("ambient: warning: run as root"))


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent user is ambient's own user unless ambient runs as root")
def test_validate_as_root_warns_of_the_agent_user_the_daemon_runs_and_says_so_in_its_summary() -> None:
    """As root, in a folder the agent user cannot reach, `validate` warns on stderr that every agent would fail to
    start, and its last line says so beside the files' count (exit 0: the files are fine). With `agent_user: root`
    then a syntax error, the daemon runs agents as root (the last good settings): no such warning."""
    closed = Path(tempfile.mkdtemp(prefix="ambient-closed-"))  # 0700: the agent user cannot reach a brain there
    try:
        brain = Brain.init(closed / "brain", "--no-example")
        validate = [*AMBIENT, "--brain", str(brain.root), "validate"]
        first = run(validate, agents=False)  # agents=False: no AMBIENT_AGENT_USER=root from the test's environment
        assert first.rc == 0 and _machine_warnings(first) >= 1, first
        many = _machine_warnings(first)
        about = f"{many} warning{'s' if many > 1 else ''} about this machine above"
        assert first.out.splitlines()[-1] == f"ok: 0 workflow(s) (0 draft), 0 warning(s); {about}", first
        brain.config("agent_user: root\n")
        assert run([*AMBIENT, "--brain", str(brain.root), "run", "--until-idle"], agents=False).rc == 0
        brain.write("profil/ambient.yml", "agent_user: root\ntick_seconds: [1\n")
        broken = run(validate, agents=False)
        assert broken.rc == 1 and _machine_warnings(broken) == 0, broken
        assert broken.out.splitlines()[-1] == "1 error(s), 0 warning(s) in 1 file(s)", broken
        brain.config("agent_user: ambient-agent\ntick_seconds: [1\n")  # a first start here would run as root too
        assert _machine_warnings(run(validate, agents=False)) == 0
    finally:
        shutil.rmtree(closed)


def test_settings_that_cannot_work_in_this_brain_are_named_by_validate_and_doctor(brain: Brain) -> None:
    """A `default_sender:` nobody holds (every packet a workflow sends would be denied) and Telegram answers without
    a chat are errors at their lines, in `validate` and `doctor` alike."""
    brain.config("default_sender: ambiant\ntelegram: {answers: true}\n")
    for res in (brain.cli("validate"), brain.cli("doctor")):
        assert res.rc == 1, res
        assert "profil/ambient.yml:1: default_sender: 'ambiant' is no principal" in res.text, res
        assert "did you mean 'ambient'?" in res.text, res
        assert "profil/ambient.yml:2: telegram.answers: Telegram answers are on but telegram.chat_id is not set" in (
            res.text
        ), res


def test_a_notification_url_that_is_no_url_is_an_error_and_its_secret_is_shown_nowhere(
    brain: Brain, webhook: Webhook
) -> None:
    """A `:` forgotten in a Telegram URL (`tgram//TOKEN/CHAT`): `validate` and `doctor` name it an error at its line
    by its place in the list, never its value (the token is in it); `config show`, `doctor`, `notify test` and the
    daemon's log mask it whole; the other URL still gets the question."""
    secret = "AAHsuperSECRETtoken"
    brain.config(f'notify:\n  urls: ["tgram//123456789:{secret}/987654", "{webhook.url}"]\n')
    seen = []
    for args in (("validate",), ("doctor",)):
        res = brain.cli(*args)
        assert res.rc == 1 and "profil/ambient.yml:2: notify.urls: URL number 1 is not a URL" in res.text, res
        seen.append(res.text)
    shown = brain.cli("config", "show")
    tested = brain.cli("notify", "test")
    assert tested.rc == 1 and "FAIL  ***" in tested.out, tested
    brain.python_agent("broken", "import sys\nsys.stdin.read()\nsys.exit(3)\n")
    _escalate(brain, "asks")
    with brain.daemon() as daemon:
        wait(lambda: webhook.posts, "the question to reach the URL that works")
        daemon.stop()
        log = daemon.log_path.read_text()
    kept = brain.path(".ambient/settings.last-good.yml")  # the file itself, kept as the daemon loaded it (0600)
    state = {p: p.read_text(errors="replace") for p in brain.path(".ambient").rglob("*") if p.is_file() and p != kept}
    assert [p for p, text in state.items() if secret in text] == []
    for text in (*seen, shown.text, tested.text, log):
        assert secret not in text, text[-2000:]


def _escalate(brain: Brain, name: str) -> None:
    brain.workflow(
        name,
        f"""
workflow: {name}
for_each:
  items: [one]
  spawn: broken
  scope: {{zone: project, files: ["workspace/{name}.md"]}}
""",
    )


def test_sighup_reloads_notify_urls(brain: Brain) -> None:
    """After SIGHUP the next escalation goes to the new URL only; `doctor` flags a daemon that runs
    with other settings than the file's until it reloads."""
    brain.python_agent("broken", EXIT_1_AGENT)
    with Webhook() as old, Webhook() as new:
        brain.config(f'notify:\n  urls: ["{old.url}"]\n')
        with brain.daemon("--no-watch") as daemon:  # only SIGHUP reloads: what systemctl reload does
            _escalate(brain, "first")
            daemon.signal(signal.SIGHUP)
            wait(lambda: any("first" in t for t in old.texts()), "the first escalation at the old URL")
            brain.config(f'notify:\n  urls: ["{new.url}"]\n')
            stale = brain.cli("doctor")
            assert "notify.urls" in stale.text and "reload" in stale.text, stale
            daemon.signal(signal.SIGHUP)
            daemon.wait_log("reloaded", settings_changed=["notify.urls"])
            assert "notify.urls" not in brain.cli("doctor").text
            _escalate(brain, "second")
            daemon.signal(signal.SIGHUP)
            wait(lambda: any("second" in t for t in new.texts()), "the second escalation at the new URL")
        assert not any("second" in t for t in old.texts()), old.texts()


def test_editing_the_config_file_reloads_it(brain: Brain, webhook: Webhook) -> None:
    """The daemon watches profil/ambient.yml: a URL added while it runs is used at once."""
    brain.python_agent("broken", EXIT_1_AGENT)
    with brain.daemon() as daemon:
        brain.config(f'notify:\n  urls: ["{webhook.url}"]\n')
        daemon.wait_log("reloaded", settings_changed=["notify.urls"])
        _escalate(brain, "late")
        wait(
            lambda: any("Decision needed" in t and "late" in t for t in webhook.texts()),
            "the escalation at the URL added while the daemon runs",
        )


def test_a_daemon_started_with_a_typo_in_its_config_keeps_every_valid_key(brain: Brain, webhook: Webhook) -> None:
    """A typo (`concurency: 3`) is an error at its line, and the daemon starts with every other key of the file:
    its notification URL still carries your questions (on bare defaults they waited unseen)."""
    brain.python_agent("broken", EXIT_1_AGENT)
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\nconcurency: 3\n')
    _escalate(brain, "typo")
    res = brain.until_idle()
    assert "profil/ambient.yml:3" in res.err and "concurency" in res.err, res
    wait(lambda: any("Decision needed" in t and "typo" in t for t in webhook.texts()), "the question at the URL")
    doctor = brain.cli("doctor")
    assert "profil/ambient.yml:3" in doctor.text and "keys that are valid" in doctor.text, doctor
    assert "nobody is told" not in doctor.text and "reach nobody" not in doctor.text, doctor


# Works for a while (until released, or 1.5 s), noting when it started, got SIGTERM and finished.
PATIENT_AGENT = """
    import json, os, pathlib, signal, sys, time
    json.load(sys.stdin)
    base = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    signal.signal(signal.SIGTERM, lambda *_: ((base / "term").write_text("x"), sys.exit(0)))
    (base / "started").write_text(str(time.time()))
    end = time.time() + 1.5
    while time.time() < end:
        time.sleep(0.05)
    (base / "finished").write_text(str(time.time()))
    print(json.dumps({"status": "ok"}))
"""


def test_shutdown_grace_lets_running_agents_finish(brain: Brain) -> None:
    """`shutdown_grace_s`: on SIGTERM, running agents get that long to finish their work; none is interrupted when
    it is enough, and the run ends with its result recorded."""
    brain.config("shutdown_grace_s: 20\n")
    brain.python_agent("patient", PATIENT_AGENT)
    brain.workflow(
        "steady",
        """
        workflow: steady
        for_each: {items: [one], spawn: patient}
    """,
    )
    with brain.daemon() as daemon:
        wait(lambda: brain.path("started").exists(), "the agent to start")
        assert daemon.stop() == 0
    assert brain.path("finished").exists() and not brain.path("term").exists()
    [record] = brain.finished("steady")
    assert record["outcome"] == "success"


def test_shutdown_grace_then_sigterm_for_those_still_running(brain: Brain) -> None:
    """`shutdown_grace_s` shorter than the work: the agent then gets SIGTERM; its item runs again at the next start."""
    brain.config("shutdown_grace_s: 0.2\n")
    brain.python_agent("patient", PATIENT_AGENT)
    brain.workflow(
        "steady",
        """
        workflow: steady
        for_each: {items: [one], spawn: patient}
    """,
    )
    with brain.daemon() as daemon:
        wait(lambda: brain.path("started").exists(), "the agent to start")
        assert daemon.stop() == 0
    assert brain.path("term").exists() and not brain.path("finished").exists()
    assert brain.finished("steady") == []
    brain.path("started").unlink()
    brain.until_idle()
    [record] = brain.finished("steady")
    assert record["outcome"] == "success" and brain.path("finished").exists()


def test_a_long_agent_keeps_its_scope_lock_past_the_ttl(brain: Brain) -> None:
    """The lock a step takes on its scope (lock_ttl_min) is renewed while its agent runs: a contender
    finds it held after the first TTL, and it is free once the agent is done."""
    brain.config("lock_ttl_min: 0.02\n")  # 1.2 s; an expired lock is taken over 5 s (its grace) after that
    brain.python_agent(
        "slow",
        """
        import json, os, pathlib, sys, time
        json.load(sys.stdin)
        base = pathlib.Path(os.environ["AMBIENT_BRAIN"])
        (base / "started").write_text(str(time.time()))
        while not (base / "release").exists():
            time.sleep(0.05)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "long",
        """
        workflow: long
        for_each: {items: [a], spawn: slow, scope: {files: ["projets/long/{{item}}.md"]}}
    """,
    )
    with brain.daemon():
        wait(lambda: brain.path("started").exists(), "the agent to start")
        started = float(brain.read("started"))
        wait(lambda: time.time() > started + 7, "a time past the first lease and its grace (1.2 + 5 s)")
        taken = brain.cli("lock", "acquire", "projets/long/a.md", "sess-contender")
        assert taken.rc == 1, taken  # held by the agent's step still: its lease was renewed
        brain.write("release", "x")
        brain.wait_finished("long")
    assert brain.cli("lock", "check", "projets/long/a.md").rc == 0  # released with the agent


def test_config_show_masks_the_credentials_of_a_url_not_the_url(brain: Brain) -> None:
    """`ambient config show` shows each notification URL as the daemon uses it, only its credentials masked
    (user:password, a bot token, a `?token=`), so a person can check which URL it is."""
    token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    brain.config(
        "notify:\n  urls:\n"
        '    - "json://127.0.0.1:8765/hooks/ambient"\n'
        '    - "json://ops:s3cretPassw0rd@alerts.example:9/hook?token=abcdefgh12345"\n'
        f'    - "tgram://{token}/4242"\n'
    )
    for args in (("config", "show"), ("config", "show", "--json")):
        out = brain.ok(*args).out
        assert "json://127.0.0.1:8765/hooks/ambient" in out, out
        assert "alerts.example:9/hook" in out and "s3cretPassw0rd" not in out and "abcdefgh12345" not in out, out
        assert "/4242" in out and token not in out and token.split(":")[1] not in out, out


def test_sighup_reads_a_changed_model_key_again_and_names_it_never_its_value(brain: Brain, tmp_path: Path) -> None:
    """A model key rotated in $CREDENTIALS_DIRECTORY: SIGHUP alone (the YAML unchanged) names it in the reload's
    `settings_changed`; a reload with nothing changed names nothing; the key's value is in no log line."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "anthropic_api_key").write_text("sk-ant-first-0123456789abcdef\n")
    brain.env["CREDENTIALS_DIRECTORY"] = str(creds)
    with brain.daemon("--no-watch") as daemon:
        (creds / "anthropic_api_key").write_text("sk-ant-second-0123456789abcdef\n")
        daemon.signal(signal.SIGHUP)
        daemon.wait_log("reloaded", trigger="sighup", settings_changed=["ANTHROPIC_API_KEY"])
        daemon.signal(signal.SIGHUP)
        daemon.wait_log("reloaded", trigger="sighup", settings_changed=[])
        log = daemon.log_path.read_text()
    assert "sk-ant-first" not in log and "sk-ant-second" not in log


def test_a_web_section_added_by_a_reload_says_it_waits_for_a_restart(tmp_path: Path) -> None:
    """Every setting takes effect at a reload but ``web:``: the hosted console starts with the daemon, so a reload
    that changes it says so instead of naming it changed and doing nothing."""
    brain = Brain.init(tmp_path / "brain")
    with brain.daemon() as daemon:
        brain.config(brain.read("profil/ambient.yml") + "\nweb:\n  port: 0\n")
        said = daemon.wait_log("setting_needs_restart")[0]
        assert said["setting"] == "web" and "restart" in said["fix"], said
        assert not daemon.logged("web_console_serving")


def test_a_config_that_stops_parsing_runs_on_its_last_good_settings(brain: Brain, webhook: Webhook) -> None:
    """A YAML syntax error leaves no key to salvage: the daemon runs with the last profil/ambient.yml that loaded
    (kept in .ambient/), says so with the error's file:line, and so do `doctor` and `config show`. Questions still
    reach the person's notification URL."""
    brain.python_agent("broken", EXIT_1_AGENT)
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\ntick_seconds: 5\n')
    brain.until_idle()  # the file loads: the daemon keeps it as the last good settings
    brain.write("profil/ambient.yml", brain.read("profil/ambient.yml") + "concurrency: [1\n")
    _escalate(brain, "syntax")
    res = brain.until_idle()
    wait(lambda: any("Decision needed" in t and "syntax" in t for t in webhook.texts()), "the question at the URL")
    used = [r for r in _json_lines(res.err) if r.get("event") == "config_invalid_last_good_used"]
    assert used, res
    assert re.match(r"profil/ambient\.yml:[45]: ", used[0]["problem"]), used
    assert used[0]["last_good"] == ".ambient/settings.last-good.yml" and used[0]["saved_at"], used
    assert not any(r.get("event") == "config_invalid_valid_keys_used" for r in _json_lines(res.err)), res
    doctor = brain.cli("doctor")
    assert re.search(r"profil/ambient\.yml:[45]", doctor.text), doctor
    assert "last good settings" in doctor.text and "keys that are valid" not in doctor.text, doctor
    assert "nobody is told" not in doctor.text and "reach nobody" not in doctor.text, doctor
    shown = brain.cli("config", "show")
    assert shown.rc == 1, shown
    assert re.search(r"profil/ambient\.yml:[45]", shown.err), shown
    assert re.search(r"^# profil/ambient\.yml does not load.*last good settings", shown.out, re.M), shown
    rows = {line.split()[0]: line for line in shown.out.splitlines() if line and not line.startswith("#")}
    assert rows["notify.urls"].endswith(".ambient/settings.last-good.yml:2"), rows
    assert re.search(r"5(\.0)?\s+\.ambient/settings\.last-good\.yml:3$", rows["tick_seconds"]), rows
    report = brain.cli("config", "show", "--json").json()
    assert report["valid"] is False and report["runs_with"] == "last_good", report
    assert report["settings"]["tick_seconds"] == 5 and len(report["settings"]["notify"]["urls"]) == 1, report


@pytest.mark.skipif(os.geteuid() != 0, reason="agent_user matters to a daemon run as root")
def test_a_config_that_stops_parsing_keeps_running_agents_as_its_agent_user(brain: Brain) -> None:
    """A daemon run as root whose file says `agent_user: root` (its agents cannot reach an interpreter under /root as
    `ambient-agent`) still runs them as root once a syntax error creeps into the file: the last good settings."""
    brain.python_agent("ok", OK_AGENT)
    brain.config("agent_user: root\n")
    _workflow(brain, "before")
    first = run([*AMBIENT, "--brain", str(brain.root), "run", "--until-idle", "--log-format", "json"], agents=False)
    assert first.rc == 0, first
    assert [r["outcome"] for r in brain.finished("before")] == ["success"], brain.finished("before")
    brain.write("profil/ambient.yml", "agent_user: root\ntick_seconds: [1\n")
    _workflow(brain, "after")
    again = run([*AMBIENT, "--brain", str(brain.root), "run", "--until-idle", "--log-format", "json"], agents=False)
    assert again.rc == 0, again
    events = [r.get("event") for r in _json_lines(again.err)]
    assert "config_invalid_last_good_used" in events and "agents_run_as" not in events, again
    assert [r["outcome"] for r in brain.finished("after")] == ["success"], brain.finished("after")


def test_a_first_start_on_a_config_that_does_not_parse_runs_on_defaults(brain: Brain) -> None:
    """Without a last good copy (the file never loaded), a file that does not parse leaves the defaults, as said by
    the daemon, `doctor` and `config show`; nothing is kept as last good."""
    brain.config("tick_seconds: 5\nnotify: {urls: [json://127.0.0.1:9/x]\n")
    res = brain.until_idle()
    events = [r.get("event") for r in _json_lines(res.err)]
    assert "config_invalid_valid_keys_used" in events and "config_invalid_last_good_used" not in events, res
    assert not brain.path(".ambient/settings.last-good.yml").exists()
    doctor = brain.cli("doctor")
    assert "profil/ambient.yml:3" in doctor.text and "starts on defaults" in doctor.text, doctor
    assert "runs with the last good settings" not in doctor.text, doctor
    shown = brain.cli("config", "show")
    assert shown.rc == 1 and "starts on defaults" in shown.out, shown
