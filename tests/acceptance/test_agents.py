"""docs/agents-and-runners.md, "Writing an agent": runners, argv, the agent's environment and process, its input
and its output."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import PROJECT_GATE, Brain, agent_md, for_each, wait

# ---------------------------------------------------------------- helpers


RETRY_ON_ERROR = "retry: {attempts: 3, backoff: 0.1s, on: [error]}\n"


def agent_without_runner(name: str) -> str:
    """An agent file with its IPC gate and no `ambient.runner` (its runner comes from profil/ambient.yml)."""
    text = agent_md(name, ["unused"])
    head, _, _ = text.partition("ambient:\n")
    return head + f"---\n# Agent: {name}\n\nAn agent whose runner is configured elsewhere.\n"


def agent_with_runner(name: str, runner: dict[str, Any]) -> str:
    """An agent file whose `ambient.runner` is exactly ``runner``."""
    head, _, _ = agent_md(name, ["unused"]).partition("ambient:\n")
    lines = ["ambient:", "  runner:"] + [f"    {k}: {json.dumps(v)}" for k, v in runner.items()]
    return head + "\n".join(lines) + f"\n---\n# Agent: {name}\n"


def answers(brain: Brain, agent: str) -> dict[str, dict[str, Any]]:
    """The packets the agent sent back, by item (`ambient thread AGENT --json`, correlation `run/item/attempt`)."""
    view = brain.ok("thread", agent, "--json", "--limit", "0").json()
    out: dict[str, dict[str, Any]] = {}
    for turn in view["turns"]:
        if turn["role"] == "agent" and turn.get("requester") == "ambient":
            out[turn["correlation_id"].split("/")[1]] = turn
    return out


def escalation_by_item(brain: Brain) -> dict[str, dict[str, Any]]:
    return {e["item"]: e for e in brain.escalations()}


def item_statuses(brain: Brain, workflow: str) -> dict[str, str]:
    for run in brain.status()["runs"]:
        if run["workflow"] == workflow:
            return {i["name"]: i["status"] for i in run["items"]}
    return {}


def gone(pid: int) -> bool:
    """The process no longer runs (reaped, or a zombie waiting for its new parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def children_of(pid: int) -> list[str]:
    """Command lines of the direct children of ``pid``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            if ppid == pid:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue
    return out


def spawner_pids(daemon_pid: int) -> list[int]:
    """Pids of the daemon's spawner helper processes."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1]) == daemon_pid
                and b"spawner_helper.py" in (proc / "cmdline").read_bytes()
            ):
                out.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


# A probe that writes what it was given (argv, environment as the kernel gave it, open fds, process group, stdin)
# to probe/<AMBIENT_ITEM>.json in the brain.
PROBE = """
    import json, os, sys
    raw = sys.stdin.read()
    env = dict(kv.split("=", 1) for kv in open("/proc/self/environ").read().split("\\0") if kv)
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))
    out = {"argv": sys.argv[1:], "env": env, "fds": fds, "pid": os.getpid(), "pgid": os.getpgid(0),
           "sid": os.getsid(0), "stdin": raw}
    path = os.path.join(os.environ["AMBIENT_BRAIN"], "probe", os.environ["AMBIENT_ITEM"] + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
"""


def probed(brain: Brain, item: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(brain.read(f"probe/{item}.json"))
    return data


# ---------------------------------------------------------------- the command runner: argv


def test_argv_is_never_a_shell_and_each_value_is_exactly_one_argument(brain: Brain) -> None:
    """command: argv, never a shell; each `{{name}}` value is exactly one argument (`-` values after a `--`)."""
    brain.write("bin/probe.py", textwrap.dedent(PROBE))
    brain.write(
        "agents/probe.md", agent_md("probe", ["{{python}}", "bin/probe.py", "--", "{{item}}", "n={{index}}/{{total}}"])
    )
    items = ["two words", "$(touch pwned); *", "-rf", "a'b\"c"]
    brain.workflow("argv", for_each("argv", "probe", items))
    brain.until_idle()
    [record] = brain.finished("argv")
    assert record["outcome"] == "success", record
    for index, item in enumerate(items, start=1):
        assert probed(brain, item)["argv"] == ["--", item, f"n={index}/{len(items)}"]
    assert not list(brain.root.rglob("pwned"))  # no shell ever saw `$(touch pwned)`


def test_a_value_starting_with_a_dash_is_refused_unless_after_a_literal_double_dash(brain: Brain) -> None:
    """command: a `{{name}}` value starting with `-` must come after a literal `--` (else the agent is not started)."""
    brain.write("bin/probe.py", textwrap.dedent(PROBE))
    brain.write("agents/probe.md", agent_md("probe", ["{{python}}", "bin/probe.py", "{{item}}"]))
    brain.workflow("dash", for_each("dash", "probe", ["plain", "--delete-everything"]))
    brain.until_idle()
    assert probed(brain, "plain")["argv"] == ["plain"]
    assert not brain.path("probe/--delete-everything.json").exists()
    esc = escalation_by_item(brain)["--delete-everything"]
    assert esc["kind"] == "error", esc
    assert "starts with '-'" in esc["question"], esc


def test_argv0_is_looked_up_in_the_agents_own_path(brain: Brain) -> None:
    """command: `argv[0]` is looked up in the agent's own PATH (its runner's `env:`)."""
    brain.write(
        "tools/deployer", '#!/bin/sh\ncat > /dev/null\necho \'{"status": "ok", "via": "own PATH"}\'\n', mode=0o755
    )
    brain.write(
        "agents/pathy.md",
        agent_md("pathy", ["deployer"], runner={"env": {"PATH": f"{brain.root / 'tools'}:/usr/bin:/bin"}}),
    )
    brain.workflow("lookup", for_each("lookup", "pathy", ["x"]))
    brain.until_idle()
    [record] = brain.finished("lookup")
    assert record["outcome"] == "success", record
    assert answers(brain, "pathy")["x"]["payload"]["result"] == {"status": "ok", "via": "own PATH"}


# ---------------------------------------------------------------- the agent's environment and process


def test_the_agent_gets_an_explicit_minimal_environment_and_no_secret(brain: Brain, tmp_path: Path) -> None:
    """command: the environment is exactly PATH HOME LANG LC_ALL TZ, the runner's `env:` and the AMBIENT_* variables
    (+ AMBIENT_PACKET, AMBIENT_HANDOFF); no secret, no NOTIFY_SOCKET."""
    creds = tmp_path / "creds"
    creds.mkdir()
    brain.write("bin/probe.py", textwrap.dedent(PROBE))
    brain.write(
        "agents/probe.md",
        agent_md("probe", ["{{python}}", "bin/probe.py"], runner={"env": {"DEPLOY_TARGET": "staging"}}),
    )
    brain.workflow("envw", for_each("envw", "probe", ["one"]))
    daemon_env = {
        "CANARY_SECRET": "s3cr3t-canary-value",
        "AWS_SECRET_ACCESS_KEY": "aws-canary",
        "AMBIENT_NOTIFY_URLS": "json://127.0.0.1:9/hook?token=notify-canary",
        "NOTIFY_SOCKET": str(tmp_path / "no-such-notify-socket"),
        "CREDENTIALS_DIRECTORY": str(creds),
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path),
    }
    with brain.daemon(env=daemon_env):
        [record] = brain.wait_finished("envw")
    env = probed(brain, "one")["env"]
    expected = {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TZ",
        "DEPLOY_TARGET",
        "AMBIENT_AGENT",
        "AMBIENT_RUN_ID",
        "AMBIENT_ITEM",
        "AMBIENT_ATTEMPT",
        "AMBIENT_KEY",
        "AMBIENT_BRAIN",
        "AMBIENT_CHANNEL_TOKEN",
    }
    assert set(env) - {"AMBIENT_PACKET", "AMBIENT_HANDOFF"} == expected, sorted(env)
    assert env["DEPLOY_TARGET"] == "staging" and env["TZ"] == "UTC" and env["LC_ALL"] == "C.UTF-8"
    assert env["HOME"] == str(tmp_path)
    assert env["AMBIENT_AGENT"] == "probe" and env["AMBIENT_ITEM"] == "one" and env["AMBIENT_ATTEMPT"] == "1"
    assert env["AMBIENT_RUN_ID"] == record["run_id"]
    assert env["AMBIENT_KEY"] == f"{record['run_id']}/one/1"
    assert Path(env["AMBIENT_BRAIN"]).resolve() == brain.root.resolve()
    assert env["AMBIENT_CHANNEL_TOKEN"]
    leaked = [k for k, v in env.items() if any(s in v for s in ("s3cr3t-canary", "aws-canary", "notify-canary"))]
    assert leaked == [], leaked
    assert len(env.get("AMBIENT_HANDOFF", "")) <= 4096


def test_the_spawn_packet_comes_on_stdin_and_in_ambient_packet_when_small(brain: Brain) -> None:
    """Input: the SPAWN packet as JSON on stdin (scope.files, payload.context); also in AMBIENT_PACKET up to 32 KiB."""
    brain.write("bin/probe.py", textwrap.dedent(PROBE))
    brain.write("agents/probe.md", agent_md("probe", ["{{python}}", "bin/probe.py"]))
    big = "x" * 40_000
    brain.workflow(
        "packet",
        for_each(
            "packet",
            "probe",
            ["small", "large"],
            context='{instance: "{{item}}", position: "{{index}}/{{total}}", blob: short}',
        ),
    )
    brain.workflow("bigpacket", for_each("bigpacket", "probe", ["huge"], context=f"{{blob: {big}}}"))
    brain.until_idle()
    small = probed(brain, "small")
    packet = json.loads(small["stdin"])
    assert packet["signal"] == "SPAWN" and packet["to"] == "probe", packet
    assert packet["scope"]["files"] == ["work/packet/1.txt"]
    assert {k: packet["payload"]["context"][k] for k in ("instance", "position", "blob")} == {
        "instance": "small",
        "position": "1/2",
        "blob": "short",
    }
    assert json.loads(small["env"]["AMBIENT_PACKET"]) == packet
    assert json.loads(probed(brain, "large")["stdin"])["scope"]["files"] == ["work/packet/2.txt"]
    huge = probed(brain, "huge")
    assert json.loads(huge["stdin"])["payload"]["context"]["blob"] == big  # stdin always has all of it
    assert len(huge["env"].get("AMBIENT_PACKET", "").encode()) <= 32 * 1024


# A bash agent that becomes grep (exec keeps ignored signals and the blocked mask) to show what it was started with.
SIGNALS_AGENT = """
    cat > /dev/null
    exec grep -E '^(SigIgn|SigBlk):' /proc/self/status > "$AMBIENT_BRAIN/signals.txt"
"""
STANDARD_SIGNALS = (1 << 31) - 1  # bits of signals 1-31 in /proc's masks


def signal_masks(brain: Brain) -> dict[str, int]:
    """The ignored and blocked signal masks the agent was started with."""
    return {k: int(v.strip(), 16) for k, v in (line.split(":") for line in brain.read("signals.txt").splitlines())}


def test_the_agent_runs_in_its_own_process_group_with_only_fds_0_to_2_and_default_signals(brain: Brain) -> None:
    """command: own process group (a new session), only fds 0-2, default dispositions (none of signals 1-31 ignored,
    none blocked)."""
    brain.write("bin/probe.py", textwrap.dedent(PROBE))
    brain.write("agents/probe.md", agent_md("probe", ["{{python}}", "bin/probe.py"]))
    brain.shell_agent("sigs", SIGNALS_AGENT)
    brain.workflow("proc", for_each("proc", "probe", ["p"]))
    brain.workflow("sig", for_each("sig", "sigs", ["s"]))
    with brain.daemon() as daemon:
        brain.wait_finished("proc")
        brain.wait_finished("sig")
        daemon_pgid = os.getpgid(daemon.pid)
    info = probed(brain, "p")
    assert info["pgid"] == info["pid"] == info["sid"]
    assert info["pgid"] != daemon_pgid
    assert info["fds"] == [0, 1, 2]
    masks = signal_masks(brain)
    assert masks["SigBlk"] == 0, masks  # nothing blocked
    assert masks["SigIgn"] & STANDARD_SIGNALS == 0, masks  # none of signals 1-31 ignored (SIGPIPE, SIGTERM...)


# glibc's two internal signals (SIGCANCEL 32, SIGSETXID 33): its posix_spawn leaves them ignored in the child, and
# no program linked to glibc can use them (docs/agents-and-runners.md says so).
GLIBC_INTERNAL = (1 << 31) | (1 << 32)


def test_the_agent_starts_with_every_signal_at_its_default_disposition(brain: Brain) -> None:
    """command: an agent starts as with `Popen(...)`: default signal dispositions (but glibc's internal 32 and 33)."""
    brain.shell_agent("sigs", SIGNALS_AGENT)
    brain.workflow("sig", for_each("sig", "sigs", ["s"]))
    brain.until_idle()
    masks = signal_masks(brain)
    assert masks["SigBlk"] == 0 and masks["SigIgn"] & ~GLIBC_INTERNAL == 0, masks


def test_command_agents_are_started_by_the_spawner_helper(brain: Brain) -> None:
    """The spawner (`python -I -S …/spawner_helper.py`) starts with the daemon when the brain has command agents."""
    brain.python_agent("worker", "import sys; sys.stdin.read()\n")
    with brain.daemon() as daemon:
        helpers = wait(lambda: [c for c in children_of(daemon.pid) if "spawner_helper.py" in c], "the spawner")
        assert len(helpers) == 1 and " -I -S " in helpers[0], helpers
        brain.workflow("spawned", for_each("spawned", "worker", ["a"]))
        [record] = brain.wait_finished("spawned")
        assert record["outcome"] == "success", record
        assert [c for c in children_of(daemon.pid) if "spawner_helper.py" in c] == helpers


def test_no_spawner_without_command_agents(brain: Brain) -> None:
    """The spawner is started only when the brain has command agents."""
    brain.write("agents/helper.md", agent_with_runner("helper", {"kind": "assisted", "poll_s": 0.2}))
    with brain.daemon() as daemon:
        assert not [c for c in children_of(daemon.pid) if "spawner_helper.py" in c], children_of(daemon.pid)


def test_a_killed_spawner_kills_its_agents_and_their_attempts_are_retried(brain: Brain) -> None:
    """If the spawner is killed, its agents are killed, their attempts end as errors (retried by policy), and the next
    agent brings a new spawner."""
    brain.python_agent(
        "holder",
        """
        import json, os, pathlib, sys, time
        sys.stdin.read()
        brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
        (brain / ("pid-" + os.environ["AMBIENT_ATTEMPT"])).write_text(str(os.getpid()))
        while os.environ["AMBIENT_ATTEMPT"] == "1":
            time.sleep(0.05)
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow("held", for_each("held", "holder", ["one"], extra=RETRY_ON_ERROR))
    with brain.daemon() as daemon:
        wait(lambda: brain.path("pid-1").exists(), "the first attempt to start")
        first_agent = int(brain.read("pid-1"))
        [spawner] = spawner_pids(daemon.pid)
        os.kill(spawner, signal.SIGKILL)
        [record] = brain.wait_finished("held")
        daemon.wait_log("spawner_lost")
        assert wait(lambda: gone(first_agent), "the first agent to be killed", timeout=10)
        assert [c for c in children_of(daemon.pid) if "spawner_helper.py" in c], "no new spawner"
    assert record["outcome"] == "success", record
    attempts = [(s["attempt"], s["result"]) for s in record["steps"]]
    assert attempts == [(1, "error"), (2, "success")], attempts


def test_the_temp_dirs_a_killed_daemon_made_ahead_are_removed_by_the_next_one(brain: Brain) -> None:
    """A confined agent gets a fresh private temp dir, and the daemon keeps a few made ahead per agent name. A daemon
    killed -9 cannot remove those; the next daemon on the machine does, at its start, even with no agent to run."""
    name = f"tmpdirs-{uuid.uuid4().hex[:8]}"
    brain.python_agent(name, "import sys; sys.stdin.read()\n", runner={"confine": True})
    tmp = Path(tempfile.gettempdir())

    def left() -> set[str]:
        return {p.name for p in tmp.glob(f"ambient-{name}-*")}

    brain.workflow("once", for_each("once", name, ["a"]))
    with brain.daemon() as first:  # killed at the end of the block whatever happens in it
        brain.wait_finished("once")
        made = wait(lambda: left() if len(left()) >= 2 else None, "temp dirs made ahead for the agent")
        first.kill()
    assert left() >= made, (made, left())
    with brain.daemon():
        wait(lambda: not left(), "the killed daemon's temp dirs to be removed", timeout=30)


# ---------------------------------------------------------------- output: what the agent prints, how it exits

TABLE_AGENT = """
    import json, os, sys
    json.load(sys.stdin)
    item = os.environ["AMBIENT_ITEM"]
    answers = {
        "ok": {"status": "ok", "instance": "i-1"},
        "partial": {"status": "partial", "left": 2},
        "failed": {"status": "failed", "why": "health check 502"},
        "return": {"signal": "RETURN", "result": {"deployed": 3}},
        "escalate": {"signal": "ESCALATE", "options": ["blue", "green"], "question": "Blue or green slot?"},
        "error": {"signal": "ERROR", "context": {"error": "disk on fire"}},
        "blocked": {"signal": "BLOCKED_ON", "context": {"missing": "SSH key for deploy@vps-1"}},
    }
    if item == "exit-1":
        sys.exit(1)
    if item == "exit-2":
        sys.exit(2)
    if item == "exit-255":
        sys.exit(255)
    if item == "signal":
        os.kill(os.getpid(), 9)
    if item == "two-objects":
        print('{"status": "ok"}')
        print('{"status": "ok"}')
    elif item == "not-json":
        print("deployed, all good")
    elif item in answers:
        print(json.dumps(answers[item]))
"""
TABLE_ITEMS = [
    "nothing",
    "ok",
    "partial",
    "failed",
    "return",
    "escalate",
    "error",
    "blocked",
    "exit-1",
    "exit-2",
    "exit-255",
    "signal",
    "two-objects",
    "not-json",
]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Brain:
    """One run of an agent answering each row of the documented output table (and each exit), until idle."""
    brain = Brain.init(tmp_path_factory.mktemp("table") / "brain", "--no-example")
    brain.python_agent("table", TABLE_AGENT)
    brain.workflow("table", for_each("table", "table", TABLE_ITEMS))
    brain.until_idle()
    return brain


def test_printing_nothing_or_a_result_is_a_return(table: Brain) -> None:
    """Output: nothing → success, empty result; `{"status": ...}` and `{"signal": "RETURN", "result": ...}` → RETURN
    with this result."""
    statuses = item_statuses(table, "table")
    sent = answers(table, "table")
    for item in ("nothing", "ok", "partial", "return"):
        assert statuses[item] == "done", (item, statuses)
        assert sent[item]["signal"] == "RETURN", sent[item]
    assert sent["nothing"]["payload"]["result"] == {}
    assert sent["ok"]["payload"]["result"] == {"status": "ok", "instance": "i-1"}
    assert sent["partial"]["payload"]["result"] == {"status": "partial", "left": 2}
    assert sent["return"]["payload"]["result"] == {"deployed": 3}
    assert sent["failed"]["signal"] == "RETURN"
    assert sent["failed"]["payload"]["result"] == {"status": "failed", "why": "health check 502"}


def test_status_failed_and_exit_1_are_business_failures(table: Brain) -> None:
    """Output: `{"status": "failed"}` and exit 1 are a business failure (`fail`): the item asks retry | skip | abort."""
    escs = escalation_by_item(table)
    for item in ("failed", "exit-1"):
        assert escs[item]["kind"] == "fail", escs[item]
        assert [o["key"] for o in escs[item]["options"]] == ["retry", "skip", "abort"]
    assert "code 1" in escs["exit-1"]["question"]


def test_exit_2_to_255_a_signal_or_invalid_output_is_an_error(table: Brain) -> None:
    """Exit 2–255, a signal, or invalid output (not one JSON object) is an `error`."""
    escs = escalation_by_item(table)
    for item in ("exit-2", "exit-255", "signal", "two-objects", "not-json"):
        assert escs[item]["kind"] == "error", escs[item]
    assert "code 2" in escs["exit-2"]["question"] and "code 255" in escs["exit-255"]["question"]
    assert "SIGKILL" in escs["signal"]["question"]
    assert "JSON" in escs["two-objects"]["question"] and "JSON" in escs["not-json"]["question"]


def test_invalid_output_is_quoted_as_text_with_control_characters_escaped(brain: Brain) -> None:
    """An agent that prints prose instead of its JSON answer: the error quotes the start of its stdout as text in
    double quotes, control characters escaped (an ESC cannot reach the person's terminal), never as Python bytes."""
    brain.python_agent(
        "chatty",
        """
        import json, sys
        json.load(sys.stdin)
        sys.stdout.write('Sure! Here is "the" answer\\x1b[2J\\n{"status": "ok"}\\n')
    """,
    )
    brain.workflow("chat", for_each("chat", "chatty", ["a"]))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error", esc
    assert "agent stdout is not one JSON object" in esc["question"], esc
    assert '(stdout starts "Sure! Here is \\"the\\" answer\\u001b[2J\\n{\\"status\\": ' in esc["question"], esc
    assert "b'" not in esc["question"] and "\x1b" not in esc["question"], esc


def test_an_escalate_answer_is_a_decision_for_the_person(table: Brain) -> None:
    """Output: `{"signal": "ESCALATE", "options": [...], "question": ...}` → a decision for the person."""
    esc = escalation_by_item(table)["escalate"]
    assert esc["question"] == "Blue or green slot?", esc
    assert [o["key"] for o in esc["options"]][:2] == ["blue", "green"]
    listing = table.ok("escalations").out
    assert "Blue or green slot?" in listing and "blue" in listing and "green" in listing


def test_an_error_answer_is_an_error_with_its_message(table: Brain) -> None:
    """Output: `{"signal": "ERROR", "context": {"error": ...}}` → an error (the person sees its message)."""
    esc = escalation_by_item(table)["error"]
    assert esc["kind"] == "error" and "disk on fire" in esc["question"], esc
    assert answers(table, "table")["error"]["signal"] == "ERROR"


def test_a_blocked_on_answer_is_technically_blocked(table: Brain) -> None:
    """Output: `{"signal": "BLOCKED_ON", "context": {"missing": ...}}` → technically blocked (waits for you)."""
    esc = escalation_by_item(table)["blocked"]
    assert esc["kind"] == "blocked", esc
    sent = answers(table, "table")["blocked"]
    assert sent["signal"] == "BLOCKED_ON"
    assert sent["payload"]["context"]["missing"] == "SSH key for deploy@vps-1"


def test_every_item_of_the_table_is_accounted_for(table: Brain) -> None:
    """Every answer of the table ends its item: done for the successes, waiting on you for the rest."""
    statuses = item_statuses(table, "table")
    assert set(statuses) == set(TABLE_ITEMS)
    assert {i for i, s in statuses.items() if s == "done"} == {"nothing", "ok", "partial", "return"}
    assert {i for i, s in statuses.items() if s == "escalated"} == set(TABLE_ITEMS) - {
        "nothing",
        "ok",
        "partial",
        "return",
    }


def test_a_crash_of_an_agent_that_declares_no_error_signal_keeps_its_cause(brain: Brain) -> None:
    """docs/agents-and-runners.md's example gate lists `signals: [RETURN, ESCALATE]`. Such an agent that crashes
    (exit 2, a line on stderr) cannot send ERROR, and the router refuses the one its exit becomes: what reaches the
    person, `ambient status` and `ambient runs` still say why it failed, not only that a packet was refused."""
    gate = {**PROJECT_GATE, "signals": ["RETURN", "ESCALATE"]}
    code = "import sys\nsys.stdin.read()\nsys.stderr.write('segfault in libfoo\\n')\nsys.exit(2)\n"
    brain.python_agent("crash", code, gate=gate)
    brain.workflow("crash", for_each("crash", "crash", ["c1"]))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error", esc
    assert "segfault in libfoo" in esc["question"] and "code 2" in esc["question"], esc
    assert "segfault in libfoo" in brain.ok("status").out
    brain.ok("decide", esc["id"], "skip")
    brain.until_idle()
    [record] = brain.finished("crash")
    assert "segfault in libfoo" in json.dumps(record["steps"]), record


def test_an_agents_error_signal_is_unrecoverable_and_not_retried(brain: Brain) -> None:
    """Output: `{"signal": "ERROR"}` is an unrecoverable error: the agent is not run again by the retry policy."""
    brain.python_agent(
        "fatal",
        """
        import json, os, pathlib, sys
        sys.stdin.read()
        brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
        (brain / ("attempt-" + os.environ["AMBIENT_ATTEMPT"])).write_text("ran")
        print(json.dumps({"signal": "ERROR", "context": {"error": "the database is gone"}}))
    """,
    )
    brain.workflow("fatal", for_each("fatal", "fatal", ["one"], extra=RETRY_ON_ERROR))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error"
    assert sorted(p.name for p in brain.root.glob("attempt-*")) == ["attempt-1"]


def test_identity_comes_from_the_channel_never_from_a_from_field(brain: Brain) -> None:
    """An agent's answer claiming another sender (`from`) is not taken: identity comes from the channel."""
    brain.python_agent(
        "spoof",
        """
        import json, sys
        sys.stdin.read()
        print(json.dumps({"signal": "RETURN", "from": "human", "result": {"status": "ok"}}))
    """,
    )
    brain.workflow("spoof", for_each("spoof", "spoof", ["one"]))
    brain.until_idle()
    assert item_statuses(brain, "spoof") == {"one": "escalated"}
    [esc] = brain.escalations()
    assert esc["kind"] == "error" and "human" in esc["question"], esc


def test_an_agents_answer_goes_through_the_router_and_is_checked(brain: Brain) -> None:
    """Every answer goes back through the router as a packet from the agent: a signal its gate lacks is denied."""
    brain.python_agent(
        "narrow",
        """
        import json, sys
        sys.stdin.read()
        print(json.dumps({"signal": "ESCALATE", "options": ["a", "b"], "question": "A or B?"}))
    """,
        gate={**PROJECT_GATE, "signals": ["RETURN"]},
    )
    brain.workflow("narrow", for_each("narrow", "narrow", ["one"]))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error" and "ESCALATE" in esc["question"], esc  # not the agent's question
    audit = [json.loads(line) for line in brain.read(".ambient/audit.jsonl").splitlines() if line.strip()]
    denied = [a for a in audit if a.get("status") == "denied"]
    assert [(a["from"], a["signal"]) for a in denied] == [("narrow", "ESCALATE")], denied


# ---------------------------------------------------------------- kills: timeout, output cap


def test_a_timeout_kills_the_agents_whole_process_group(brain: Brain) -> None:
    """command: on timeout the whole group gets SIGTERM, then SIGKILL after `kill_grace_s`; the attempt is an error."""
    brain.shell_agent(
        "stuck",
        """
        cat > /dev/null
        trap '' TERM
        sleep 300 &
        echo $! > "$AMBIENT_BRAIN/child.pid"
        echo $$ > "$AMBIENT_BRAIN/leader.pid"
        wait
    """,
        timeout_s=1,
        runner={"kill_grace_s": 0.3},
    )
    brain.workflow("stuck", for_each("stuck", "stuck", ["one"]))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error" and "timed out" in esc["question"], esc
    for name in ("leader.pid", "child.pid"):
        pid = int(brain.read(name))
        assert wait(lambda pid=pid: gone(pid), f"{name} {pid} to be killed", timeout=10)


def test_a_shutdown_gives_the_group_sigterm_then_sigkill_after_kill_grace_s(brain: Brain) -> None:
    """command: on shutdown the whole group gets SIGTERM, then SIGKILL after `kill_grace_s`."""
    brain.shell_agent(
        "stubborn",
        """
        cat > /dev/null
        trap 'date +%s.%N >> "$AMBIENT_BRAIN/sigterm"' TERM
        sleep 300 &
        echo $! > "$AMBIENT_BRAIN/child.pid"
        echo $$ > "$AMBIENT_BRAIN/leader.pid"
        while true; do wait; done
    """,
        runner={"kill_grace_s": 1.5},
    )
    brain.workflow("stubborn", for_each("stubborn", "stubborn", ["one"]))
    with brain.daemon() as daemon:
        wait(lambda: brain.path("child.pid").exists(), "the agent and its child to start")
        leader, child = int(brain.read("leader.pid")), int(brain.read("child.pid"))
        daemon.signal(signal.SIGTERM)
        wait(lambda: gone(leader), "the agent to be killed")
        killed_at = time.time()
        assert daemon.stop() == 0
    termed_at = float(brain.read("sigterm").split()[0])
    assert killed_at - termed_at >= 1.4, killed_at - termed_at  # SIGKILL only after kill_grace_s
    assert gone(child)


def test_output_over_max_output_bytes_kills_the_agent(brain: Brain) -> None:
    """command: output over `max_output_bytes` kills the agent's group; the attempt is an error."""
    brain.shell_agent(
        "chatty",
        """
        cat > /dev/null
        echo $$ > "$AMBIENT_BRAIN/chatty.pid"
        yes '{"status": "ok"}'
    """,
        timeout_s=120,
        runner={"max_output_bytes": 4096, "kill_grace_s": 0.3},
    )
    brain.workflow("chatty", for_each("chatty", "chatty", ["one"]))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error" and "4096 bytes" in esc["question"], esc
    assert gone(int(brain.read("chatty.pid")))


def test_the_default_output_cap_is_one_mib(brain: Brain) -> None:
    """command: `max_output_bytes` is 1 MiB by default."""
    brain.python_agent(
        "flood",
        """
        import sys, time
        sys.stdin.read()
        sys.stdout.write("x" * (1024 * 1024 + 1))
        sys.stdout.flush()
        time.sleep(300)
    """,
        timeout_s=120,
        runner={"kill_grace_s": 0.3},
    )
    brain.workflow("flood", for_each("flood", "flood", ["one"]))
    brain.until_idle()
    [esc] = brain.escalations()
    assert esc["kind"] == "error" and "1048576 bytes" in esc["question"], esc


# ---------------------------------------------------------------- other runners


def test_runners_in_the_config_run_an_agent_without_a_runner(brain: Brain) -> None:
    """`runners:` in profil/ambient.yml gives a runner to an agent whose frontmatter has none (its own one wins)."""
    brain.write("agents/plain.md", agent_without_runner("plain"))
    brain.write("bin/plain.sh", 'cat > /dev/null\necho \'{"status": "ok", "via": "runners"}\'\n')
    brain.shell_agent("own", 'cat > /dev/null\necho \'{"status": "ok", "via": "frontmatter"}\'\n')
    brain.config("""
        runners:
          plain: {kind: command, argv: ["bash", "bin/plain.sh"], timeout_s: 30}
          own: {kind: command, argv: ["bash", "bin/plain.sh"], timeout_s: 30}
    """)
    brain.workflow("plain", for_each("plain", "plain", ["one"]))
    brain.workflow("own", for_each("own", "own", ["one"]))
    brain.until_idle()
    for workflow in ("plain", "own"):
        [record] = brain.finished(workflow)
        assert record["outcome"] == "success", record
    assert answers(brain, "plain")["one"]["payload"]["result"] == {"status": "ok", "via": "runners"}
    assert answers(brain, "own")["one"]["payload"]["result"] == {"status": "ok", "via": "frontmatter"}


def test_the_assisted_runner_waits_for_its_claim_to_be_closed(brain: Brain) -> None:
    """assisted: ambient opens `claims/<step>-assisted.yml` with the brief and waits until `ambient claim close ID
    --status ok`."""
    brain.write("agents/helper.md", agent_with_runner("helper", {"kind": "assisted", "poll_s": 0.2}))
    brain.workflow(
        "handmade",
        """
        name: handmade
        chain:
          - {step: 1, type: brain-write, scope: docs/guide.md, agents: [helper], story_angle: "Write the guide"}
    """,
    )
    with brain.daemon():
        claim = wait(lambda: list(brain.path("claims").glob("*-assisted.yml")), "the assisted claim")[0]
        assert claim.name.endswith("-step-1-assisted.yml"), claim.name
        assert brain.path(f"claims/{claim.name.removesuffix('-assisted.yml')}.yml").exists()
        text = claim.read_text()
        assert "Write the guide" in text and "status: open" in text, text
        assert brain.finished("handmade") == []
        assert item_statuses(brain, "handmade") == {"1": "running"}
        res = brain.ok("claim", "close", claim.stem, "--status", "ok")
        assert claim.stem in res.out
        [record] = brain.wait_finished("handmade")
    assert record["outcome"] == "success", record


def test_the_callable_runner_runs_in_the_daemons_process(brain: Brain, tmp_path: Path) -> None:
    """callable: `func(req)` (sync or async) in the daemon's process."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "inproc.py").write_text(
        textwrap.dedent("""
        import asyncio, json, os, pathlib

        def sync_agent(req):
            pathlib.Path(req.brain, "sync.pid").write_text(str(os.getpid()))
            return {"status": "ok", "item": req.item}

        async def async_agent(req):
            await asyncio.sleep(0)
            pathlib.Path(req.brain, "async.pid").write_text(str(os.getpid()))
            return {"status": "ok", "item": req.item}
    """)
    )
    brain.write("agents/syncer.md", agent_with_runner("syncer", {"kind": "callable", "target": "inproc:sync_agent"}))
    brain.write("agents/asyncer.md", agent_with_runner("asyncer", {"kind": "callable", "target": "inproc:async_agent"}))
    brain.workflow("sync", for_each("sync", "syncer", ["s"]))
    brain.workflow("async", for_each("async", "asyncer", ["a"]))
    pythonpath = os.pathsep.join(p for p in (str(lib), os.environ.get("PYTHONPATH", "")) if p)
    with brain.daemon(env={"PYTHONPATH": pythonpath}) as daemon:
        for workflow in ("sync", "async"):
            [record] = brain.wait_finished(workflow)
            assert record["outcome"] == "success", record
        assert int(brain.read("sync.pid")) == daemon.pid
        assert int(brain.read("async.pid")) == daemon.pid


def test_typos_in_the_blocks_ambient_reads_are_named_at_their_line(brain: Brain) -> None:
    """`brian:` beside no `brain:` (no gate would be read) and `ambient: {runer: ...}` (no runner) are named with
    the key they look like, at their line; the rest of a frontmatter is the brain's own and never judged."""
    text = agent_md("typist", ["bash", "bin/typist.sh"]).replace("brain:\n", "brian:\n", 1)
    brain.write("agents/typist.md", text.replace("  runner:\n", "  runer:\n", 1))
    res = brain.cli("validate")
    assert res.rc == 1, res
    brian = text.splitlines().index("brian:") + 1
    runer = text.splitlines().index("  runner:") + 1
    assert f"agents/typist.md:{brian}: warning: unknown key 'brian'; did you mean 'brain'?" in res.out, res
    assert f"agents/typist.md:{runer}: ambient.runer: unknown key; did you mean 'runner'?" in res.out, res


def test_a_typo_of_ambient_or_signals_in_a_spawned_agent_is_an_error_that_names_the_key_and_its_line(
    brain: Brain,
) -> None:
    """`ambiant:` for `ambient:` (the agent gets no runner) and `signal:` for `signals:` under `brain.ipc` (it emits
    nothing): once a runnable workflow spawns the agent, `ambient validate` says so as an error at the misspelt key's
    line, and each item's escalation names that key and its line, not only "declare a runner" or "emits nothing".
    While only a draft spawns them, they stay warnings (an agent file may hold other tools' keys)."""
    ok = "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'status': 'ok'}))\n"
    brain.write("bin/ok.py", ok)
    norunner = agent_md("norunner", ["{{python}}", "bin/ok.py"]).replace("\nambient:\n", "\nambiant:\n", 1)
    mute = agent_md("mute", ["{{python}}", "bin/ok.py"]).replace("    signals: ", "    signal: ", 1)
    brain.write("agents/norunner.md", norunner)
    brain.write("agents/mute.md", mute)
    ambiant = norunner.splitlines().index("ambiant:") + 1
    signal_line = next(n for n, row in enumerate(mute.splitlines(), 1) if row.startswith("    signal: "))
    for agent in ("norunner", "mute"):
        brain.workflow(f"use-{agent}", "status: draft\n" + for_each(f"use-{agent}", agent, ["a", "b"]))
    drafts = brain.cli("validate")
    assert drafts.rc == 0, drafts
    assert "looks like" not in drafts.out, drafts

    for agent in ("norunner", "mute"):
        brain.workflow(f"use-{agent}", for_each(f"use-{agent}", agent, ["a", "b"]))
    res = brain.cli("validate")
    assert res.rc == 1, res
    said = {line.split(": ", 1)[0]: line for line in res.out.splitlines()}
    assert "'ambiant' looks like 'ambient'" in said[f"agents/norunner.md:{ambiant}"], res
    assert "'signal' looks like 'signals'" in said[f"agents/mute.md:{signal_line}"], res
    for line in (said[f"agents/norunner.md:{ambiant}"], said[f"agents/mute.md:{signal_line}"]):
        assert ": warning: " not in line, res
    assert "workflow use-norunner" in said[f"agents/norunner.md:{ambiant}"], res
    assert "workflow use-mute" in said[f"agents/mute.md:{signal_line}"], res

    brain.until_idle()
    escs = brain.escalations()
    assert len(escs) == 4, escs
    for esc in escs:
        if esc["agent"] == "norunner":
            assert (
                f"agent 'norunner' has no runner: agents/norunner.md:{ambiant}: 'ambiant' looks like 'ambient'"
                in (esc["question"])
            ), esc
        else:
            assert "mute emits nothing; RETURN is not one of them" in esc["question"], esc
            assert f"agents/mute.md:{signal_line}: 'signal' looks like 'signals'" in esc["question"], esc


def test_a_misspelt_runner_block_is_an_error_even_when_runners_default_would_run_the_agent(brain: Brain) -> None:
    """`ambiant:` in an agent a workflow spawns, with `runners.default` in profil/ambient.yml: the agent would run
    on the default runner, not on the one its file holds; `ambient validate` says so as an error at the key's line.
    `ambient: {runer: ...}`, an error already, is said once."""
    text = agent_md("meant", ["bash", "bin/meant.sh"]).replace("\nambient:\n", "\nambiant:\n", 1)
    brain.write("agents/meant.md", text)
    brain.write("agents/runer.md", agent_md("runer", ["bash", "bin/runer.sh"]).replace("  runner:\n", "  runer:\n", 1))
    brain.config("runners:\n  default: {kind: command, argv: [bash, bin/default.sh]}\n")
    brain.write("bin/default.sh", "cat > /dev/null\n", mode=0o755)
    brain.workflow("uses", for_each("uses", "meant", ["a"]))
    brain.workflow("uses2", for_each("uses2", "runer", ["a"]))
    res = brain.cli("validate")
    assert res.rc == 1, res
    line = text.splitlines().index("ambiant:") + 1
    said = f"agents/meant.md:{line}: 'ambiant' looks like 'ambient': without it, meant runs on runners.default"
    assert said in res.out, res
    assert len([row for row in res.out.splitlines() if row.startswith("agents/runer.md:")]) == 1, res


def test_runner_problems_name_the_agent_file_and_the_settings_line(brain: Brain) -> None:
    """A bad runner in profil/ambient.yml is reported at its line, also one an agent's own runner overrides (which
    is said to be unused); an agent's bad runner names its file under agents/."""
    brain.shell_agent("slow", "cat > /dev/null\necho '{}'\n", runner={"kind": "comand"})
    brain.config("concurrency: 2\nrunners:\n  slow: {kind: comand}\n  ghost: {kind: command}\n")
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert re.search(r"^agents/slow\.md:\d+: runner of slow: ", res.out, re.M), res
    assert re.search(r"^profil/ambient\.yml:3: runner of slow: ", res.out, re.M), res
    assert "profil/ambient.yml:3: warning: runners.slow is not used" in res.out, res
    assert re.search(r"^profil/ambient\.yml:4: runner of ghost: ", res.out, re.M), res


def test_typos_in_an_agents_runner_are_named_each_at_its_line_with_the_key_they_look_like(brain: Brain) -> None:
    """`argvs:` and `timout_s:` in an agent's `ambient.runner`, or in `runners:` of profil/ambient.yml, are named at
    their own line with the key they look like; the required `argv` they leave missing is said at the typo's line."""
    text = agent_with_runner("keytypo", {"kind": "command", "argvs": ["bash", "x.sh"], "timout_s": 60})
    brain.write("agents/keytypo.md", text)
    brain.write("agents/elsewhere.md", agent_without_runner("elsewhere"))
    brain.config("runners:\n  elsewhere:\n    kind: command\n    argvs: [bash, y.sh]\n")
    res = brain.cli("validate")
    assert res.rc == 1, res
    rows = text.splitlines()
    argvs = next(n for n, row in enumerate(rows, 1) if row.startswith("    argvs:"))
    timout = next(n for n, row in enumerate(rows, 1) if row.startswith("    timout_s:"))
    runner = rows.index("  runner:") + 1
    at = "agents/keytypo.md"
    unknown = "unknown key for a command runner; did you mean"
    assert f"{at}:{argvs}: runner of keytypo: argvs: {unknown} 'argv'?" in res.out, res
    assert f"{at}:{timout}: runner of keytypo: timout_s: {unknown} 'timeout_s'?" in res.out, res
    assert re.search(rf"^{at}:{argvs}: runner of keytypo: argv: .*'argvs'", res.out, re.M), res
    assert f"{at}:{runner}:" not in res.out, res  # nothing left at the runner: line
    config = "profil/ambient.yml"
    assert f"{config}:4: runner of elsewhere: argvs: {unknown} 'argv'?" in res.out, res
    assert re.search(rf"^{config}:4: runner of elsewhere: argv: .*'argvs'", res.out, re.M), res
    # An item of the agent, in a draft started on purpose, fails with its runner's first problem, not "declare one".
    brain.workflow("typed", "status: draft\n" + for_each("typed", "keytypo", ["a"]))
    brain.ok("start", "typed")
    brain.until_idle()
    [esc] = brain.escalations()
    said = f"agent 'keytypo' has no runner that validates: {at}:{argvs}: runner of keytypo: argv: "
    assert said in esc["question"], esc


def test_an_agent_whose_file_does_not_load_is_said_to_not_load_and_why_not_to_be_missing(brain: Brain) -> None:
    """An agent file whose frontmatter is not valid YAML (a `{` left open) exists: a workflow that spawns it is told
    the agent does not load and the file:line of the cause, in `ambient validate`, in the warning of a draft started
    on purpose, and in the escalation of the run's item; never that the agent does not exist or has no runner."""
    text = agent_md("badyaml", ["bash", "bin/badyaml.sh"]).replace("  ipc:\n", "  ipc: {receives_from: [ambient]\n")
    brain.write("agents/badyaml.md", text)
    brain.write("bin/badyaml.sh", "cat > /dev/null\necho '{}'\n", mode=0o755)
    brain.workflow("usebad", for_each("usebad", "badyaml", ["a"]))
    res = brain.cli("validate")
    assert res.rc == 1, res
    [cause] = re.findall(r"^agents/badyaml\.md:(\d+: expected ',' or '}'.*)$", res.out, re.M)
    assert f"workflows/usebad.yml:4: spawn: agent 'badyaml' does not load: agents/badyaml.md:{cause}" in res.out, res
    assert "does not exist" not in res.out, res

    brain.workflow("usebad", "status: draft\n" + for_each("usebad", "badyaml", ["a"]))
    res = brain.cli("validate", "workflows/usebad.yml")
    assert f"workflows/usebad.yml:5: warning: spawn: agent 'badyaml' does not load: agents/badyaml.md:{cause}" in (
        res.out
    ), res
    started = brain.ok("start", "usebad")
    assert f"agent 'badyaml' does not load: agents/badyaml.md:{cause}" in started.err, started
    brain.until_idle()
    [esc] = brain.escalations()
    assert f"agent 'badyaml' does not load: agents/badyaml.md:{cause}" in esc["question"], esc
    assert "has no runner" not in esc["question"], esc


def test_an_agent_writes_its_scope_and_nothing_else_of_the_brain(brain: Brain) -> None:
    """docs/agents-and-runners.md, agents are confined: an agent as a user writes it (no `confine:` key) writes its
    scope; its write to a file of the brain outside it fails (Permission denied, its error as the person sees it), and
    so does a read of ambient's own state. `ambient doctor` says agents are confined."""
    brain.write("notes.md", "the person's notes\n")
    brain.write(
        "bin/greedy.py",
        textwrap.dedent(
            """
            import json, os, sys
            from pathlib import Path
            json.load(sys.stdin)
            root = Path(os.environ["AMBIENT_BRAIN"])
            (root / "projets" / "greedy" / "a.md").write_text("in scope")
            said = []
            for what, act in (("state", lambda: list((root / ".ambient").iterdir())),
                              ("notes", lambda: (root / "notes.md").write_text("taken"))):
                try:
                    act()
                except OSError as exc:
                    said.append(f"{what}: {exc.strerror}")
            print("; ".join(said), file=sys.stderr)  # the last line of stderr is what the person is shown
            sys.exit(3)
            """
        ),
    )
    agent = agent_md("greedy", ["{{python}}", "bin/greedy.py"]).replace("    confine: false\n", "")
    assert "confine" not in agent
    brain.write("agents/greedy.md", agent)
    brain.workflow(
        "greedy",
        """
        workflow: greedy
        for_each: {items: [a], spawn: greedy, scope: {files: ["projets/greedy/{{item}}.md"]}}
    """,
    )
    brain.until_idle()
    assert brain.read("projets/greedy/a.md") == "in scope"
    assert brain.read("notes.md") == "the person's notes\n"
    [esc] = brain.escalations()
    assert "state: Permission denied" in esc["question"] and "notes: Permission denied" in esc["question"], esc
    assert "agents are confined" in brain.cli("doctor").out


def test_a_chain_step_tells_its_agent_its_story_angle_and_input_contract(brain: Brain) -> None:
    """A chain step's `story_angle` and `input_contract` (what it receives from the step before) reach its agent in
    `payload.context`, their templates filled; a step without an `input_contract` gets none."""
    brain.python_agent(
        "writer",
        """
        import json, pathlib, sys
        ctx = json.load(sys.stdin)["payload"]["context"]
        seen = {k: ctx.get(k) for k in ("story_angle", "input_contract")}
        pathlib.Path("work").mkdir(exist_ok=True)
        pathlib.Path("work", f"told-{ctx['step']}.json").write_text(json.dumps(seen))
        print(json.dumps({"status": "ok"}))
        """,
    )
    brain.workflow(
        "told",
        """
        name: told
        chain:
          - {step: 1, type: brain-write, scope: docs/a.md, agents: [writer], story_angle: "Draft {{workflow}}"}
          - step: 2
            type: brain-write
            scope: docs/b.md
            agents: [writer]
            story_angle: "Review"
            input_contract: "the draft of {{workflow}} ({{prior.result.status}}), for step {{step}}"
    """,
    )
    brain.until_idle()
    [record] = brain.finished("told")
    assert record["outcome"] == "success", record
    assert json.loads(brain.read("work/told-1.json")) == {"story_angle": "Draft told", "input_contract": None}
    told = json.loads(brain.read("work/told-2.json"))
    assert told == {"story_angle": "Review", "input_contract": "the draft of told (ok), for step 2"}, told
