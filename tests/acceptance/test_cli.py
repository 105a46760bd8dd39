"""docs/cli.md, "CLI reference": every command as a person types it, on a brain made by `ambient init`; every
command the README and docs/ show exists, with the options shown beside it."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import (
    AMBIENT,
    OK_AGENT,
    Brain,
    Result,
    agent_md,
    ambient,
    clean_env,
    docs_section,
    docs_text,
    wait,
)

FAILING_AGENT = """
    import os, sys
    print(f"{os.environ['AMBIENT_ITEM']} is down", file=sys.stderr)
    sys.exit(1)
"""


def _fanout(brain: Brain, name: str, items: list[str], agent: str = "deploy") -> None:
    brain.workflow(
        name,
        f"""
        workflow: {name}
        for_each:
          items: [{", ".join(items)}]
          spawn: {agent}
          scope: {{zone: project, files: ["infrastructure/{{{{item}}}}.yml"]}}
    """,
    )


#: Text in backticks that starts with "ambient " and quotes what ambient says, not a command to type.
NOT_COMMANDS = frozenset({"ambient is already running on … (pid N)"})

_INLINE = re.compile(r"`(ambient [a-z][^`]*)`")
_TYPED = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?(ambient .*)$")
_FLAG = re.compile(r"(?:^|[\s\[])(--[a-z][a-z-]*)")


def _typed_commands(text: str) -> list[str]:
    """Every ``ambient …`` the documentation shows: lines of its code blocks (several on one line, or joined by
    ``&&``; comments cut off) and inline code spans, as written."""
    commands: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            typed = re.split(r"\s+#", line, maxsplit=1)[0]
            for part in re.split(r"\s+&&\s+|\s{2,}(?=ambient\s)", typed):
                if match := _TYPED.match(part.strip()):
                    commands.append(match[1])
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    commands += [m for m in _INLINE.findall(prose) if m not in NOT_COMMANDS]
    return commands


def _documented_commands(text: str) -> dict[tuple[str, ...], set[str]]:
    """Each command the documentation shows, by its words (``("lock", "acquire")``; alternatives ``a|b`` spelled
    out), with the options shown with it."""
    found: dict[tuple[str, ...], set[str]] = {}
    for command in _typed_commands(text):
        tokens = command.split()[1:]
        if tokens[:1] == ["--brain"]:  # `ambient --brain DIR COMMAND`: the global option before the command
            tokens = tokens[2:]
        words: list[list[str]] = []
        for token in tokens:
            if not re.fullmatch(r"[a-z]+(\|[a-z]+)*", token):
                break
            words.append(token.split("|"))
        flags = {f for f in _FLAG.findall(" ".join(tokens)) if f != "--brain"}
        for first in words[0] if words else []:
            for second in words[1] if len(words) > 1 else [None]:
                key = (first,) if second is None else (first, second)
                found.setdefault(key, set()).update(flags)
    return found


_HELP: dict[tuple[str, ...], Result] = {}


def _help(*words: str) -> Result:
    """`ambient WORDS --help`, run once per test session."""
    if words not in _HELP:
        _HELP[words] = ambient(*words, "--help")
    return _HELP[words]


def _is_group(word: str) -> bool:
    """A command with subcommands of its own (`ambient lock acquire`), as its usage line shows."""
    return re.search(r"(SUBCOMMAND|ACTION) \.\.\.", _help(word).out) is not None


# ---------------------------------------------------------------- every command, --help, the brain


def test_every_command_of_the_reference_exists_with_help() -> None:
    """Every command the CLI reference lists, and every command shown anywhere in the README or docs/, exists with
    the options shown beside it, and `--help` works everywhere (exit 0, its usage); the reference lists every
    command `ambient --help` offers."""
    top = ambient("--help")
    assert top.rc == 0 and "usage: ambient" in top.out
    offered = set(re.findall(r"^    ([a-z]+)\b", top.out, re.M))
    reference = {words[0] for words in _documented_commands(docs_section("CLI reference"))}
    assert offered <= reference, f"not in the CLI reference: {offered - reference}"
    assert {
        "run",
        "demo",
        "init",
        "validate",
        "status",
        "runs",
        "start",
        "escalations",
        "decide",
        "notify",
        "config",
        "doctor",
        "matrix",
        "send",
        "claim",
        "gate",
        "lock",
        "preflight",
        "stats",
        "rules",
        "replay",
        "thread",
        "grants",
    } <= reference, reference
    commands = _documented_commands(docs_text())
    assert ("lock", "acquire") in commands and ("gate", "approve") in commands
    for words, flags in commands.items():
        if len(words) > 1 and not _is_group(words[0]):
            if words[0] == "gate":  # `ambient gate ACTION SESS_ID`: an argument listed in the help
                res = _help("gate")
                assert res.rc == 0 and re.search(rf"\b{words[1]}\b", res.out), (words, res)
            words = words[:1]  # `ambient thread coder`, `ambient status ship`: an argument, not a subcommand
        res = _help(*words)
        assert res.rc == 0, (words, res)
        assert f"usage: ambient {' '.join(words)}" in res.out, res
        missing = sorted(flag for flag in flags if not re.search(rf"(?<![\w-]){flag}(?![\w-])", res.out))
        assert not missing, f"`ambient {' '.join(words)}` has no {missing}: {res.out}"


def test_the_brain_is_the_current_directory_or_brain_before_or_after_or_the_environment(
    brain: Brain, tmp_path: Path
) -> None:
    """Every command acts on the brain in the current directory, or `--brain DIR` (before or after the command),
    or `$AMBIENT_BRAIN`."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = str(brain.root)
    ways = {
        "--brain before": ambient("--brain", root, "status", "--json", cwd=elsewhere),
        "--brain after": ambient("status", "--json", "--brain", root, cwd=elsewhere),
        "$AMBIENT_BRAIN": ambient("status", "--json", cwd=elsewhere, env={"AMBIENT_BRAIN": root}),
        "current directory": ambient("status", "--json", cwd=brain.root),
    }
    for way, res in ways.items():
        assert res.rc == 0, (way, res)
        assert res.json()["brain"] == root, (way, res.out)
    brain.python_agent("deploy", OK_AGENT)
    _fanout(brain, "ship", ["web"])
    assert ambient("validate", cwd=brain.root).rc == 0
    assert ambient("validate", "--brain", root, cwd=elsewhere).rc == 0
    res = ambient("run", "--until-idle", "--log-format", "json", cwd=elsewhere, env={"AMBIENT_BRAIN": root})
    assert res.rc == 0, res
    listing = ambient("runs", cwd=brain.root)
    assert "ship" in listing.out and "success" in listing.out, listing


@pytest.mark.parametrize(
    "args",
    [
        ["no-such-command"],
        ["status", "--no-such-option"],
        ["decide"],
        ["runs", "--last", "many"],
        ["stats", "--since", "the day before yesterday"],
        ["decide", "esc-nosuch", "retry"],
        ["start", "ship", "--context", "not json"],
        ["matrix", "explain", "ambient", "deploy", "NO_SUCH_SIGNAL"],
        ["lock", "acquire", "../outside.yml", "me"],
        ["validate", "workflows/missing.yml"],
        ["rules", "accept", "r-nosuchrule"],
        ["thread", "nosuch"],
    ],
)
def test_bad_usage_or_bad_input_exits_2(brain: Brain, args: list[str]) -> None:
    """Exit code 2 = bad usage or bad input, said on stderr, never a traceback."""
    brain.python_agent("deploy", OK_AGENT)
    _fanout(brain, "ship", ["web"])
    res = ambient(*args, cwd=brain.root)
    assert res.rc == 2, res
    assert res.err.strip(), res
    assert "Traceback" not in res.text


def test_a_misspelled_command_is_answered_with_the_close_ones(brain: Brain) -> None:
    """`ambient statsu` exits 2 with argparse's list and the commands it is close to; a word close to none adds
    nothing."""
    res = ambient("statsu", cwd=brain.root)
    assert res.rc == 2 and "did you mean 'stats' or 'status'?" in res.err, res
    far = ambient("zzzz", cwd=brain.root)
    assert far.rc == 2 and "invalid choice: 'zzzz'" in far.err and "did you mean" not in far.err, far


def test_send_says_2_for_an_invalid_packet(brain: Brain) -> None:
    """`ambient send`: exit 2 for a packet that is not valid (bad input)."""
    res = brain.cli("send", "-", input='{"from": "human", "to": "ambient", "signal": "NO_SUCH"}')
    assert res.rc == 2, res
    assert "Traceback" not in res.text


# ---------------------------------------------------------------- init


def test_init_scaffolds_a_working_brain(tmp_path: Path) -> None:
    """`ambient init DIR`: folders, a commented config, an example agent and workflow, and it works at once."""
    root = tmp_path / "brain"
    res = ambient("init", str(root))
    assert res.rc == 0, res
    for folder in ("agents", "claims", "locks", "profil", "workflows"):
        assert (root / folder).is_dir(), folder
    config = (root / "profil" / "ambient.yml").read_text()
    assert re.search(r"^#\s*tick_seconds:", config, re.M), config
    assert list((root / "agents").glob("*.md")) and list((root / "workflows").glob("*.yml"))
    assert ambient("validate", "--brain", str(root)).rc == 0
    ran = ambient("run", "--until-idle", "--log-format", "json", "--brain", str(root))
    assert ran.rc == 0, ran
    runs = ambient("runs", "--json", "--brain", str(root)).json()["finished"]
    assert [r["outcome"] for r in runs] == ["success"], runs

    bare = tmp_path / "bare"
    assert ambient("init", str(bare), "--no-example").rc == 0
    assert (bare / "profil" / "ambient.yml").is_file()
    assert not list((bare / "agents").glob("*.md")) and not list((bare / "workflows").glob("*.yml"))


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_init_never_overwrites(example_brain: Brain) -> None:
    """`ambient init` never overwrites: on an existing brain it changes no file and says so."""
    example_brain.write("profil/ambient.yml", "tick_seconds: 5\n")
    example_brain.write("workflows/hello.yml", example_brain.read("workflows/hello.yml") + "# my edit\n")
    before = _tree(example_brain.root)
    for extra in ([], ["--no-example"]):
        res = ambient("init", str(example_brain.root), *extra)
        assert res.rc != 0, res
        assert "overwrite" in res.err, res
        assert _tree(example_brain.root) == before
    assert example_brain.read("profil/ambient.yml") == "tick_seconds: 5\n"


# ---------------------------------------------------------------- validate


def test_validate_prints_file_line_message_and_exits_1(brain: Brain) -> None:
    """`ambient validate [PATH...]`: `file:line: message` for each problem, exit 1 if any, 0 when clean."""
    brain.python_agent("deploy", OK_AGENT)
    _fanout(brain, "ship", ["web"])
    clean = brain.cli("validate")
    assert clean.rc == 0, clean
    brain.write(
        "workflows/broken.yml",
        "workflow: broken\nfor_each:\n  items: [a]\n  spawn: nobody\n"
        '  scope: {zone: project, files: ["x/{{item}}.md"]}\n',
    )
    res = brain.cli("validate")
    assert res.rc == 1, res
    assert re.search(r"^workflows/broken\.yml:4: .*nobody", res.out, re.M), res
    only = brain.cli("validate", str(brain.path("workflows/ship.yml")))
    assert only.rc == 0, only
    named = brain.cli("validate", str(brain.path("workflows/broken.yml")))
    assert named.rc == 1 and "broken.yml:4:" in named.out, named


def test_validate_strict_counts_warnings(brain: Brain) -> None:
    """`ambient validate --strict`: a warning is a problem too (exit 1); without it, exit 0."""
    gate = {
        "receives_from": ["ambient"],
        "sends_to": ["ambient"],
        "zone_access": ["project", "reference"],
        "signals": ["RETURN"],
    }
    brain.python_agent("librarian", OK_AGENT, gate=gate)
    res = brain.cli("validate")
    assert res.rc == 0, res
    assert re.search(r"^agents/librarian\.md:\d+: warning: .*reference", res.out, re.M), res
    strict = brain.cli("validate", "--strict")
    assert strict.rc == 1, strict
    assert "agents/librarian.md:" in strict.out


def test_validate_checks_a_path_as_what_it_is_by_where_it_lives(example_brain: Brain) -> None:
    """`ambient validate PATH` checks an agent as an agent, profil/ambient.yml as the
    configuration, the routing table as one, a claim as a claim, a directory as everything of its kind in it, with
    the checks of the whole brain; anything else is exit 2 saying what validate checks."""
    brain = example_brain
    brain.python_agent("checker", OK_AGENT)
    for path in ("agents/checker.md", "agents", "profil/ambient.yml", "profil/routing.yml", "profil", "workflows"):
        res = ambient("validate", path, cwd=brain.root)
        assert res.rc == 0 and res.out.startswith("ok: "), res
        assert "another document" not in res.out and "neither a for_each" not in res.out, res
    assert "2 agent file(s)" in ambient("validate", "agents", cwd=brain.root).out
    brain.write("agents/broken.md", "---\nname: broken\nbrain: [unclosed\n---\n# broken\n")
    brain.write("profil/ambient.yml", "concurency: 2\n")
    brain.write("claims/sess-broken.yml", "sess_id: [\n")
    for path, where in (
        ("agents/broken.md", "agents/broken.md:"),
        ("agents", "agents/broken.md:"),
        ("profil/ambient.yml", "profil/ambient.yml:1: "),
        ("claims/sess-broken.yml", "claims/sess-broken.yml:"),
        ("claims", "claims/sess-broken.yml:"),
    ):
        res = ambient("validate", path, cwd=brain.root)
        assert res.rc == 1 and re.search(rf"^{re.escape(where)}", res.out, re.M), res
    one = ambient("validate", "agents/checker.md", cwd=brain.root)
    assert one.rc == 0 and "broken" not in one.out and "concurency" not in one.out, one
    brain.write("bin/tool.py", "print('hi')\n")
    for path in ("bin/tool.py", "bin"):
        res = ambient("validate", path, cwd=brain.root)
        assert res.rc == 2 and "validate checks workflows/*.yml, agents/*.md" in res.err, res


def test_validate_and_doctor_report_a_missing_agent_script_alike(brain: Brain) -> None:
    """An agent whose runner names a script that is not there fails every spawn: `validate`
    reports it as an error at the agent's file and line, as `doctor` does (one check, both commands)."""
    brain.write("agents/ghost.md", agent_md("ghost", ["{{python}}", "bin/does_not_exist.py"]))
    checked = brain.cli("validate")
    assert checked.rc == 1, checked
    [line] = [row for row in checked.out.splitlines() if "does_not_exist.py" in row]
    assert re.match(r"^agents/ghost\.md:\d+: agent ghost: script bin/does_not_exist\.py not found", line), checked
    assert ambient("validate", "agents/ghost.md", cwd=brain.root).rc == 1
    report = brain.cli("doctor", "--json").json()
    [finding] = [f for f in report["findings"] if "does_not_exist.py" in f["message"]]
    assert finding["severity"] == "error"
    assert line.startswith(f"{finding['file']}:{finding['line']}: {finding['message']}"), (line, finding)


# ---------------------------------------------------------------- status, runs


def test_status_shows_the_daemon_runs_and_escalations(brain: Brain) -> None:
    """`ambient status [WORKFLOW] [--json]`: daemon up/down, runs with progress, escalations (item by item for one
    workflow)."""
    brain.python_agent("deploy", FAILING_AGENT)
    brain.python_agent("ok", OK_AGENT)
    _fanout(brain, "rollout", ["eu-1", "eu-2"])
    with brain.daemon() as daemon:
        escs = brain.wait_escalation("both items failed", count=2)
        text = brain.ok("status").out
        assert f"Daemon: up (pid {daemon.pid})" in text, text
        assert re.search(r"rollout .* 0/2 done", text), text
        assert "Escalations waiting on you: 2" in text
        for esc in escs:  # the exact line to answer it: this brain named, as status was asked with --brain
            assert f"ambient --brain {brain.root} decide {esc['id']} <option>" in text, text
        one = brain.ok("status", "rollout").out
        assert re.search(r"^\s+eu-1\s+\S+\s+escalation esc-", one, re.M), one
        assert re.search(r"^\s+eu-2\s+", one, re.M), one
        data = brain.status()
        assert data["daemon"] == {"up": True, "pid": daemon.pid}
        [run] = data["runs"]
        assert (run["workflow"], run["done"], run["total"], run["waiting"]) == ("rollout", 0, 2, 2)
        assert {e["id"] for e in data["escalations"]} == {e["id"] for e in escs}
        assert daemon.stop() == 0
    down = brain.ok("status")
    assert "Daemon: down" in down.out
    assert brain.status()["daemon"]["up"] is False


def test_status_says_why_items_show_running_while_the_daemon_is_down(brain: Brain) -> None:
    """After a kill -9 the journal still has an item running (its agent may outlive the daemon): `ambient status`
    says so beside it, and what the next start does, instead of a bare `Daemon: down` over running items."""
    brain.python_agent(
        "hold",
        """
        import os, pathlib, sys, time
        sys.stdin.read()
        brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
        (brain / "started").write_text("")
        while not (brain / "release").exists():
            time.sleep(0.05)
        """,
    )
    _fanout(brain, "held", ["one"], agent="hold")
    with brain.daemon() as daemon:
        wait(lambda: brain.path("started").exists(), "the agent to start")
        calm = brain.ok("status").out
        assert "the daemon is down" not in calm, calm
        daemon.kill()
    try:
        text = brain.ok("status").out
        assert "Daemon: down" in text and "1 running" in text, text
        assert "the daemon is down: items shown running were running when it stopped" in text, text
    finally:
        brain.write("release", "")


def test_status_is_the_same_without_its_query_store_or_with_a_garbage_one(brain: Brain) -> None:
    """`ambient status` reads .ambient/query.sqlite3, a derived store: deleted, it is rebuilt and status
    says the same; overwritten with garbage, status still works and says the same."""
    brain.python_agent("deploy", FAILING_AGENT)
    _fanout(brain, "rollout", ["eu-1", "eu-2"])
    brain.until_idle()
    store = brain.path(".ambient/query.sqlite3")
    first = brain.ok("status").out
    assert "Escalations waiting on you: 2" in first and store.exists(), first
    for suffix in ("", "-wal", "-shm"):
        brain.path(f".ambient/query.sqlite3{suffix}").unlink(missing_ok=True)
    assert brain.ok("status").out == first
    assert store.exists()
    for suffix in ("-wal", "-shm"):
        brain.path(f".ambient/query.sqlite3{suffix}").unlink(missing_ok=True)
    store.write_bytes(b"\x00garbage, not a database\n" * 512)
    assert brain.ok("status").out == first
    assert brain.ok("runs").out == brain.ok("runs").out


def test_status_of_one_workflow_shows_only_its_escalations_each_named_once(brain: Brain) -> None:
    """`ambient status WORKFLOW` lists that workflow's escalations only (as it lists its runs
    only), and an escalation's line names its workflow once (`esc-…  rollout / eu-1: …`)."""
    brain.python_agent("deploy", FAILING_AGENT)
    _fanout(brain, "rollout", ["eu-1"])
    _fanout(brain, "other", ["x-1"])
    brain.until_idle()
    escs = {e["workflow"]: e["id"] for e in brain.escalations()}
    assert set(escs) == {"rollout", "other"}, escs
    everything = brain.ok("status").out
    assert "Escalations waiting on you: 2" in everything, everything
    assert re.search(rf"^  {escs['rollout']}  rollout / eu-1: ", everything, re.M), everything
    assert "rollout rollout" not in everything, everything
    one = brain.ok("status", "rollout").out
    assert "Escalations waiting on you: 1" in one and escs["rollout"] in one, one
    assert escs["other"] not in one and "x-1" not in one, one


def _retried_then_skipped(brain: Brain, items: list[str], *, attempts: int) -> str:
    """A rollout of ``deploy`` over ``items`` retried on failure, its one question answered `skip`, run to its end:
    what `ambient status` prints then."""
    _fanout(brain, "rollout", items)
    brain.write(
        "workflows/rollout.yml",
        brain.read("workflows/rollout.yml") + f"retry: {{attempts: {attempts}, backoff: 0.01, on: [fail]}}\n",
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "skip").rc == 0
    brain.until_idle()
    return brain.ok("status").out


def test_status_shows_an_items_error_once_with_its_attempts(brain: Brain) -> None:
    """`ambient status`'s "Last failures and errors" names a failing item once, with how many attempts failed,
    not once per attempt."""
    brain.python_agent("deploy", FAILING_AGENT)
    text = _retried_then_skipped(brain, ["eu-1"], attempts=3)
    errors = text.split("Last failures and errors:", 1)[1].splitlines()[1:]
    assert [row for row in errors if "eu-1" in row] == [
        "  rollout/eu-1 (3 attempts): agent exited with code 1: eu-1 is down"
    ], text


def test_status_leaves_out_an_item_a_retry_then_did(brain: Brain) -> None:
    """An item that failed once and succeeded at its retry is no failure: `ambient status` lists the item that is
    still failed, not the one that recovered (a new user read the recovered one as a standing failure)."""
    brain.python_agent(
        "deploy",
        """
        import os, sys
        if os.environ["AMBIENT_ITEM"] == "eu-1" or os.environ["AMBIENT_ATTEMPT"] == "1":
            print(f"{os.environ['AMBIENT_ITEM']} is down", file=sys.stderr)
            sys.exit(1)
        """,
    )
    text = _retried_then_skipped(brain, ["eu-1", "eu-2"], attempts=2)
    [record] = brain.finished("rollout")
    assert [(s["item"], s["result"]) for s in record["steps"] if s["item"] == "eu-2"] == [
        ("eu-2", "fail"),
        ("eu-2", "success"),
    ], record
    errors = text.split("Last failures and errors:", 1)[1].splitlines()[1:]
    assert any("rollout/eu-1" in row for row in errors), text
    assert not any("eu-2" in row for row in errors), text


def test_status_names_workflow_files_that_do_not_load(brain: Brain) -> None:
    """`ambient status` says how many workflow files do not load, which, and to run
    `ambient validate`; a brain whose workflows all load says nothing of it."""
    brain.python_agent("deploy", OK_AGENT)
    _fanout(brain, "ship", ["web"])
    assert "do not load" not in brain.ok("status").out
    brain.write("workflows/broken.yml", "workflow: broken\nfor_each: {items: [a]}\n")
    brain.write("workflows/typo.yml", "workflow: typo\nfor_each:\n  items: [a]\n  spawn: nobody\n")
    text = brain.ok("status").out
    assert re.search(
        r"^Workflow files that do not load: 2 \(workflows/broken\.yml, workflows/typo\.yml\); "
        rf"`ambient --brain {re.escape(str(brain.root))} validate` says why$",
        text,
        re.M,
    ), text
    assert brain.status()["broken_workflows"] == ["workflows/broken.yml", "workflows/typo.yml"]
    # Status keeps these facts in its query store until a file they come from changes.
    brain.path("workflows/typo.yml").unlink()
    assert brain.status()["broken_workflows"] == ["workflows/broken.yml"]
    assert "do not load: 1 (workflows/broken.yml)" in brain.ok("status").out


def test_runs_lists_recorded_runs_and_last_n(brain: Brain) -> None:
    """`ambient runs [WORKFLOW] [--last N]`: the recorded runs; `--last N` the newest N."""
    brain.python_agent("ok", OK_AGENT)
    _fanout(brain, "alpha", ["a"], agent="ok")
    brain.until_idle()
    _fanout(brain, "beta", ["b"], agent="ok")
    brain.until_idle()
    brain.ok("start", "alpha")
    brain.until_idle()
    ids = [r["run_id"] for r in brain.finished()]
    assert len(ids) == 3

    def listed(*args: str) -> list[str]:
        out = brain.ok("runs", *args).out
        return [rid for line in out.splitlines() for rid in re.findall(r"sess-\S+", line)]

    assert listed() == ids
    assert listed("--last", "2") == ids[1:]
    assert listed("--last", "1") == ids[2:]
    assert listed("alpha") == [ids[0], ids[2]]
    assert listed("alpha", "--last", "1") == [ids[2]]
    assert [r["run_id"] for r in brain.ok("runs", "--last", "2", "--json").json()["finished"]] == ids[1:]


# ---------------------------------------------------------------- doctor, matrix


def _snapshot(root: Path) -> dict[str, Any]:
    """Every entry under the brain with its kind, size, mtime and content (a change anywhere shows)."""
    snap: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        body = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        snap[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, body)
    return snap


def test_doctor_writes_nothing(brain: Brain) -> None:
    """`ambient doctor [--json]`: what is wrong and how to fix it; it writes nothing (nor does `validate`)."""
    brain.python_agent("deploy", FAILING_AGENT)
    _fanout(brain, "rollout", ["eu-1"])
    brain.until_idle()
    brain.write("claims/broken.yml", "status: [open\n")
    index = brain.path(".ambient/claims-index.json")
    if index.exists():
        index.unlink()
    before = _snapshot(brain.root)
    text = brain.cli("doctor")
    data = brain.cli("doctor", "--json")
    checked = brain.cli("validate")
    assert _snapshot(brain.root) == before
    assert text.rc == 1 and data.rc == 1, (text, data)
    report = data.json()
    assert report["ok"] is False and report["daemon"]["up"] is False
    checks = {f["check"] for f in report["findings"]}
    assert "daemon" in checks, report
    for finding in report["findings"]:
        assert {"severity", "check", "message", "hint"} <= set(finding)
    assert any(
        "claims/broken.yml" in str(f.get("file")) or "claims/broken.yml" in f["message"] for f in report["findings"]
    ), report
    assert "fix:" in text.out
    assert checked.rc == 1 and "claims/broken.yml:" in checked.out


def test_doctor_says_ok_on_a_healthy_brain_with_its_daemon_up(example_brain: Brain) -> None:
    """`ambient doctor`: nothing wrong on a fresh brain whose daemon runs: exit 0, `ok` in --json."""
    with example_brain.daemon():
        example_brain.wait_finished("hello")
        res = example_brain.cli("doctor", "--json")
        assert res.rc == 0, res
        assert res.json()["ok"] is True and res.json()["daemon"]["up"] is True


def test_matrix_and_explain(brain: Brain) -> None:
    """`ambient matrix`: the effective matrix; `matrix explain FROM TO SIGNAL`: allow/deny and the rule (0/1/2)."""
    brain.python_agent("deploy", OK_AGENT)
    shown = brain.ok("matrix").out
    assert re.search(r"^deploy\b", shown, re.M) and re.search(r"^ambient\b", shown, re.M), shown
    allow = brain.cli("matrix", "explain", "ambient", "deploy", "SPAWN", "--file", "infrastructure/vps/x.yml")
    assert allow.rc == 0 and "ALLOW" in allow.out, allow
    deny = brain.cli("matrix", "explain", "deploy", "human", "SPAWN")
    assert deny.rc == 1 and "DENY" in deny.out and "agents/deploy.md" in deny.out, deny
    zone = brain.cli("matrix", "explain", "ambient", "deploy", "SPAWN", "--file", "profil/capital.md")
    assert zone.rc == 1 and "DENY" in zone.out, zone
    assert brain.cli("matrix", "explain", "ambient", "deploy", "SPAWN", "--file", "../x").rc == 2


# ---------------------------------------------------------------- output into a pipe


def test_escalations_into_a_closed_pipe_ends_quietly(brain: Brain) -> None:
    """`ambient escalations | head`: when the reader goes away, the command stops quietly (141, no traceback)."""
    brain.python_agent("deploy", FAILING_AGENT)
    _fanout(brain, "rollout", [f"eu-{n}" for n in range(1, 4)])
    brain.until_idle()
    assert len(brain.escalations()) == 3
    read_end, write_end = os.pipe()
    os.close(read_end)  # `head` has already exited
    try:
        proc = subprocess.run(
            [*AMBIENT, "--brain", str(brain.root), "escalations"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc
    assert b"Traceback" not in proc.stderr and b"Error" not in proc.stderr, proc.stderr


def test_escalations_piped_into_head_prints_the_first_lines(brain: Brain) -> None:
    """`ambient escalations | head -n 2` as typed in a shell: the first lines, no traceback."""
    brain.python_agent("deploy", FAILING_AGENT)
    _fanout(brain, "rollout", [f"eu-{n}" for n in range(1, 40)])
    brain.until_idle()
    wait(lambda: len(brain.escalations()) == 39, "39 escalations")
    res = subprocess.run(
        [
            "bash",
            "-c",
            f'{" ".join(AMBIENT)} --brain {brain.root} escalations | head -n 2; echo "rc=${{PIPESTATUS[0]}}"',
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("esc-"), res
    assert lines[-1] in ("rc=0", "rc=141"), res
    assert "Traceback" not in res.stderr, res.stderr


# ---------------------------------------------------------------- demo, status --watch, start --step, doctor --strict


def test_demo_runs_the_daemon_on_a_fresh_copy_of_the_example_brain_then_the_status(tmp_path: Path) -> None:
    """`ambient demo [--dir D]`: the daemon on a fresh copy of the example brain until idle, then the status."""
    root = tmp_path / "demo"
    res = ambient("demo", "--dir", str(root), timeout=180)
    assert res.rc == 0, res
    assert "Daemon: down" in res.out and "Escalations waiting on you: 2" in res.out, res.out
    for workflow in ("docs-refresh", "deploy-batch", "feature-chain"):
        assert workflow in res.out
    assert re.search(r"deploy-batch .* 9/10 done", res.out), res.out
    assert f"--brain {root} decide" in res.out
    runs = ambient("runs", "--json", "--brain", str(root)).json()
    assert [r["workflow"] for r in runs["finished"]] == ["docs-refresh"]
    assert {r["workflow"] for r in runs["active"]} == {"deploy-batch", "feature-chain"}


def test_status_watch_refreshes_until_interrupted(brain: Brain) -> None:
    """`ambient status --watch`: the status again and again until interrupted (Ctrl-C ends it with 0)."""
    with subprocess.Popen(
        [*AMBIENT, "--brain", str(brain.root), "status", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    ) as proc:
        assert proc.stdout is not None
        seen = b""
        try:
            while seen.count(b"Daemon: down") < 2:  # two screens: it refreshes
                chunk = proc.stdout.read1(65536)
                assert chunk, "status --watch stopped on its own"
                seen += chunk
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err


def test_start_runs_a_workflow_now_and_a_chain_from_a_step(brain: Brain) -> None:
    """`ambient start WORKFLOW [--step N]`: a run now (even of a draft); a chain from step N."""
    brain.python_agent(
        "writer",
        """
        import json, os, pathlib, sys
        json.load(sys.stdin)
        work = pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace")
        work.mkdir(exist_ok=True)
        with open(work / "steps.log", "a") as f:
            f.write(os.environ["AMBIENT_ITEM"] + "\\n")
        print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "docs",
        """
        name: docs
        status: draft
        chain:
          - {step: 1, type: brain-write, scope: projets/docs/a.md, agents: [writer]}
          - {step: 2, type: brain-write, scope: projets/docs/b.md, agents: [writer]}
          - {step: 3, type: brain-write, scope: projets/docs/c.md, agents: [writer]}
    """,
    )
    with brain.daemon():
        assert brain.ok("start", "docs", "--step", "2").rc == 0
        [record] = brain.wait_finished("docs")
        assert brain.read("workspace/steps.log").split() == ["2", "3"]
        # The step before --step is left out of the count (docs/workflows.md): 2 of 2 done, not 2 of 3.
        assert (record["outcome"], record["done"], record["total"]) == ("success", 2, 2), record
        assert " success   2/2 steps done" in brain.ok("runs", "docs").out
        brain.ok("start", "docs")
        brain.wait_finished("docs", count=2)
    assert brain.read("workspace/steps.log").split() == ["2", "3", "1", "2", "3"]
    assert brain.cli("start", "nosuch").rc == 2


def test_doctor_strict_counts_warnings(example_brain: Brain) -> None:
    """`ambient doctor --strict`: a warning makes it exit 1; without --strict warnings are allowed (exit 0)."""
    gate = {
        "receives_from": ["ambient"],
        "sends_to": ["ambient"],
        "zone_access": ["project", "reference"],
        "signals": ["RETURN"],
    }
    example_brain.python_agent("librarian", OK_AGENT, gate=gate)
    with example_brain.daemon():
        example_brain.wait_finished("hello")
        plain = example_brain.cli("doctor")
        strict = example_brain.cli("doctor", "--strict")
    assert plain.rc == 0 and "warning" in plain.out and "agents/librarian.md" in plain.out, plain
    assert strict.rc == 1, strict


def test_run_refuses_a_directory_that_is_not_a_brain(tmp_path: Path) -> None:
    """`ambient run` in a directory that is not a brain names it and suggests `ambient init`, creating nothing."""
    empty = tmp_path / "notabrain"
    empty.mkdir()
    res = ambient("run", "--until-idle", cwd=empty)
    assert res.rc == 2 and str(empty) in res.err and "ambient init" in res.err, res
    assert list(empty.iterdir()) == []


def test_commands_refuse_a_directory_that_is_not_a_brain(tmp_path: Path) -> None:
    """`validate`, `status` and `runs` in a directory that is no brain say so (exit 2), as `run` does, instead of
    "ok: 0 workflow(s)"."""
    for args in (("validate",), ("status",), ("runs",), ("run", "--until-idle")):
        res = ambient("--brain", str(tmp_path), *args)
        assert res.rc == 2 and "is not a brain" in res.err, res


def test_a_command_run_inside_a_brain_names_the_brain_and_never_suggests_init_there(
    example_brain: Brain, tmp_path: Path
) -> None:
    """`cd brain/workflows && ambient status` (or `--brain` a folder of a brain) says it is inside that brain and how
    to reach it, exit 2 as for any folder that is not a brain; never `ambient init` there (a brain in a brain)."""
    root = example_brain.root
    here = ambient("status", "hello", cwd=root / "workflows")
    assert here.rc == 2, here
    assert f"you are inside the brain {root}: run `ambient --brain {root} status hello`, or cd there" in here.err, here
    assert "ambient init" not in here.err, here
    there = ambient("--brain", str(root / "agents"), "validate", "--strict", cwd=tmp_path)
    assert there.rc == 2, there
    assert f"{root / 'agents'} is inside the brain {root}: run `ambient --brain {root} validate --strict`" in there.err
    assert "ambient init" not in there.err, there
    missing = ambient("--brain", str(root / "workspace" / "nowhere"), "runs", cwd=tmp_path)
    assert missing.rc == 2 and f"is inside the brain {root}" in missing.err, missing
    assert "ambient init" not in missing.err and not (root / "workspace" / "nowhere").exists(), missing


def test_runs_refuses_an_unknown_workflow_and_a_last_below_one(brain: Brain) -> None:
    """`runs nosuch` is exit 2 like `status nosuch`; `--last` counts from 1."""
    res = brain.cli("runs", "nosuch")
    assert res.rc == 2 and "no workflow named 'nosuch'" in res.err, res
    for n in ("0", "-1"):
        res = brain.cli("runs", "--last", n)
        assert res.rc == 2 and "--last must be 1 or more" in res.err, res


#: Every command that reads or writes a brain, as a person would type it (only `init`, `demo`, `config template`,
#: `--help` and `--version` need none).
BRAIN_COMMANDS: list[tuple[str, ...]] = [
    ("decide", "esc-abcdef", "1"),
    ("escalations",),
    ("status",),
    ("runs",),
    ("start", "hello"),
    ("validate",),
    ("doctor",),
    ("run", "--until-idle"),
    ("stats",),
    ("rules",),
    ("rules", "accept", "r-abc"),
    ("replay", "hello"),
    ("config", "show"),
    ("notify", "test"),
    ("lock", "list"),
    ("lock", "acquire", "foo.txt", "me"),
    ("lock", "cleanup"),
    ("thread", "deploy"),
    ("claim", "list"),
    ("claim", "open", "--type", "code", "--scope", "x/", "--agent", "coder"),
    ("gate", "approve", "sess-abc"),
    ("preflight", "status", "x/"),
    ("matrix",),
    ("matrix", "explain", "ambient", "deploy", "SPAWN"),
    ("send", "-"),
]


@pytest.mark.parametrize("args", BRAIN_COMMANDS, ids=[" ".join(a) for a in BRAIN_COMMANDS])
def test_every_brain_command_refuses_a_directory_that_is_not_a_brain_and_writes_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """A command that needs a brain refuses an empty or missing directory with exit 2 and
    one message, and creates nothing there (a refused `decide` used to leave `.ambient/`, which made the directory
    look like a brain to the next command)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    packet = '{"from": "human", "to": "ambient", "signal": "NOTIFY", "payload": {"context": {"text": "hi"}}}'
    here = ambient(*args, cwd=empty, input=packet)
    assert here.rc == 2 and f"{empty} is not a brain" in here.err and "ambient init" in here.err, here
    assert list(empty.iterdir()) == [], here
    missing = tmp_path / "nonexistent"
    there = ambient("--brain", str(missing), *args, cwd=empty, input=packet)
    assert there.rc == 2 and f"{missing} is not a directory" in there.err, there
    assert not missing.exists() and list(empty.iterdir()) == [], there


def test_a_refused_decide_leaves_no_brain_behind_and_init_still_makes_one(tmp_path: Path) -> None:
    """After a refused `decide` in a plain directory, `status` and `run` still refuse it; `init` makes a brain of
    an empty directory and of one that does not exist yet."""
    plain = tmp_path / "plain"
    plain.mkdir()
    assert ambient("decide", "esc-abcdef", "1", cwd=plain).rc == 2
    for args in (("status",), ("run", "--until-idle")):
        res = ambient(*args, cwd=plain)
        assert res.rc == 2 and "is not a brain" in res.err, res
    assert list(plain.iterdir()) == []
    made = ambient("init", "--no-example", cwd=plain)
    assert made.rc == 0 and (plain / "profil" / "ambient.yml").is_file(), made
    assert ambient("status", cwd=plain).rc == 0
    before = _tree(plain)
    assert ambient("decide", "esc-abcdef", "1", cwd=plain).rc == 2
    assert _tree(plain) == before and not (plain / ".ambient" / "escalations").exists()
    new = tmp_path / "new" / "brain"
    assert ambient("init", str(new)).rc == 0 and (new / "profil" / "ambient.yml").is_file()
    assert ambient("--brain", str(new), "validate").rc == 0


def _past_claims(brain: Brain, count: int, *, open_every: int) -> int:
    """``count`` claim files of sessions long over, as the claims writer leaves them (one in ``open_every`` still
    open); how many are open."""
    opened = 0
    for n in range(count):
        sid = f"sess-20260301-0900-past-{n:05d}"
        status = "open" if n % open_every == 0 else "closed"
        opened += status == "open"
        text = (
            f"sess_id: {sid}\ntype: satellite\nscope: projects/past/{sid}.md\nagent: deploy\nstatus: {status}\n"
            f'opened_at: "2026-03-01T09:00:00+00:00"\nparent_satellite: sess-20260301-0900-past\nworkflow: past\n'
        )
        if status == "closed":
            text += 'result:\n  status: ok\nclosed_at: "2026-03-01T09:05"\n'
        (brain.root / "claims" / f"{sid}.yml").write_text(text)
    return opened


def test_status_answers_at_once_on_a_big_brain_whose_store_was_deleted(brain: Brain) -> None:
    """A brain with thousands of claim files and no query store (deleted, or never built): `ambient status` answers
    at once from what is cheap to read (runs in progress from their journals' first lines, the newest finished
    runs, the count of claim files) and says plainly which figures are still being gathered; the store is built in
    the background, and a later `ambient status` says what it said before the store was deleted."""
    brain.python_agent("deploy", FAILING_AGENT)
    brain.python_agent("ok", OK_AGENT)
    _fanout(brain, "rollout", ["eu-1", "eu-2"])
    _fanout(brain, "tidy", ["t-1"], agent="ok")
    brain.until_idle()
    opened = _past_claims(brain, 3000, open_every=500)
    before = brain.ok("status").out
    assert "Escalations waiting on you: 2" in before, before
    open_before = int(re.search(r"^Open claims: (\d+)$", before, re.M).group(1))  # type: ignore[union-attr]
    assert open_before >= opened, before
    for suffix in ("", "-wal", "-shm"):
        brain.path(f".ambient/query.sqlite3{suffix}").unlink(missing_ok=True)

    first = brain.ok("status")
    text = first.out
    files = len(list((brain.root / "claims").glob("*.yml")))
    assert re.search(rf"^Open claims: being indexed \(\d[\d,]* of {files:,} claim files read\)", text, re.M), text
    assert f"run `ambient --brain {brain.root} status` again" in text, text
    assert re.search(r"^Runs in progress: 1 \(their items are being gathered\)$", text, re.M), text
    assert re.search(r"^  rollout\s+started \S+, 2 items  sess-", text, re.M), text
    assert re.search(r"^Escalations waiting on you: being gathered \(2 escalation files\)$", text, re.M), text
    assert re.search(r"^  tidy\s+success\s+escalations=0", text, re.M), text  # the finished run, from its record

    def built() -> str | None:
        out = brain.ok("status").out
        return out if "being" not in out else None

    assert wait(built, "status with every figure (the store built in the background)", timeout=300) == before
    data = brain.status()
    assert data["claims"]["open"] == open_before and "gathering" not in data, data
