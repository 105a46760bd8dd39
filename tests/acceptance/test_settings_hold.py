"""README, "Configuration": the settings a person writes hold, in the running daemon too (issue 23.4, 23.5)."""

from __future__ import annotations

import signal
import time

from tests.acceptance.harness import Brain, Webhook, wait

FAILING_AGENT = """
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
    """Issue 23.5: `concurrency:` in profil/ambient.yml caps the agents running at once, all runs together."""
    brain.config("concurrency: 2\n")
    brain.python_agent("counter", COUNTING_AGENT)
    _fan_out(brain, "left", 4, concurrency=4)
    _fan_out(brain, "right", 4, concurrency=4)
    brain.until_idle()
    assert [r["outcome"] for r in brain.finished()] == ["success", "success"]
    assert brain.read("count/peak.txt") == "2"


def test_a_for_each_without_its_own_concurrency_uses_the_daemons(brain: Brain) -> None:
    """Issue 23.5: a for_each that sets no concurrency runs as many at once as the daemon allows."""
    brain.config("concurrency: 3\n")
    brain.python_agent("counter", COUNTING_AGENT)
    _fan_out(brain, "batch", 6, concurrency=None)
    brain.until_idle()
    assert brain.read("count/peak.txt") == "3"


def test_the_environment_override_caps_too(brain: Brain) -> None:
    """Issue 23.5: AMBIENT_CONCURRENCY wins over the file, as every environment override does."""
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
    assert shown.rc == 2 and "$AMBIENT_CONCURRENCY: concurrency:" in shown.err, shown


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
    """Issue 23.4: after SIGHUP the next escalation goes to the new URL only; `doctor` flags a daemon that runs
    with other settings than the file's until it reloads."""
    brain.python_agent("broken", FAILING_AGENT)
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
    """Issue 23.4: the daemon watches profil/ambient.yml: a URL added while it runs is used at once."""
    brain.python_agent("broken", FAILING_AGENT)
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
    brain.python_agent("broken", FAILING_AGENT)
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
    """Issue 23.15: the lock a step takes on its scope (lock_ttl_min) is renewed while its agent runs: a contender
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
