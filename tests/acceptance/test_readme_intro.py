"""README, the introduction: `ambient demo` on the bundled example brain, then "Answer and let it finish"."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import AMBIENT, Brain, Result, agent_md, ambient, for_each, run

INSTANCES = [f"instance-{n:02d}" for n in range(1, 11)]


def demo(tmp_path: Path) -> tuple[Brain, Result]:
    """`ambient demo --dir D`: the example brain copied to D and run until idle."""
    root = tmp_path / "demo"
    res = ambient("demo", "--dir", str(root), timeout=120)
    assert res.rc == 0, res
    return Brain(root), res


def run_of(brain: Brain, workflow: str) -> dict[str, Any]:
    """The workflow's run in progress, as `ambient status --json` shows it."""
    [run] = [r for r in brain.status()["runs"] if r["workflow"] == workflow]
    return run


def successes(record: dict[str, Any]) -> set[str]:
    """Items (or steps) of a finished run that have a successful attempt in its record."""
    return {s["item"] for s in record["steps"] if s["result"] == "success"}


def test_demo_runs_the_example_brain_until_it_waits_on_you(tmp_path: Path) -> None:
    """`ambient demo`: docs-refresh finishes alone, deploy-batch stops on the one failing instance and escalates it,
    feature-chain runs code → tests → docs and waits at its `gate: human` before deploying."""
    brain, _ = demo(tmp_path)
    [docs] = brain.finished("docs-refresh")
    assert docs["outcome"] == "success" and docs["escalations"] == 0, docs
    assert successes(docs) == {"api", "billing", "frontend"}
    assert brain.finished("deploy-batch") == [] and brain.finished("feature-chain") == []

    deploy = {i["name"]: i["status"] for i in run_of(brain, "deploy-batch")["items"]}
    assert deploy == {name: ("escalated" if name == "instance-07" else "done") for name in INSTANCES}, deploy
    chain = {i["name"]: i["status"] for i in run_of(brain, "feature-chain")["items"]}
    assert chain == {"1": "done", "2": "done", "3": "done", "4": "escalated"}, chain

    escs = {e["workflow"]: e for e in brain.escalations()}
    assert set(escs) == {"deploy-batch", "feature-chain"}, escs
    assert escs["deploy-batch"]["item"] == "instance-07"
    assert [o["key"] for o in escs["deploy-batch"]["options"]] == ["retry", "skip", "abort"]
    assert escs["feature-chain"]["kind"] == "gate"
    assert "approve" in [o["key"] for o in escs["feature-chain"]["options"]]
    assert brain.status()["daemon"]["up"] is False  # the demo's daemon is gone once it is idle


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent user is ambient's own user unless ambient runs as root")
def test_init_run_as_root_says_when_the_agent_user_cannot_reach_the_brain(tmp_path: Path) -> None:
    """`ambient init` as root in a folder others cannot search: the agents would all fail to start as the agent
    user, so init says so at once, naming the folder and the fixes, and still makes the brain."""
    closed = Path(tempfile.mkdtemp(prefix="ambient-closed-"))  # 0700, in the system's temp dir others search
    try:
        res = run([*AMBIENT, "init", str(closed / "brain")], agents=False)
        assert res.rc == 0, res
        assert f"cannot reach the brain: {closed} is not searchable by others" in res.err, res
        assert f"chmod o+x {closed}" in res.err and "agent_user" in res.err, res
        assert (closed / "brain" / "agents").is_dir()
        doctor = run([*AMBIENT, "--brain", str(closed / "brain"), "doctor"], agents=False)
        assert f"{closed} is 0700" in doctor.out, doctor  # the same fixes again, `agent_user: root` among them
        assert f"chmod o+x {closed}" in doctor.out and "agent_user: root" in doctor.out, doctor
        brain = ["--brain", str(closed / "brain")]
        checked = run([*AMBIENT, *brain, "validate"], agents=False)  # the files are fine: exit 0, a warning
        assert checked.rc == 0 and f"cannot reach the brain: {closed} is not searchable" in checked.err, checked
        closed.chmod(0o711)
        again = run([*AMBIENT, "init", str(closed / "other")], agents=False)
        assert again.rc == 0 and "cannot reach the brain" not in again.err, again
    finally:
        shutil.rmtree(closed)


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent user is ambient's own user unless ambient runs as root")
def test_a_program_the_agent_user_cannot_reach_says_whom_the_agent_runs_as() -> None:
    """As root, an agent's program under a folder closed to others (an interpreter under /root, 0700) cannot start
    as the agent user: the failure that reaches the person says whom the agent runs as and where the fix is, not
    only 'Permission denied'."""
    where = Path(tempfile.mkdtemp(prefix="ambient-open-"))
    where.chmod(0o711)
    closed = Path(tempfile.mkdtemp(prefix="ambient-closed-"))  # 0700, as /root is
    try:
        tool = closed / "tool"
        tool.write_text("#!/bin/sh\necho '{}'\n")
        tool.chmod(0o755)
        root = where / "brain"
        assert run([*AMBIENT, "init", str(root), "--no-example"], agents=False).rc == 0
        brain = Brain(root)
        brain.write("agents/tool.md", agent_md("tool", [str(tool)], runner={"confine": True}))
        brain.workflow("tooled", for_each("tooled", "tool", ["one"]))
        run([*AMBIENT, "--brain", str(root), "run", "--until-idle"], agents=False, timeout=120)
        asked = run([*AMBIENT, "--brain", str(root), "escalations"], agents=False)
        assert f"cannot start '{tool}': Permission denied (the agent runs as 'ambient-agent'" in asked.out, asked
        assert "`ambient doctor` names it" in asked.out, asked
    finally:
        shutil.rmtree(closed)
        shutil.rmtree(where)


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent user is ambient's own user unless ambient runs as root")
def test_the_readme_demo_run_as_root_runs_its_agents_without_any_capability(tmp_path: Path) -> None:
    """The README's first command as root (a container, CI): the agent user cannot reach an interpreter under
    /root, so the demo's brain says ``agent_user: root`` (uid 0 without capabilities), says so, and its routine
    fan-out still finishes alone."""
    res = run([*AMBIENT, "demo", "--dir", str(tmp_path / "demo")], agents=False, timeout=120)
    assert res.rc == 0, res
    brain = Brain(tmp_path / "demo")
    [docs] = brain.finished("docs-refresh")
    assert docs["outcome"] == "success", docs
    if "== run as root" in res.out:
        assert "agent_user: root" in brain.read("profil/ambient.yml")
    else:  # every folder above the brain and the interpreter is searchable: the agent user runs them
        assert not (tmp_path / "demo" / "profil" / "ambient.yml").exists()


def test_demo_prints_the_status_the_escalations_with_their_command_and_where_the_records_are(tmp_path: Path) -> None:
    """`ambient demo` prints the status, the escalations with the command to answer them, and where the run records
    are."""
    brain, res = demo(tmp_path)
    for workflow in ("docs-refresh", "deploy-batch", "feature-chain"):
        assert workflow in res.out, res
    assert "Escalations waiting on you: 2" in res.out, res
    for esc in brain.escalations():
        assert f"--brain {brain.root} decide {esc['id']}" in res.out, res  # the exact command, from anywhere
        assert esc["question"][:40] in res.out, res
    records = brain.path(".ambient/runs.jsonl")
    assert str(records) in res.out and records.is_file(), res
    assert str(brain.path(".ambient/runs")) in res.out and brain.path(".ambient/runs").is_dir()
    assert str(brain.path("claims")) in res.out and brain.path("claims").is_dir()


def test_the_readme_first_command_makes_its_brain_in_a_temp_folder_and_says_how_to_remove_it(tmp_path: Path) -> None:
    """`ambient demo` as the README runs it (no --dir): a fresh temp folder, named in the output with the command
    that removes it (it stays, so that the person can answer and look)."""
    res = ambient("demo", env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert res.rc == 0, res
    [made] = list(tmp_path.glob("ambient-demo-*"))
    assert f"rm -rf {made}\n" in res.out, res.out
    assert f"--brain {made / 'brain'} runs" in res.out and Brain(made / "brain").finished("docs-refresh"), res.out


def test_demo_prints_the_answer_lines_with_its_own_paths_and_ids(tmp_path: Path) -> None:
    """ "The demo prints these lines with its own paths and ids": escalations, decide ID retry, decide ID approve,
    run --until-idle, runs."""
    brain, res = demo(tmp_path)
    escs = {e["workflow"]: e["id"] for e in brain.escalations()}
    lines = [line.strip() for line in res.out.splitlines()]

    def printed(tail: str) -> bool:
        return any(line.endswith(f"--brain {brain.root} {tail}") for line in lines)

    assert printed("escalations"), res
    assert printed(f"decide {escs['deploy-batch']} retry"), res
    assert printed(f"decide {escs['feature-chain']} approve"), res
    assert printed("run --until-idle"), res
    assert printed("runs"), res


def test_answer_and_let_it_finish(tmp_path: Path) -> None:
    """ "Answer and let it finish": escalations, decide retry, decide approve, run --until-idle (10/10 deployed,
    chain done), runs."""
    brain, _ = demo(tmp_path)
    listing = brain.ok("escalations")
    escs = {e["workflow"]: e["id"] for e in brain.escalations()}
    for esc_id in escs.values():
        assert esc_id in listing.out, listing

    retry = brain.decide(escs["deploy-batch"], "retry")
    assert retry.rc == 0, retry
    approve = brain.decide(escs["feature-chain"], "approve")
    assert approve.rc == 0, approve
    assert brain.escalations() == []

    brain.until_idle()
    records = {r["workflow"]: r for r in brain.finished()}
    assert set(records) == {"docs-refresh", "deploy-batch", "feature-chain"}, records
    deploy = records["deploy-batch"]
    assert deploy["outcome"] == "success", deploy
    assert successes(deploy) == set(INSTANCES)  # 10/10 deployed
    assert [s["attempt"] for s in deploy["steps"] if s["item"] == "instance-07" and s["result"] == "success"] == [2]
    assert "10/10 instances deployed" in brain.ok("thread", "ambient").out  # its on_complete result
    chain = records["feature-chain"]
    assert chain["outcome"] == "success", chain
    assert successes(chain) == {"1", "2", "3", "4"}  # chain done
    status = brain.status()
    assert status["runs"] == [] and status["escalations"] == []

    runs = brain.ok("runs")
    lines = {line.split()[1]: line for line in runs.out.splitlines() if line.strip()}
    for workflow, record in records.items():
        assert "success" in lines[workflow] and record["run_id"] in lines[workflow], runs


def test_or_answer_from_a_browser(tmp_path: Path) -> None:
    """ "Or answer from a browser": the demo prints the `web` command; it serves the console, whose first page shows
    both questions with their buttons (clicking them is tests/web's)."""
    import re
    import signal
    import subprocess

    import httpx

    from tests.acceptance.harness import AMBIENT, clean_env

    brain, res = demo(tmp_path)
    lines = [line.strip() for line in res.out.splitlines()]
    assert any(line.endswith(f"--brain {brain.root} web") for line in lines), res
    proc = subprocess.Popen(
        [*AMBIENT, "--brain", str(brain.root), "web", "--port", "0"],  # any free port: 8765 may be taken here
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.search(r"ambient console: (http://127\.0\.0\.1:\d+/c/[0-9a-f]+/\?token=\S+)", first)
        assert found, first
        # Its cookie jar: the sign-in the URL gives; its POSTs say where they come from, as a browser's do.
        origin = found.group(1).split("/c/", 1)[0]
        browser = httpx.Client(follow_redirects=True, timeout=30, headers={"Origin": origin})
        page = browser.get(found.group(1))
        assert page.status_code == 200, page.text[:300]
        for esc in brain.escalations():
            assert esc["id"] in page.text, esc
        assert ">Run the item again</button>" in page.text and ">Approve and continue</button>" in page.text
        # The overview counts open claims as `ambient status` does (it said 2 where status said 4: a new user's).
        status_open = re.search(r"Open claims: (\d+)", ambient("status", "--brain", str(brain.root)).out)
        card = re.search(r'Claims open</div><div class="value">(\d+)<', page.text)
        assert status_open and card and card.group(1) == status_open.group(1), (status_open, card)
        # The failed instance's claim waits on its run's question: the claims page sends the person there, and its
        # Approve (for gates) is refused, naming the question, instead of leaving the run waiting (a new user's).
        base = found.group(1).split("/?", 1)[0]
        failed = next(e for e in brain.escalations() if e["workflow"] == "deploy-batch")
        claims = browser.get(f"{base}/claims").text
        assert f"Its run waits on {failed['id']}" in claims
        [claim] = [p.stem for p in brain.path("claims").glob("*-item-007.yml")]
        csrf = re.search(r'name="csrf" value="([^"]+)"', claims)
        assert csrf is not None
        refused = browser.post(
            f"{base}/claims/{claim}/gate",
            data={"action": "approve", "csrf": csrf.group(1), "back": "/claims"},
            follow_redirects=False,
        )
        assert refused.status_code == 303 and "level=error" in refused.headers["location"], refused
        assert f"ambient decide {failed['id']}" in httpx.URL(refused.headers["location"]).params["notice"]
        assert brain.escalations() and failed["id"] in {e["id"] for e in brain.escalations()}  # still waiting
        browser.close()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        if proc.stdout is not None:
            proc.stdout.close()
