"""docs/claims-and-locks.md: `ambient claim|gate|lock|preflight|status` as a person uses them
on a fresh brain, and the claims a running daemon leaves for each item and step."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.acceptance.harness import AMBIENT, OK_AGENT, Brain, clean_env, wait

# ---------------------------------------------------------------- helpers


def _open(
    brain: Brain, sess_id: str, scope: str, *args: str, agent: str = "coder", claim_type: str = "satellite"
) -> None:
    res = brain.ok(
        "claim", "open", "--type", claim_type, "--scope", scope, "--agent", agent, "--sess-id", sess_id, *args
    )
    assert res.out.strip() == sess_id, res


def _claim(brain: Brain, sess_id: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(brain.read(f"claims/{sess_id}.yml"))
    return data


def _status_of(brain: Brain, sess_id: str) -> str:
    return str(_claim(brain, sess_id)["status"])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_digest(root: Path) -> str:
    """One hash over every file under ROOT (names and contents): "nothing changed" made checkable."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _ago(**delta: float) -> str:
    return (datetime.now(UTC) - timedelta(**delta)).isoformat(timespec="seconds")


def _lock_json(brain: Brain, file: str) -> dict[str, Any]:
    res = brain.cli("lock", "check", file, "--json")
    assert res.rc in (0, 1), res
    data: dict[str, Any] = res.json()
    return data


def _lock_state(brain: Brain, file: str) -> str | None:
    rows = [row for row in brain.ok("lock", "list", "--json").json() if row["file"] == file]
    return rows[0]["state"] if rows else None


def _holder(brain: Brain, file: str) -> str | None:
    path = brain.root / "locks" / (file.replace("/", "%2F") + ".lock")
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text())
    return str(data["holder"])


def _expire_soon(brain: Brain, file: str, holder: str) -> None:
    """Take FILE's lock for a few milliseconds, then wait until it counts as expired (its TTL plus the grace)."""
    brain.ok("lock", "acquire", file, holder, "--ttl", "0.001")
    wait(lambda: _lock_state(brain, file) == "expired", f"the lock of {file} to expire", timeout=20)


def _held_by_a_dead_process(brain: Brain, file: str) -> None:
    """Make FILE's lock one that a process of this host held and left behind when it died (as a daemon's are)."""
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout.strip()
    path = brain.root / "locks" / (file.replace("/", "%2F") + ".lock")
    lines = path.read_text().replace("pid_bound: false", "pid_bound: true").splitlines()
    path.write_text("\n".join(f"pid: {gone}" if line.startswith("pid:") else line for line in lines) + "\n")


def _popen(brain: Brain, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*AMBIENT, "--brain", str(brain.root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(brain.env),
    )


def _race(brain: Brain, *commands: tuple[str, ...]) -> list[int]:
    """Start every command at once (as several shells would); their exit codes."""
    procs = [_popen(brain, *args) for args in commands]
    for proc in procs:
        proc.communicate(timeout=60)
    return [proc.returncode for proc in procs]


# ---------------------------------------------------------------- claims


def test_claim_open_show_list_close(brain: Brain) -> None:
    """`ambient claim open|show|list|close`: a file under claims/, its inferred tier and zone shown, closed once."""
    res = brain.ok("claim", "open", "--type", "pilote", "--scope", "projets/feature/", "--agent", "coder")
    sess_id = res.out.strip()
    assert sess_id.startswith("sess-") and sess_id.endswith("-coder"), res
    assert brain.path(f"claims/{sess_id}.yml").is_file()
    _open(brain, "sess-sat", "projets/feature/a.md", "--parent", sess_id)

    shown = brain.ok("claim", "show", "sess-sat", "--json").json()
    assert shown["claim"]["status"] == "open"
    assert shown["claim"]["parent_satellite"] == sess_id
    assert shown["zone"] == "project"
    assert isinstance(shown["close_tier"], int)

    listed = {row["sess_id"]: row for row in brain.ok("claim", "list", "--json").json()}
    assert set(listed) == {sess_id, "sess-sat"}
    assert listed[sess_id]["type"] == "pilote"

    closed = brain.ok(
        "claim", "close", "sess-sat", "--status", "ok", "--files", "projets/feature/a.md", "--notes", "done"
    )
    assert "closed" in closed.out, closed
    on_disk = _claim(brain, "sess-sat")
    assert on_disk["status"] == "closed"
    assert on_disk["result"]["status"] == "ok"
    assert on_disk["result"]["files_modified"] == ["projets/feature/a.md"]
    assert [row["sess_id"] for row in brain.ok("claim", "list", "--status", "closed", "--json").json()] == ["sess-sat"]
    bogus = brain.cli("claim", "list", "--status", "done")  # a status no claim can have is an error, not "No claims."
    assert bogus.rc == 2 and "expected one of open" in bogus.err, bogus

    again = brain.cli("claim", "close", "sess-sat", "--status", "ok")
    assert again.rc == 2, again
    missing = brain.cli("claim", "show", "sess-nobody")
    assert missing.rc == 2, missing


def test_unknown_keys_survive_a_rewrite_and_inferred_fields_are_never_written(brain: Brain) -> None:
    """Claims are read with every field kept: unknown keys and values survive a rewrite; close_tier and zone are
    inferred, never written."""
    brain.write(
        "claims/sess-custom.yml",
        f"""
        sess_id: sess-custom
        type: satellite
        scope: projets/y/a.md
        agent: coder
        status: open
        opened_at: '{_ago(minutes=5)}'
        x_team: blue
        x_meta: {{owner: ana, tags: [a, b], nested: {{level: 3}}}}
        satellite_type: code
    """,
    )
    brain.ok("gate", "gate", "sess-custom", "please look")
    brain.ok("gate", "approve", "sess-custom")
    after = _claim(brain, "sess-custom")
    assert after["status"] == "open"
    assert after["x_team"] == "blue"
    assert after["x_meta"] == {"owner": "ana", "tags": ["a", "b"], "nested": {"level": 3}}
    assert after["satellite_type"] == "code"
    assert "close_tier" not in after and "zone" not in after
    shown = brain.ok("claim", "show", "sess-custom", "--json").json()
    assert shown["zone"] == "project" and isinstance(shown["close_tier"], int)


def test_a_malformed_claim_is_reported_with_file_line_and_never_rewritten(brain: Brain) -> None:
    """A malformed claim is reported (file:line) and never rewritten or deleted: not by the CLI, not by the daemon."""
    bad = brain.write("claims/sess-bad.yml", "sess_id: sess-bad\ntype: satellite\nscope: [unclosed\n  status: open\n")
    before = _digest(bad)
    _open(brain, "sess-good", "projets/x/")

    listed = brain.cli("claim", "list")
    assert listed.rc == 0, listed
    assert "sess-good" in listed.out
    assert "claims/sess-bad.yml:" in listed.err, listed

    validated = brain.cli("validate")
    assert validated.rc == 1, validated
    assert "claims/sess-bad.yml:" in validated.text

    for args in (
        ("gate", "gate", "sess-bad"),
        ("gate", "abort", "sess-bad"),
        ("claim", "close", "sess-bad", "--status", "ok"),
    ):
        res = brain.cli(*args)
        assert res.rc == 2, res
        assert "claims/sess-bad.yml:" in res.err, res

    status = brain.status()
    assert any("claims/sess-bad.yml:" in p for p in status["claims"]["problems"]), status["claims"]
    assert "unreadable" in brain.ok("status").out

    brain.config("tick_seconds: 0.2\nstale_claim_hours: 0.0001\n")
    with brain.daemon():
        wait(lambda: _status_of(brain, "sess-good") == "stale", "the daemon's stale-claims look")
    assert bad.exists() and _digest(bad) == before


def test_gate_approve_and_reject_append_to_gate_history(brain: Brain) -> None:
    """`ambient gate gate` (open → waiting_human), `approve` (→ open), `reject` (→ failed), each in gate_history."""
    _open(brain, "sess-a", "projets/a/")
    assert "open -> waiting_human" in brain.ok("gate", "gate", "sess-a", "is this right?").out
    assert _status_of(brain, "sess-a") == "waiting_human"
    brain.ok("gate", "approve", "sess-a", "yes")
    assert _status_of(brain, "sess-a") == "open"
    brain.ok("gate", "gate", "sess-a")
    brain.ok("gate", "reject", "sess-a", "no")
    assert _status_of(brain, "sess-a") == "failed"
    history = _claim(brain, "sess-a")["gate_history"]
    assert [(h["action"], h["from"], h["to"]) for h in history] == [
        ("gate", "open", "waiting_human"),
        ("approve", "waiting_human", "open"),
        ("gate", "open", "waiting_human"),
        ("reject", "waiting_human", "failed"),
    ]
    assert history[0]["message"] == "is this right?"
    assert history[3]["message"] == "no"
    status = brain.ok("gate", "status", "sess-a", "--json").json()
    assert status["status"] == "failed" and len(status["gate_history"]) == 4


def test_an_illegal_gate_transition_is_refused_and_changes_nothing(brain: Brain) -> None:
    """`ambient gate` refuses an illegal transition or an unknown claim with exit 2, and the claim is unchanged."""
    _open(brain, "sess-a", "projets/a/")
    path = brain.path("claims/sess-a.yml")
    before = _digest(path)
    for action in ("approve", "reject", "resume"):
        res = brain.cli("gate", action, "sess-a")
        assert res.rc == 2, res
        assert _digest(path) == before, action
    assert brain.cli("gate", "gate", "sess-nobody").rc == 2
    brain.ok("gate", "abort", "sess-a")
    before = _digest(path)
    for action in ("gate", "pause", "abort", "approve"):
        assert brain.cli("gate", action, "sess-a").rc == 2, action
    assert _digest(path) == before


def test_pause_cascades_and_resume_restores_only_what_it_paused(brain: Brain) -> None:
    """`pause` cascades to open/waiting children; `resume` resumes only the cascade-paused ones, each as it was."""
    _open(brain, "sess-p", "projets/p/", claim_type="pilote")
    for child in ("sess-c1", "sess-c2", "sess-c3", "sess-c4"):
        _open(brain, child, f"projets/p/{child}.md", "--parent", "sess-p")
    brain.ok("gate", "gate", "sess-c2")  # waiting for a person
    brain.ok("gate", "pause", "sess-c3")  # paused on its own
    brain.ok("claim", "close", "sess-c4", "--status", "ok")

    brain.ok("gate", "pause", "sess-p", "hold everything")
    assert {s: _status_of(brain, s) for s in ("sess-p", "sess-c1", "sess-c2", "sess-c3", "sess-c4")} == {
        "sess-p": "paused",
        "sess-c1": "paused",
        "sess-c2": "paused",
        "sess-c3": "paused",
        "sess-c4": "closed",
    }

    brain.ok("gate", "resume", "sess-p")
    assert {s: _status_of(brain, s) for s in ("sess-p", "sess-c1", "sess-c2", "sess-c3", "sess-c4")} == {
        "sess-p": "open",
        "sess-c1": "open",
        "sess-c2": "waiting_human",
        "sess-c3": "paused",
        "sess-c4": "closed",
    }
    c1 = _claim(brain, "sess-c1")["gate_history"]
    assert [h["action"] for h in c1] == ["pause", "resume"]
    assert all(h.get("cascade") == "sess-p" for h in c1)
    assert "resume" not in [h["action"] for h in _claim(brain, "sess-c3")["gate_history"]]


def test_abort_cascades_to_every_non_terminal_descendant(brain: Brain) -> None:
    """`abort` fails the claim and every non-terminal child (grandchildren too); closed ones stay closed."""
    _open(brain, "sess-p", "projets/p/", claim_type="pilote")
    _open(brain, "sess-c1", "projets/p/a/", "--parent", "sess-p")
    _open(brain, "sess-c2", "projets/p/b.md", "--parent", "sess-p")
    _open(brain, "sess-g1", "projets/p/a/x.md", "--parent", "sess-c1")
    _open(brain, "sess-done", "projets/p/c.md", "--parent", "sess-p")
    _open(brain, "sess-other", "projets/q/", claim_type="pilote")
    brain.ok("gate", "gate", "sess-c2")
    brain.ok("gate", "pause", "sess-g1")
    brain.ok("claim", "close", "sess-done", "--status", "ok")

    res = brain.ok("gate", "abort", "sess-p", "stop it")
    assert "cascade" in res.out
    assert {
        s: _status_of(brain, s) for s in ("sess-p", "sess-c1", "sess-c2", "sess-g1", "sess-done", "sess-other")
    } == {
        "sess-p": "failed",
        "sess-c1": "failed",
        "sess-c2": "failed",
        "sess-g1": "failed",
        "sess-done": "closed",
        "sess-other": "open",
    }
    last = _claim(brain, "sess-g1")["gate_history"][-1]
    assert (last["action"], last["from"], last["to"]) == ("abort", "paused", "failed")


def test_an_open_claim_past_its_ttl_becomes_stale(brain: Brain) -> None:
    """An open claim past its TTL (its own `ttl`, else stale_claim_hours) becomes `stale`; claims waiting for a person,
    or within their TTL, are left alone."""
    brain.config("tick_seconds: 0.2\n")
    claims = {
        "sess-old-ttl": ("open", _ago(hours=2), "ttl: 30m"),
        "sess-old-default": ("open", _ago(hours=30), ""),
        "sess-fresh": ("open", _ago(minutes=1), "ttl: 4h"),
        "sess-waiting": ("waiting_human", _ago(days=3), "ttl: 30m"),
    }
    for sid, (status, opened, extra) in claims.items():
        brain.write(
            f"claims/{sid}.yml",
            f"sess_id: {sid}\ntype: satellite\nscope: projets/{sid}/\nagent: coder\n"
            f"status: {status}\nopened_at: '{opened}'\n{extra}\n",
        )
    with brain.daemon():
        wait(
            lambda: _status_of(brain, "sess-old-ttl") == "stale" and _status_of(brain, "sess-old-default") == "stale",
            "the two old open claims to become stale",
        )
    assert _status_of(brain, "sess-fresh") == "open"
    assert _status_of(brain, "sess-waiting") == "waiting_human"
    assert _claim(brain, "sess-old-ttl")["gate_history"][-1]["to"] == "stale"
    assert [r["sess_id"] for r in brain.ok("claim", "list", "--status", "stale", "--json").json()] == [
        "sess-old-default",
        "sess-old-ttl",
    ]


def test_status_reads_claims_and_sees_every_change(brain: Brain) -> None:
    """`ambient status` counts claims from claims/ and sees a file that changed (even in place, same size), whether
    its index .ambient/claims-index.json is there, missing or torn."""
    for sid in ("sess-1", "sess-2", "sess-3"):
        _open(brain, sid, f"projets/{sid}/")
    brain.ok("gate", "pause", "sess-3")
    assert "Open claims: 3" in brain.ok("status").out  # paused claims still count as open work

    path = brain.path("claims/sess-3.yml")
    text = path.read_text()
    assert "status: paused" in text
    with path.open("r+") as fh:  # an edit in place: same inode, same size
        fh.write(text.replace("status: paused", "status: closed"))
    assert brain.status()["claims"]["open"] == 2

    brain.ok("claim", "close", "sess-2", "--status", "ok")
    index = brain.path(".ambient/claims-index.json")  # the claim store's census; status reads its query store
    index.unlink(missing_ok=True)
    assert brain.status()["claims"]["open"] == 1
    index.write_text('{"format": 1, "files": {"sess-1.yml": [[1, 2, 3')
    assert brain.status()["claims"]["open"] == 1
    _open(brain, "sess-4", "projets/sess-4/")
    assert brain.status()["claims"]["open"] == 2
    assert [r["sess_id"] for r in brain.ok("claim", "list", "--status", "open", "--json").json()] == [
        "sess-1",
        "sess-4",
    ]


def test_for_each_items_and_chain_steps_each_have_a_claim(brain: Brain) -> None:
    """Each for_each item and each chain step has its own claim, a child of its run's claim, closed with its result."""
    for name in ("worker", "coder", "tester"):
        brain.python_agent(name, OK_AGENT)
    brain.workflow(
        "fan",
        """
        workflow: fan
        for_each:
          items: [a, b, c]
          spawn: worker
          scope: {zone: project, files: ["workspace/fan/{{item}}.md"]}
    """,
    )
    brain.workflow(
        "ch",
        """
        name: ch
        chain:
          - {step: 1, type: brain-write, scope: projets/ch/, agents: [coder]}
          - {step: 2, type: brain-write, scope: projets/ch/README.md, agents: [tester]}
    """,
    )
    brain.until_idle()
    [fan] = brain.finished("fan")
    [ch] = brain.finished("ch")
    claims = {row["sess_id"]: row for row in brain.ok("claim", "list", "--json").json()}

    fan_children = {sid: c for sid, c in claims.items() if c.get("parent_satellite") == fan["run_id"]}
    assert fan["run_id"] in claims
    assert sorted(c["scope"] for c in fan_children.values()) == [
        "workspace/fan/a.md",
        "workspace/fan/b.md",
        "workspace/fan/c.md",
    ]
    assert all(c["agent"] == "worker" and c["status"] == "closed" for c in fan_children.values())
    for sid in fan_children:
        assert _claim(brain, sid)["result"]["status"] == "ok"

    ch_children = {sid: c for sid, c in claims.items() if c.get("parent_satellite") == ch["run_id"]}
    assert ch["run_id"] in claims
    assert sorted((str(c["workflow_step"]), c["agent"], c["scope"]) for c in ch_children.values()) == [
        ("1", "coder", "projets/ch/"),
        ("2", "tester", "projets/ch/README.md"),
    ]
    assert all(c["status"] == "closed" for c in ch_children.values())
    assert claims[fan["run_id"]]["status"] == claims[ch["run_id"]]["status"] == "closed"


def test_status_of_a_waiting_run_shows_its_items_from_their_claims(brain: Brain) -> None:
    """`ambient status WORKFLOW` shows the fan-out item by item; the waiting item's claim waits for the person."""
    brain.python_agent(
        "worker",
        """
        import json, os, sys
        json.load(sys.stdin)
        sys.exit(1 if os.environ["AMBIENT_ITEM"] == "b" else 0)
    """,
    )
    brain.workflow(
        "fan",
        """
        workflow: fan
        for_each:
          items: [a, b]
          spawn: worker
          scope: {zone: project, files: ["workspace/fan/{{item}}.md"]}
    """,
    )
    brain.until_idle()
    [run] = brain.ok("status", "fan", "--json").json()["runs"]
    items = {it["name"]: it for it in run["items"]}
    assert items["a"]["status"] == "done", items
    assert items["b"]["status"] == "escalated" and items["b"]["escalation"], items
    item_claims = {
        c["scope"]: c["status"]
        for c in brain.ok("claim", "list", "--json").json()
        if c.get("parent_satellite") == run["run_id"]
    }
    assert item_claims == {"workspace/fan/a.md": "closed", "workspace/fan/b.md": "waiting_human"}


# ---------------------------------------------------------------- locks


def test_lock_acquire_check_release_exit_codes(brain: Brain) -> None:
    """`ambient lock acquire` 0 ok / 1 held by another; `check` 0 free / 1 held; `release` 0 / 2 refused."""
    file = "projets/x/a.md"
    assert brain.cli("lock", "check", file).rc == 0
    got = brain.cli("lock", "acquire", file, "sess-A")
    assert got.rc == 0, got
    assert brain.path("locks/projets%2Fx%2Fa.md.lock").is_file()
    lock = yaml.safe_load(brain.read("locks/projets%2Fx%2Fa.md.lock"))
    for key in ("holder", "instance", "pid", "pid_start_time", "token", "expires_at"):
        assert key in lock, lock
    assert lock["holder"] == "sess-A"

    held = brain.cli("lock", "acquire", file, "sess-B")
    assert held.rc == 1, held
    assert "sess-A" in held.text
    again = brain.cli("lock", "acquire", file, "sess-A")
    assert again.rc == 0, again  # the holder refreshes its own lock
    checked = brain.cli("lock", "check", file)
    assert checked.rc == 1 and "sess-A" in checked.out, checked
    assert [row["file"] for row in brain.ok("lock", "list", "--json").json()] == [file]

    refused = brain.cli("lock", "release", file, "sess-B")
    assert refused.rc == 2, refused
    assert _holder(brain, file) == "sess-A"
    assert brain.cli("lock", "release", file, "sess-A").rc == 0
    assert brain.cli("lock", "check", file).rc == 0
    assert brain.cli("lock", "release", file, "sess-A").rc == 2
    assert brain.ok("lock", "list", "--json").json() == []
    bad = brain.cli("lock", "acquire", "../outside.md", "sess-A")
    assert bad.rc == 2, bad


def test_two_contenders_never_both_win(brain: Brain) -> None:
    """Two (here six) contenders for one free lock: exactly one wins, the others are told it is held (exit 1)."""
    codes = _race(brain, *[("lock", "acquire", "projets/race.md", f"sess-{n}") for n in range(6)])
    assert sorted(codes) == [0, 1, 1, 1, 1, 1], codes
    winner = f"sess-{codes.index(0)}"
    assert _holder(brain, "projets/race.md") == winner


@pytest.mark.slow
def test_an_expired_lock_goes_to_one_contender_and_its_old_holder_cannot_release_or_write(brain: Brain) -> None:
    """Even for the same expired lock two contenders never both win; a release never deletes a successor's lock;
    claim writes carry the fencing token, so the holder whose lease ran out cannot write."""
    _open(brain, "sess-old", "projets/race/")
    old = brain.ok("lock", "acquire", "projets/race/a.md", "sess-old", "--ttl", "0.001", "--json")
    old_token = str(json.loads(old.out)["token"])
    brain.ok("gate", "gate", "sess-old", "--token", old_token)  # a write made under the lock, while it was valid
    wait(lambda: _lock_state(brain, "projets/race/a.md") == "expired", "the lock to expire", timeout=20)

    codes = _race(brain, *[("lock", "acquire", "projets/race/a.md", f"sess-new{n}") for n in range(4)])
    assert sorted(codes) == [0, 1, 1, 1], codes
    winner = f"sess-new{codes.index(0)}"
    assert _holder(brain, "projets/race/a.md") == winner
    new_token = str(_lock_json(brain, "projets/race/a.md")["info"]["token"])
    assert int(new_token) > int(old_token)

    assert brain.cli("lock", "release", "projets/race/a.md", "sess-old").rc == 2
    assert brain.cli("lock", "release", "projets/race/a.md", winner, "--token", old_token).rc == 2
    assert _holder(brain, "projets/race/a.md") == winner

    brain.ok("gate", "approve", "sess-old", "--token", new_token)
    path = brain.path("claims/sess-old.yml")
    before = _digest(path)
    late = brain.cli("gate", "pause", "sess-old", "--token", old_token)
    assert late.rc == 2, late
    assert "token" in late.err
    assert _digest(path) == before


def test_a_folder_lock_keeps_out_what_is_in_the_folder_and_the_folders_above(brain: Brain) -> None:
    """`workspace/dir/` held by one: `lock check workspace/dir/a.md` said free, and another holder was granted
    `workspace/dir/a.md` and `workspace/` (a daemon's run took files under a folder a person held). A folder lock
    guards what is in it: those are refused to others (exit 1, naming the folder's holder), granted to its own
    holder, and free again once it is released."""
    brain.ok("lock", "acquire", "workspace/dir/", "owner1")
    check = brain.cli("lock", "check", "workspace/dir/a.md")
    assert check.rc == 1 and "owner1" in check.text, check
    for path in ("workspace/dir/a.md", "workspace/", "workspace/dir/sub/"):
        res = brain.cli("lock", "acquire", path, "owner2")
        assert res.rc == 1 and "owner1" in res.text, (path, res)
    assert brain.cli("lock", "acquire", "workspace/dir/a.md", "owner1").rc == 0  # its own holder
    assert brain.cli("lock", "acquire", "workspace/other.md", "owner2").rc == 0  # beside it: no conflict
    brain.ok("lock", "release", "workspace/dir/a.md", "owner1")
    brain.ok("lock", "release", "workspace/dir/", "owner1")
    assert brain.cli("lock", "acquire", "workspace/dir/a.md", "owner2").rc == 0
    held = brain.cli("lock", "acquire", "workspace/dir/", "owner3")  # a file under it is held by another
    assert held.rc == 1 and "owner2" in held.text, held


def test_a_fencing_token_never_granted_is_refused_and_locks_no_holder_out(brain: Brain) -> None:
    """`--token 999999999999999999` on a claim was accepted (exit 0) and raised its fence above every real token:
    the lock's holder was then refused with a false "this holder's lock expired and was taken over". A token no
    lock was granted is refused (exit 2, nothing written); the holder's own token still writes."""
    _open(brain, "sess-ft", "projets/ft/")
    got = brain.ok("lock", "acquire", "projets/ft/a.md", "sess-ft", "--json")
    token = str(json.loads(got.out)["token"])
    path = brain.path("claims/sess-ft.yml")
    before = _digest(path)
    forged = brain.cli("gate", "pause", "sess-ft", "p", "--token", "999999999999999999")
    assert forged.rc == 2 and "was never granted" in forged.err, forged
    assert _digest(path) == before
    closed = brain.cli("claim", "close", "sess-ft", "--status", "ok", "--token", token)
    assert closed.rc == 0, closed


def test_a_lock_or_a_claim_through_a_symlink_out_of_the_brain_is_refused_or_said(brain: Brain, tmp_path: Path) -> None:
    """`workspace/link -> /tmp/...`: `lock acquire workspace/link/x.md` is refused (exit 2) as `preflight check`
    refuses that path, and `claim open --scope workspace/link/` says the scope leaves the brain, as it says of
    `/etc/passwd`; a negative `--wait` is bad usage."""
    outside = tmp_path / "outside"
    outside.mkdir()
    brain.path("workspace").mkdir(exist_ok=True)
    brain.path("workspace/link").symlink_to(outside)
    res = brain.cli("lock", "acquire", "workspace/link/x.md", "me")
    assert res.rc == 2 and "resolves outside the brain root" in res.err, res
    assert not list(brain.path("locks").glob("workspace%2Flink*"))
    opened = brain.cli("claim", "open", "--type", "satellite", "--scope", "workspace/link/", "--agent", "coder")
    assert "resolves outside the brain root" in opened.err, opened
    assert brain.cli("lock", "acquire", "workspace/a.md", "me", "--wait", "-1").rc == 2


def test_status_counts_a_claim_read_with_a_warning_as_open_not_unreadable(brain: Brain) -> None:
    """A claim another tool wrote with a type ambient does not know is read (with a warning): `ambient status`
    counted it "unreadable" while `claim list` listed it; it is open, and the warning is counted as one."""
    _open(brain, "sess-odd", "work/odd/")
    odd = brain.path("claims/sess-odd.yml")
    odd.write_text(odd.read_text().replace("type: satellite", "type: bespoke"))  # as another tool may write it
    assert "warning" in brain.cli("validate").out
    text = brain.ok("status").out
    assert "Open claims: 1 (1 warning(s): ambient validate)" in text and "unreadable" not in text, text
    brain.write("claims/sess-broken.yml", "sess_id: [\n")
    assert "(1 unreadable)" in brain.ok("status").out


def test_bad_input_to_claim_open_close_and_rules_optin_exits_2_and_writes_nothing(brain: Brain) -> None:
    """cli.md: exit 2 is bad usage or bad input. `claim open --ttl bogus`, `--type bogus` and a scope outside the
    brain, `claim close --tests-total -5` and `rules optin --workflow nope` were taken (exit 0, a warning or not
    even that); each is refused now and nothing is written."""
    before = sorted(p.name for p in brain.path("claims").iterdir())
    for extra in (["--ttl", "bogus"], ["--type", "bogus"], ["--scope", "/etc/passwd"]):
        args = {"--type": "satellite", "--scope": "work/x/", **dict(zip(extra[::2], extra[1::2], strict=True))}
        flat = [w for kv in args.items() for w in kv]
        res = brain.cli("claim", "open", *flat, "--agent", "coder")
        assert res.rc == 2 and "not opened" in res.err and "kept as written" not in res.err, (extra, res)
    assert sorted(p.name for p in brain.path("claims").iterdir()) == before
    _open(brain, "sess-counted", "work/y/")
    bad = brain.cli("claim", "close", "sess-counted", "--status", "ok", "--tests-total", "-5")
    assert bad.rc == 2 and "0 or more" in bad.err, bad
    assert _claim(brain, "sess-counted")["status"] == "open"
    nope = brain.cli("rules", "optin", "--workflow", "nope")
    assert nope.rc == 2 and "no workflow named 'nope'" in nope.err, nope


def test_lock_acquire_json_is_json_on_a_takeover(brain: Brain) -> None:
    """`ambient lock acquire --json` prints the grant as JSON, also when it takes over a lock whose holder died."""
    lock = brain.ok("lock", "acquire", "projets/a.md", "sess-old", "--json").json()
    _held_by_a_dead_process(brain, "projets/a.md")
    assert _lock_state(brain, "projets/a.md") == "dead"
    res = brain.cli("lock", "acquire", "projets/a.md", "sess-new", "--json")
    assert res.rc == 0, res
    assert res.json()["holder"] == "sess-new"
    assert res.json()["token"] > lock["token"]


def test_lock_wait_gets_the_lock_once_it_is_released(brain: Brain) -> None:
    """`ambient lock acquire --wait SECONDS` waits for a held lock and gets it once the holder releases it."""
    brain.ok("lock", "acquire", "projets/w.md", "sess-A")
    started = time.monotonic()
    waiter = _popen(brain, "lock", "acquire", "projets/w.md", "sess-B", "--wait", "30")
    # still there 1.5 s later, the lock still A's: it waits (a refusal would have exited at once)
    wait(lambda: waiter.poll() is not None or time.monotonic() - started > 1.5, "the waiter to start waiting")
    assert waiter.poll() is None and _holder(brain, "projets/w.md") == "sess-A"
    brain.ok("lock", "release", "projets/w.md", "sess-A")
    waiter.communicate(timeout=40)
    assert waiter.returncode == 0
    assert _holder(brain, "projets/w.md") == "sess-B"
    short = brain.cli("lock", "acquire", "projets/w.md", "sess-C", "--wait", "0.5")
    assert short.rc == 1, short


def test_a_dead_holder_is_detected_by_pid_and_start_time(brain: Brain, tmp_path: Path) -> None:
    """A lock held for an agent by a daemon killed with -9 is dead (free at once to a contender); a lock whose pid is
    alive but whose process started at another time (a recycled pid) is dead too."""
    go = tmp_path / "go"
    brain.python_agent(
        "slow",
        f"""
        import json, pathlib, sys, time
        json.load(sys.stdin)
        pathlib.Path({str(tmp_path / "started")!r}).write_text("x")
        end = time.monotonic() + 60
        while not pathlib.Path({str(go)!r}).exists() and time.monotonic() < end:
            time.sleep(0.05)
        print(json.dumps({{"status": "ok"}}))
    """,
    )
    brain.workflow(
        "hold",
        """
        workflow: hold
        for_each:
          items: [a, b]
          spawn: slow
          concurrency: 2
          scope: {zone: project, files: ["workspace/hold/{{item}}.md"]}
    """,
    )
    try:
        with brain.daemon() as daemon:
            wait(
                lambda: (
                    _lock_state(brain, "workspace/hold/a.md") == "held"
                    and _lock_state(brain, "workspace/hold/b.md") == "held"
                ),
                "both item locks held",
            )
            assert brain.cli("lock", "check", "workspace/hold/a.md").rc == 1
            assert brain.cli("lock", "acquire", "workspace/hold/a.md", "intruder").rc == 1

            # the same live pid, another start time: what a recycled pid looks like
            path = brain.path("locks/workspace%2Fhold%2Fb.md.lock")
            lines = path.read_text().splitlines()
            lines = [
                f"pid_start_time: {float(line.split(':', 1)[1]) - 1000:.2f}"
                if line.startswith("pid_start_time:")
                else line
                for line in lines
            ]
            path.write_text("\n".join(lines) + "\n")
            assert _lock_state(brain, "workspace/hold/b.md") == "dead"
            assert brain.cli("lock", "check", "workspace/hold/b.md").rc == 0

            daemon.kill()
            assert _lock_state(brain, "workspace/hold/a.md") == "dead"
            assert brain.cli("lock", "check", "workspace/hold/a.md").rc == 0
            taken = brain.cli("lock", "acquire", "workspace/hold/a.md", "intruder")
            assert taken.rc == 0, taken
            assert _holder(brain, "workspace/hold/a.md") == "intruder"
    finally:
        go.write_text("go")


@pytest.mark.slow
def test_lock_cleanup_removes_expired_and_dead_locks_only(brain: Brain) -> None:
    """`ambient lock list` shows each lock's state; `ambient lock cleanup` removes expired and dead-holder locks and
    keeps held ones."""
    brain.ok("lock", "acquire", "projets/held.md", "sess-live")
    brain.ok("lock", "acquire", "projets/dead.md", "sess-dead")
    _held_by_a_dead_process(brain, "projets/dead.md")
    _expire_soon(brain, "projets/expired.md", "sess-late")
    states = {row["file"]: row["state"] for row in brain.ok("lock", "list", "--json").json()}
    assert states == {"projets/held.md": "held", "projets/dead.md": "dead", "projets/expired.md": "expired"}
    brain.ok("lock", "cleanup")
    assert {row["file"]: row["state"] for row in brain.ok("lock", "list", "--json").json()} == {
        "projets/held.md": "held"
    }
    assert sorted(p.name for p in brain.path("locks").iterdir() if not p.name.startswith(".")) == [
        "projets%2Fheld.md.lock"
    ]


def test_a_symlinked_lock_is_never_followed(brain: Brain, tmp_path: Path) -> None:
    """Symlinks are never followed: a lock file that is a symlink is not read through, and its target is untouched."""
    target = tmp_path / "elsewhere.yml"
    target.write_text("file: projets/s.md\nholder: sess-fake\nexpires_at: '2999-01-01T00:00:00+00:00'\n")
    before = _digest(target)
    brain.path("locks").mkdir(exist_ok=True)
    os.symlink(target, brain.path("locks/projets%2Fs.md.lock"))
    checked = brain.cli("lock", "check", "projets/s.md", "--json")
    assert "sess-fake" not in checked.out, checked
    assert brain.cli("lock", "acquire", "projets/s.md", "sess-me").rc in (1, 2)
    brain.cli("lock", "cleanup")
    assert _digest(target) == before


# ---------------------------------------------------------------- pre-flight and the breaker


@pytest.mark.slow
def test_preflight_check_exit_codes(brain: Brain) -> None:
    """`ambient preflight check SESS_ID FILE`: 0 go, 1 scope, 2 locked, 3 breaker, 4 claim, 5 zone, 6 branch."""
    _open(brain, "sess-go", "projets/x/")
    _open(brain, "sess-render", "profil/", "--mode", "rendering")
    _open(brain, "sess-branch", "projets/z/", "--theme-branch", "theme/z")
    _open(brain, "sess-tripped", "projets/t/")
    brain.ok("lock", "acquire", "projets/x/locked.md", "sess-other")
    for _ in range(3):
        brain.cli("preflight", "fail", "projets/t/")
    _open(brain, "sess-parent", "projets/p/", claim_type="pilote")
    _open(brain, "sess-child", "projets/p/a.md", "--parent", "sess-parent")
    brain.ok("gate", "pause", "sess-parent")

    cases = [
        ("sess-go", "projets/x/a.md", 0, None),
        ("sess-go", "projets/y/a.md", 1, "scope"),
        ("sess-go", "../etc/passwd", 1, "scope"),
        ("sess-go", "projets/x/locked.md", 2, "locked"),
        ("sess-tripped", "projets/t/a.md", 3, "breaker"),
        ("sess-child", "projets/p/a.md", 4, "claim"),
        ("sess-nobody", "projets/x/a.md", 4, "claim"),
        ("sess-render", "profil/x.md", 5, "zone"),
        ("sess-branch", "projets/z/a.md", 6, "branch"),
    ]
    for sess_id, file, code, check in cases:
        res = brain.cli("preflight", "check", sess_id, file, "--json")
        assert res.rc == code, res
        if check is not None:
            assert check in [p["check"] for p in res.json()], res


def test_preflight_branch_check_passes_on_the_theme_branch(brain: Brain) -> None:
    """Pre-flight's branch check (6) passes when the brain's git repository is on the claim's theme branch."""
    _open(brain, "sess-branch", "projets/z/", "--theme-branch", "theme/z")
    git = subprocess.run(
        ["git", "init", "-q", "-b", "theme/z", str(brain.root)], capture_output=True, text=True, check=False
    )
    if git.returncode != 0:
        pytest.skip(f"git init failed: {git.stderr}")
    assert brain.cli("preflight", "check", "sess-branch", "projets/z/a.md").rc == 0
    subprocess.run(["git", "-C", str(brain.root), "checkout", "-q", "-b", "main"], check=True)
    assert brain.cli("preflight", "check", "sess-branch", "projets/z/a.md").rc == 6


def test_preflight_breaker_fail_reset_status(brain: Brain) -> None:
    """`ambient preflight fail|reset|status`: three consecutive failures trip the breaker (exit 3), only a reset
    clears it."""
    _open(brain, "sess-a", "projets/a/")
    assert brain.cli("preflight", "status", "projets/a/").rc == 0
    assert brain.cli("preflight", "fail", "sess-a").rc == 0
    assert brain.cli("preflight", "fail", "projets/a/").rc == 0
    tripped = brain.cli("preflight", "fail", "sess-a")
    assert tripped.rc == 3, tripped
    status = brain.cli("preflight", "status", "projets/a/")
    assert status.rc == 3 and "TRIPPED" in status.out.upper(), status
    assert brain.cli("preflight", "check", "sess-a", "projets/a/x.md").rc == 3
    brain.ok("preflight", "reset", "projets/a/")
    assert brain.cli("preflight", "status", "sess-a").rc == 0
    assert brain.cli("preflight", "check", "sess-a", "projets/a/x.md").rc == 0


def test_preflight_trips_at_the_configured_breaker_threshold(brain: Brain) -> None:
    """`breaker_threshold: 5` in profil/ambient.yml is the threshold of `ambient preflight` too (no flag needed)."""
    brain.config("breaker_threshold: 5\n")
    _open(brain, "sess-a", "projets/a/")
    assert [brain.cli("preflight", "fail", "sess-a").rc for _ in range(5)] == [0, 0, 0, 0, 3]
    assert [brain.cli("preflight", "fail", "projets/b/", "--threshold", "2").rc for _ in range(2)] == [0, 3]


def test_doctor_and_validate_read_claims_and_change_nothing(brain: Brain) -> None:
    """`ambient doctor` and `ambient validate` use the claims index but never write it: they change nothing; `ambient
    status` reads its own query store (.ambient/query.sqlite3), which it keeps."""
    _open(brain, "sess-1", "projets/a/")
    brain.write(
        "claims/sess-old.yml",
        f"sess_id: sess-old\ntype: satellite\nscope: projets/o/\nagent: coder\n"
        f"status: open\nopened_at: '{_ago(hours=30)}'\n",
    )
    brain.write("claims/sess-bad.yml", "sess_id: [broken\n")
    index = brain.path(".ambient/claims-index.json")
    brain.status()
    index.unlink(missing_ok=True)
    before = _tree_digest(brain.root)
    doctor = brain.cli("doctor")
    assert "sess-old" in doctor.out and "claims/sess-bad.yml:" in doctor.out, doctor
    assert brain.cli("validate").rc == 1
    brain.cli("doctor", "--json")
    assert _tree_digest(brain.root) == before
    assert not index.exists()
    assert brain.status()["claims"]["open"] == 2
    assert brain.path(".ambient/query.sqlite3").exists()


def test_runs_last_n_shows_the_newest_runs(brain: Brain) -> None:
    """`ambient runs --last N` shows the newest N finished runs (runs.jsonl read from its end)."""
    brain.python_agent("worker", OK_AGENT)
    for name in ("one", "two", "three"):
        brain.workflow(
            name,
            f"""
            workflow: {name}
            for_each:
              items: [a]
              spawn: worker
              scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}
        """,
        )
    brain.until_idle()
    everything = brain.runs()["finished"]
    assert len(everything) == 3
    last = brain.ok("runs", "--last", "2", "--json").json()["finished"]
    assert [r["run_id"] for r in last] == [r["run_id"] for r in everything[-2:]]


def test_an_items_claim_keeps_a_partial_result(brain: Brain) -> None:
    """An item whose agent answers `{"status": "partial"}` closes its claim with result.status partial."""
    brain.python_agent(
        "halfway",
        """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps({"status": "partial", "note": "two of three pages"}))
    """,
    )
    brain.workflow(
        "pages",
        """
        workflow: pages
        for_each: {items: [one], spawn: halfway}
    """,
    )
    brain.until_idle()
    [claim] = [yaml.safe_load(p.read_text()) for p in brain.path("claims").glob("*-item-001.yml")]
    assert claim["status"] == "closed" and claim["result"]["status"] == "partial", claim


@pytest.mark.parametrize(("action", "outcome"), [("approve", "success"), ("reject", "aborted")])
def test_gate_approve_on_a_chain_steps_claim_answers_its_run(brain: Brain, action: str, outcome: str) -> None:
    """A chain's `gate: human` step waits as a claim in waiting_human and as a question: `ambient gate approve` on
    that claim is the same answer as `ambient decide`, and the run goes on (it was: the claim opened, the run stayed
    waiting)."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: projets/app/README.md, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    [run] = brain.status()["runs"]
    claim = f"{run['run_id']}-step-2"
    res = brain.ok("gate", action, claim, "from the gate command")
    assert esc["id"] in res.out, res
    brain.until_idle()
    [record] = brain.finished("ship")
    assert record["outcome"] == outcome, record
    assert brain.escalations() == []
    assert brain.cli("decide", esc["id"], "approve").rc == 1  # already answered


# ---------------------------------------------------------------- aborting a run through its claim

#: An agent for a fan-out: ``one`` asks the person, ``two`` works until stopped (it leaves ``work/started-two`` as it
#: starts and ``work/done-two`` only if it ever ends by itself), any other answers ok.
_ASK_WORK_OK = """
    import json, os, pathlib, sys, time
    json.load(sys.stdin)
    item = os.environ["AMBIENT_ITEM"]
    work = pathlib.Path(os.environ["AMBIENT_BRAIN"]) / "work"
    work.mkdir(exist_ok=True)
    if item == "one":
        print(json.dumps({"signal": "ESCALATE", "options": ["go", "stop"], "question": "go on?"}))
    elif item == "two":
        (work / "started-two").write_text("")
        time.sleep(120)
        (work / "done-two").write_text("")
        print(json.dumps({"status": "ok"}))
    else:
        print(json.dumps({"status": "ok"}))
"""


#: Every item asks the person.
_ALL_ASK = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"signal": "ESCALATE", "options": ["go", "stop"], "question": "go on?"}))
"""


def _fan(brain: Brain, items: str, concurrency: int, agent: str = _ASK_WORK_OK) -> None:
    brain.python_agent("asker", agent, timeout_s=300)
    brain.workflow(
        "fan",
        f"""
        workflow: fan
        for_each:
          items: [{items}]
          spawn: asker
          concurrency: {concurrency}
          scope: {{zone: project, files: ["work/fan/{{{{item}}}}.txt"]}}
    """,
    )


def _claim_statuses(brain: Brain, run_id: str) -> dict[str, str]:
    return {p.stem: str(yaml.safe_load(p.read_text())["status"]) for p in brain.path("claims").glob(f"{run_id}*.yml")}


def test_gate_abort_on_a_runs_claim_aborts_the_run(brain: Brain) -> None:
    """`ambient gate abort` on the claim of a run aborts the run, as an ABORT packet does: its running agent is
    stopped, its unfinished items aborted, its waiting question cancelled saying why, the run ends `aborted`, and
    its claims say `failed` for good (they once went `failed` while the run ran on, ended `success` and were
    rewritten `closed`)."""
    _fan(brain, "one, two", concurrency=2)
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        wait(lambda: brain.path("work/started-two").exists(), "item two's agent at work")
        [run] = brain.status()["runs"]
        run_id = run["run_id"]
        res = brain.ok("gate", "abort", run_id, "wrong release")
        assert "abort" in res.out and run_id in res.out, res
        [record] = brain.wait_finished("fan")
        assert record["outcome"] == "aborted", record
        daemon.wait_log("escalation_cancelled", escalation=esc["id"])
    assert not brain.path("work/done-two").exists()  # its agent was stopped, not left to finish
    cancelled = {e["id"]: e for e in brain.escalations(all=True)}[esc["id"]]
    assert cancelled["status"] == "cancelled" and "wrong release" in (cancelled.get("note") or ""), cancelled
    late = brain.decide(esc["id"], "go")
    assert late.rc == 1 and "wrong release" in late.err, late
    assert brain.escalations() == []
    statuses = _claim_statuses(brain, run_id)
    assert set(statuses.values()) == {"failed"} and len(statuses) == 3, statuses
    brain.until_idle()  # a later start rewrites nothing back
    assert _claim_statuses(brain, run_id) == statuses
    assert [r["outcome"] for r in brain.finished("fan")] == ["aborted"]


def test_what_a_run_in_progress_would_not_apply_to_its_claims_is_refused_not_lost(brain: Brain) -> None:
    """`gate pause|gate|resume` and `claim close` on the claims of a run ambient is running were said done (exit 0)
    while the run went on, ended `success` and rewrote those claims, the person's `gate_history` gone with them.
    Refused now (exit 2, nothing written), naming what the run does take: `ambient gate abort` and the answers to
    its questions; a claim that is no run's still moves as before."""
    _fan(brain, "one, two", concurrency=2)
    with brain.daemon():
        brain.wait_escalation()
        wait(lambda: brain.path("work/started-two").exists(), "item two's agent at work")
        [run] = brain.status()["runs"]
        run_id = run["run_id"]
        item = next(p.stem for p in brain.path("claims").glob(f"{run_id}-item-*.yml"))
        for args in (
            ("gate", "pause", run_id, "wait a sec"),
            ("gate", "gate", run_id),
            ("gate", "pause", item),
            ("claim", "close", item, "--status", "failed", "--message", "by hand"),
        ):
            res = brain.cli(*args)
            assert res.rc == 2, (args, res)
            assert f"ambient gate abort {run_id}" in res.err and "ambient decide" in res.err, (args, res)
        for path in brain.path("claims").glob(f"{run_id}*.yml"):  # nothing of the refused actions written
            text = path.read_text()
            assert "paused" not in text and "wait a sec" not in text and "by hand" not in text, (path, text)
        brain.ok("gate", "abort", run_id, "called off")  # what the run does take
        [record] = brain.wait_finished("fan")
    assert record["outcome"] == "aborted", record
    _open(brain, "sess-by-hand", "work/hand/")
    assert "paused" in brain.ok("gate", "pause", "sess-by-hand", "mine").out


def test_gate_abort_with_the_daemon_down_is_applied_when_it_starts(brain: Brain) -> None:
    """With no daemon running the abort is kept (as an answer is) and applied when the daemon starts: the run
    ends `aborted` without its waiting items running again."""
    _fan(brain, "one, two, three", concurrency=1, agent=_ALL_ASK)
    brain.until_idle()
    [run] = brain.status()["runs"]
    run_id = run["run_id"]
    res = brain.ok("gate", "abort", run_id, "not today")
    assert "when the daemon starts" in res.out, res
    brain.until_idle()
    [record] = brain.finished("fan")
    assert record["outcome"] == "aborted", record
    assert [s["attempt"] for s in record["steps"]] == [1, 1, 1], record  # none ran again
    assert brain.escalations() == []
    assert set(_claim_statuses(brain, run_id).values()) == {"failed"}


def test_gate_abort_on_a_claim_that_is_no_run_keeps_cascading_on_claims(brain: Brain) -> None:
    """A claim that is no run's (opened by hand) is aborted as before: it and its open children fail."""
    _open(brain, "sess-hand", "projets/app/", claim_type="pilote")
    res = brain.ok("gate", "abort", "sess-hand", "by hand")
    assert "sess-hand: open -> failed" in res.out, res
    assert _status_of(brain, "sess-hand") == "failed"
