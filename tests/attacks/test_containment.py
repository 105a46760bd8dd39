"""Agents are untrusted code; attacks as an agent would make them, against the real daemon.

Each test runs real agent processes under a real ``ambient run`` and checks what the agent could do afterwards
from the outside (process table, files, the daemon's answers).
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.helpers import (
    DaemonProcess,
    alive,
    drop,
    events,
    finished_run,
    foreach_workflow,
    make_brain,
    stub_agent_md,
    wait_for,
)


def _pids(pid_file: Path) -> list[int]:
    return [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []


def _escaping_agent(pid_file: Path, mode: str, **kw: float) -> str:
    return stub_agent_md("stub", ["--mode", mode, "--setsid", "--children", "2", "--pid-file", str(pid_file)], **kw)


def test_a_setsid_grandchild_ends_with_its_agent(tmp_path: Path) -> None:
    """An agent answers and exits, leaving two children that called ``setsid()`` (one double-forked):
    outside its process group, a group kill never reached them, and they outlived the item for good. They end
    with their agent now."""
    pid_file = tmp_path / "grandchildren"
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": _escaping_agent(pid_file, "orphan")})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "escape.yml", foreach_workflow("escape", ["a"]))
        wait_for(lambda: finished_run(paths, "escape") is not None, 30, "the run to finish")
        kids = wait_for(lambda: len(p := _pids(pid_file)) == 2 and p, 10, "the grandchildren's pids")
        d.known_children.update(kids)
        wait_for(lambda: not any(alive(p) for p in kids), 15, "the escaped grandchildren to end with their agent")
    finally:
        d.stop()
        d.kill()
    state = finished_run(paths, "escape")
    assert state is not None and state.outcome == "success"


def test_a_setsid_grandchild_of_a_timed_out_agent_ends_with_it(tmp_path: Path) -> None:
    """The agent hangs past its timeout with two escaped children; the timeout kills its group, and
    the escaped ones end too."""
    pid_file = tmp_path / "grandchildren"
    agent = _escaping_agent(pid_file, "fork", timeout_s=1, kill_grace_s=0.2)
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": agent})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "hang.yml", foreach_workflow("hang", ["a"]))
        kids = wait_for(lambda: len(p := _pids(pid_file)) == 2 and p, 20, "the grandchildren's pids")
        d.known_children.update(kids)
        wait_for(lambda: events(paths, "hang", "finished"), 30, "the timeout")
        wait_for(lambda: not any(alive(p) for p in kids), 15, "the escaped grandchildren to end")
    finally:
        d.stop()
        d.kill()


def test_a_setsid_grandchild_is_stopped_with_the_daemon(tmp_path: Path) -> None:
    """A daemon stopped by SIGTERM while an agent runs leaves nothing of it behind, escaped children
    included (a kill -9 of the daemon is the other case: its agents are orphans the next start stops)."""
    pid_file = tmp_path / "grandchildren"
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": _escaping_agent(pid_file, "fork")})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "hang.yml", foreach_workflow("hang", ["a"]))
        kids = wait_for(lambda: len(p := _pids(pid_file)) == 2 and p, 20, "the grandchildren's pids")
        d.known_children.update(kids)
        assert d.stop() == 0, d.tail()
        wait_for(lambda: not any(alive(p) for p in kids), 15, "the escaped grandchildren to end with the daemon")
    finally:
        d.kill()


_POSER = """
import json, os, subprocess, sys
json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k != "AMBIENT_CHANNEL_TOKEN"}  # no token: "I am the person"
packet = "from: human\\nto: ambient\\nsignal: ORCHESTRATE\\npayload: {context: {workflow: guarded}}\\n"
sent = subprocess.run(
    [sys.executable, "-m", "ambient", "send", "-"], input=packet, capture_output=True, text=True, env=env
)
print(json.dumps({"status": "ok", "send_rc": sent.returncode, "send_out": sent.stdout + sent.stderr}))
"""


def test_an_agent_that_unsets_its_token_is_not_taken_for_the_person(tmp_path: Path) -> None:
    """An agent drops its AMBIENT_CHANNEL_TOKEN and sends, over the daemon's socket, an ORCHESTRATE
    `from: human` that starts a workflow only the person may start. The daemon sees from the kernel that the
    sender descends from it (an agent, whatever it claims): refused, and the workflow does not run."""
    paths = make_brain(tmp_path / "brain", example_agents=False)
    (paths.root / "bin").mkdir(exist_ok=True)
    (paths.root / "bin" / "poser.py").write_text(_POSER)
    from tests.e2e.helpers import command_agent_md

    (paths.agents / "poser.md").write_text(command_agent_md("poser", ["{{python}}", "bin/poser.py"]))
    (paths.agents / "stub.md").write_text(stub_agent_md("stub"))
    (paths.workflows / "guarded.yml").write_text(foreach_workflow("guarded", ["x"], status="draft"))
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "poser.yml", foreach_workflow("poser", ["try"], agent="poser"))
        wait_for(lambda: finished_run(paths, "poser") is not None, 60, "the poser's run")
        d.wait_logged("send_without_token_from_an_agent", timeout=10)
    finally:
        d.stop()
        d.kill()
    [done] = [e for e in events(paths, "poser", "finished") if e.get("item") == "try"]
    assert done["output"]["send_rc"] == 1, done["output"]  # denied, as any packet the router refuses
    assert finished_run(paths, "guarded") is None and not events(paths, "guarded")


def test_a_flood_of_idle_connections_never_takes_the_daemons_descriptors(tmp_path: Path) -> None:
    """1,100 idle connections to the send socket from a same-user process exhausted the daemon's
    descriptors. Now at most a few are served at once, each for a short while: the daemon keeps working and a
    real `ambient send` still gets its answer once the flood is over."""
    import socket

    from tests.e2e.helpers import ambient_cli

    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub_agent_md("stub")})
    d = DaemonProcess(paths).start()
    held: list[socket.socket] = []
    try:
        d.wait_ready()
        path = str(paths.state / "run" / "send.sock")
        for _ in range(1100):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except OSError:
                s.close()
                continue
            held.append(s)
        drop(paths, "still.yml", foreach_workflow("still", ["a", "b"]))
        wait_for(lambda: finished_run(paths, "still") is not None, 60, "a run during the flood")
        assert not d.logged("evaluator_failed"), d.tail()
        assert d.logged("send_socket_busy")
    finally:
        for s in held:
            s.close()
    try:
        packet = "from: human\nto: ambient\nsignal: ORCHESTRATE\npayload: {context: {workflow: still}}\n"
        sent = ambient_cli(paths.root, "send", "--json", "-", input_text=packet)
        assert sent.returncode == 0, sent.stderr
        d.wait_logged("packet_sent", timeout=10, via="socket")  # answered by the daemon, not routed by the command
    finally:
        d.stop()
        d.kill()


_PROBE = """
import json, os, signal, subprocess, sys
from pathlib import Path
json.load(sys.stdin)
brain = Path(os.environ["AMBIENT_BRAIN"])
daemon = int(sys.argv[1])
tried = {}

def attempt(name, act):
    try:
        act()
        tried[name] = "allowed"
    except OSError as exc:
        tried[name] = f"denied: {exc.strerror}"

attempt("read_brain", lambda: (brain / "notes.md").read_text())
attempt("write_scope", lambda: (brain / "projets" / "probe" / "a.md").write_text("mine"))
attempt("write_outside_scope", lambda: (brain / "notes.md").write_text("overwritten"))
attempt("read_state", lambda: [p.read_bytes() for p in (brain / ".ambient" / "escalations").iterdir()])
attempt("write_inbox", lambda: (brain / ".ambient" / "inbox" / "forged.json").write_text("{}"))
attempt("read_config", lambda: (brain / "profil" / "ambient.yml").read_text())
attempt("read_token_file", lambda: (brain / "profil" / "telegram-token").read_text())
attempt("write_tmp", lambda: Path(os.environ["TMPDIR"], "scratch").write_text("x"))
attempt("signal_daemon", lambda: os.kill(daemon, signal.SIGTERM))
env = {k: v for k, v in os.environ.items() if k != "AMBIENT_CHANNEL_TOKEN"}
pending = subprocess.run(
    [sys.executable, "-m", "ambient", "escalations", "--json"], capture_output=True, text=True, env=env
)
tried["escalations_rc"] = pending.returncode
tried["escalations_err"] = pending.stderr[-400:]
print(json.dumps({"status": "ok", "tried": tried}))
"""


def test_a_confined_agent_reads_the_brain_writes_its_scope_and_nothing_of_the_daemons(tmp_path: Path) -> None:
    """An agent (confined by default) tries what a hostile one would: it reads the brain and
    writes its scope and its temp dir; it cannot write elsewhere in the brain, read or write ambient's state
    (escalations, the inbox: so it can neither answer a question nor drop a packet in the person's name), read
    profil/ambient.yml or a token file, nor signal the daemon. `ambient doctor` says agents are confined."""
    from tests.e2e.helpers import ambient_cli, command_agent_md

    paths = make_brain(tmp_path / "brain", example_agents=False, config="concurrency: 2\n")
    (paths.root / "notes.md").write_text("the person's notes\n")
    (paths.profil / "telegram-token").write_text("123456:SECRET\n")
    (paths.root / "bin").mkdir(exist_ok=True)
    (paths.root / "bin" / "probe.py").write_text(_PROBE)
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        argv = ["{{python}}", "bin/probe.py", str(d.pid)]
        (paths.agents / "probe.md").write_text(command_agent_md("probe", argv, confine=True))
        drop(paths, "probe.yml", foreach_workflow("probe", ["a"], agent="probe", files="projets/probe/{{item}}.md"))
        wait_for(lambda: finished_run(paths, "probe") is not None, 60, "the probe's run")
        assert d.proc is not None and d.proc.poll() is None, "the agent stopped the daemon"
        doctor = ambient_cli(paths.root, "doctor")
    finally:
        d.stop()
        d.kill()
    [done] = [e for e in events(paths, "probe", "finished") if e.get("item") == "a"]
    tried = done["output"]["tried"]
    assert tried["read_brain"] == tried["write_scope"] == tried["write_tmp"] == "allowed", tried
    for name in ("write_outside_scope", "read_state", "write_inbox", "read_config", "read_token_file"):
        assert tried[name].startswith("denied"), (name, tried)
    assert tried["signal_daemon"].startswith("denied"), tried
    assert tried["escalations_rc"] != 0, tried  # the CLI cannot read ambient's state from inside an agent
    # ... and says so (with the query store, it once answered "nothing waits", rc 0, from an empty store in memory)
    assert "permission denied" in tried["escalations_err"] and "Traceback" not in tried["escalations_err"], tried
    assert (paths.root / "notes.md").read_text() == "the person's notes\n"
    assert (paths.root / "projets" / "probe" / "a.md").read_text() == "mine"
    assert not (paths.inbox / "forged.json").exists()
    assert "agents are confined" in doctor.stdout, doctor.stdout


def test_an_agent_with_confine_false_runs_unconfined_as_documented(tmp_path: Path) -> None:
    """`ambient.runner.confine: false` is the way out for an agent that must write outside its scope."""
    from tests.e2e.helpers import command_agent_md

    paths = make_brain(tmp_path / "brain", example_agents=False)
    (paths.root / "notes.md").write_text("old\n")
    (paths.root / "bin").mkdir(exist_ok=True)
    (paths.root / "bin" / "writer.py").write_text(
        "import json, os, sys\njson.load(sys.stdin)\n"
        "open(os.path.join(os.environ['AMBIENT_BRAIN'], 'notes.md'), 'w').write('new\\n')\n"
        "print(json.dumps({'status': 'ok'}))\n"
    )
    (paths.agents / "writer.md").write_text(command_agent_md("writer", ["{{python}}", "bin/writer.py"]))
    drop(paths, "w.yml", foreach_workflow("w", ["a"], agent="writer"))
    d = DaemonProcess(paths, "--until-idle").start()
    try:
        assert d.wait(60) == 0, d.tail()
    finally:
        d.kill()
    assert (paths.root / "notes.md").read_text() == "new\n"


_SNOOP = """
import json, os, sys
json.load(sys.stdin)
daemon, creds = int(sys.argv[1]), sys.argv[2]
seen = []
for pid in (daemon, os.getppid()):
    try:
        seen.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
    except OSError as exc:
        seen.append(f"denied: {exc.strerror}")
try:
    seen.append(open(os.path.join(creds, "telegram-token")).read())
except OSError as exc:
    seen.append(f"denied: {exc.strerror}")
print(json.dumps({"status": "ok", "seen": seen, "env": dict(os.environ)}))
"""


def test_an_agent_finds_no_secret_of_the_daemon(tmp_path: Path) -> None:
    """The daemon holds secrets (notify URLs in its environment, a credentials directory); an agent
    reads `/proc/<daemon>/environ`, its parent's, the credentials file, and its own environment: no secret."""
    from tests.e2e.helpers import command_agent_md

    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "telegram-token").write_text("999:canary-token-secret\n")
    env = {"AMBIENT_NOTIFY_URLS": "json://127.0.0.1:9/canary-url-secret", "CREDENTIALS_DIRECTORY": str(creds)}
    paths = make_brain(tmp_path / "brain", example_agents=False)
    (paths.root / "bin").mkdir(exist_ok=True)
    (paths.root / "bin" / "snoop.py").write_text(_SNOOP)
    d = DaemonProcess(paths, env=env).start()
    try:
        d.wait_ready()
        argv = ["{{python}}", "bin/snoop.py", str(d.pid), str(creds)]
        (paths.agents / "snoop.md").write_text(command_agent_md("snoop", argv, confine=True))
        drop(paths, "snoop.yml", foreach_workflow("snoop", ["a"], agent="snoop"))
        wait_for(lambda: finished_run(paths, "snoop") is not None, 60, "the snoop's run")
    finally:
        d.stop()
        d.kill()
    [done] = [e for e in events(paths, "snoop", "finished") if e.get("item") == "a"]
    found = repr(done["output"])
    assert "canary-url-secret" not in found and "canary-token-secret" not in found, found
    assert str(creds) not in found, found


def test_a_packet_dropped_in_the_inbox_is_not_believed_for_its_from(tmp_path: Path) -> None:
    """A packet written straight into `.ambient/inbox/` (by an unconfined process of the user, or by
    hand) names `from: human` and asks to start a draft workflow: it carries no seal of whoever routes packets,
    so the daemon believes nobody and starts nothing; the same request sent with `ambient send` is obeyed."""
    import json as jsonlib

    from tests.e2e.helpers import ambient_cli

    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub_agent_md("stub")})
    (paths.workflows / "guarded.yml").write_text(foreach_workflow("guarded", ["x"], status="draft"))
    forged = {
        "id": "pkt_0123456789abcdef0123",
        "from": "human",
        "to": "ambient",
        "signal": "ORCHESTRATE",
        "ts": "2026-12-02T00:00:00+00:00",
        "payload": {"context": {"workflow": "guarded"}},
    }
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        paths.inbox.mkdir(parents=True, exist_ok=True)
        (paths.inbox / f"{forged['id']}.json").write_text(jsonlib.dumps(forged))
        d.wait_logged("inbox_packet_unsealed", timeout=20, claimed="human")
        assert finished_run(paths, "guarded") is None and not events(paths, "guarded")
        packet = "from: human\nto: ambient\nsignal: ORCHESTRATE\npayload: {context: {workflow: guarded}}\n"
        assert ambient_cli(paths.root, "send", "-", input_text=packet).returncode == 0
        wait_for(lambda: finished_run(paths, "guarded") is not None, 30, "the person's request to run")
    finally:
        d.stop()
        d.kill()


def test_an_agent_runs_as_its_own_unix_user_when_the_daemon_may(reachable: Path) -> None:
    """`ambient.runner.user: nobody` runs the agent as that user (ambient runs as root here, as a
    system unit may); a user that does not exist is a clear error of that agent, not a crash."""
    import os

    import pytest

    from tests.e2e.helpers import command_agent_md

    if os.geteuid() != 0:
        pytest.skip("only root can start a process as another user (CI runs as root)")
    says_uid = ["/bin/sh", "-c", 'cat >/dev/null; printf \'{"status": "ok", "uid": %s}\' "$(id -u)"']
    paths = make_brain(reachable / "brain", example_agents=False)
    for name, user in (("other", "nobody"), ("ghost", "no-such-user-here")):
        text = command_agent_md(name, says_uid, confine=True, user=user)
        (paths.agents / f"{name}.md").write_text(text)
        drop(paths, f"{name}.yml", foreach_workflow(name, ["a"], agent=name, files=None))
    d = DaemonProcess(paths, "--until-idle").start()
    try:
        assert d.wait(60) == 0, d.tail()
    finally:
        d.kill()
    [other] = [e for e in events(paths, "other", "finished") if e.get("item") == "a"]
    assert other["result"] == "success" and other["output"]["uid"] == 65534, other
    [ghost] = [e for e in events(paths, "ghost", "finished") if e.get("item") == "a"]
    assert ghost["result"] == "error" and "no Unix user 'no-such-user-here'" in ghost["error"], ghost


_ANSWERER = """
import json, os, subprocess, sys
json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k != "AMBIENT_CHANNEL_TOKEN"}
ids = sys.argv[1:]
tries = [subprocess.run([sys.executable, "-m", "ambient", "decide", i, "skip"], capture_output=True, text=True,
                        env=env) for i in ids]
print(json.dumps({"status": "ok", "rcs": [t.returncode for t in tries], "said": [t.stderr[-300:] for t in tries]}))
"""


def test_an_agent_cannot_answer_an_escalation_in_the_persons_name(tmp_path: Path) -> None:
    """`ambient decide` run from inside an agent answered escalations "by human via cli". An item
    fails and waits on the person; a confined agent then runs `ambient decide <id> skip` without its token: the
    answer is refused (it cannot reach ambient's state), and the escalation still waits on the person."""
    import json

    from tests.e2e.helpers import ambient_cli, command_agent_md

    paths = make_brain(tmp_path / "brain", example_agents=False)
    (paths.agents / "stub.md").write_text(stub_agent_md("stub", ["--mode", "fail"]))
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "failing.yml", foreach_workflow("failing", ["x"]))
        pending = wait_for(
            lambda: (r := ambient_cli(paths.root, "escalations", "--json")).returncode == 0 and json.loads(r.stdout),
            30,
            "the failed item's escalation",
        )
        ids = [e["id"] for e in pending]
        (paths.root / "bin").mkdir(exist_ok=True)
        (paths.root / "bin" / "answerer.py").write_text(_ANSWERER)
        argv = ["{{python}}", "bin/answerer.py", *ids]
        (paths.agents / "answerer.md").write_text(command_agent_md("answerer", argv, confine=True))
        drop(paths, "answer.yml", foreach_workflow("answer", ["a"], agent="answerer", files=None))
        wait_for(lambda: finished_run(paths, "answer") is not None, 60, "the answerer's run")
        still = json.loads(ambient_cli(paths.root, "escalations", "--json").stdout)
    finally:
        d.stop()
        d.kill()
    [done] = [e for e in events(paths, "answer", "finished") if e.get("item") == "a"]
    assert all(rc != 0 for rc in done["output"]["rcs"]), done["output"]
    assert [e["id"] for e in still] == ids, "an agent answered an escalation"
    assert finished_run(paths, "failing") is None


_TOP = """
import json, os, sys
from pathlib import Path
json.load(sys.stdin)
brain = Path(os.environ["AMBIENT_BRAIN"])
tried = {}

def attempt(name, act):
    try:
        act()
        tried[name] = "allowed"
    except OSError as exc:
        tried[name] = f"denied: {exc.strerror}"

attempt("write_inbox", lambda: (brain / ".ambient" / "inbox" / "forged.json").write_text("{}"))
attempt("write_notes", lambda: (brain / "notes.md").write_text("overwritten"))
print(json.dumps({"status": "ok", "tried": tried}))
"""


def test_an_agent_whose_scope_is_a_new_file_at_the_top_of_the_brain_is_not_given_the_whole_brain(
    tmp_path: Path,
) -> None:
    """A scope file not there yet is granted through its folder; at the top of the brain that folder is the brain
    itself, ambient's state included: the agent is given none of it (it cannot make that file either)."""
    from tests.e2e.helpers import command_agent_md

    paths = make_brain(tmp_path / "brain", example_agents=False, config="concurrency: 2\n")
    (paths.root / "notes.md").write_text("the person's notes\n")
    (paths.root / "bin").mkdir(exist_ok=True)
    (paths.root / "bin" / "top.py").write_text(_TOP)
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        (paths.agents / "top.md").write_text(command_agent_md("top", ["{{python}}", "bin/top.py"], confine=True))
        drop(paths, "top.yml", foreach_workflow("top", ["a"], agent="top", files="top-{{item}}.md"))
        wait_for(lambda: finished_run(paths, "top") is not None, 60, "the run")
    finally:
        d.stop()
        d.kill()
    [done] = [e for e in events(paths, "top", "finished") if e.get("item") == "a"]
    tried = done["output"]["tried"]
    assert tried["write_inbox"].startswith("denied") and tried["write_notes"].startswith("denied"), tried
    assert not (paths.inbox / "forged.json").exists()
    assert (paths.root / "notes.md").read_text() == "the person's notes\n"
