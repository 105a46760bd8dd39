"""docs/ipc-kernel.md: packets through `ambient send`, the access matrix and `ambient matrix explain`, the
routing table, zones and identity, as a person (or an agent ambient spawned) meets them."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import PROJECT_GATE, Brain, Result, agent_md, wait

# ---------------------------------------------------------------- helpers

CHECKPOINT = {"from": "human", "to": "bsi", "signal": "CHECKPOINT", "payload": {"context": {"note": "halfway"}}}
AGENT_OK = """
    import json, sys
    json.load(sys.stdin)
    print(json.dumps({"status": "ok"}))
"""


def _send(brain: Brain, packet: dict[str, Any] | str, *, env: dict[str, str] | None = None) -> Result:
    raw = packet if isinstance(packet, str) else json.dumps(packet)
    return brain.cli("send", "--json", input=raw, env=env)


def _audit(brain: Brain) -> list[dict[str, Any]]:
    """The audit log's records, batches unfolded into one record per packet."""
    path = brain.root / ".ambient" / "audit.jsonl"
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("status") == "batch":
            out += [dict(zip(rec["fields"], row, strict=False)) for row in rec["packets"]]
        else:
            out.append(rec)
    return out


def _audited(brain: Brain, **match: Any) -> list[dict[str, Any]]:
    return [r for r in _audit(brain) if all(r.get(k) == v for k, v in match.items())]


def _routing(brain: Brain, text: str) -> None:
    """Write profil/routing.yml; its first line is `version: 1` (line numbers in messages count from it)."""
    brain.write("profil/routing.yml", textwrap.dedent(text).lstrip("\n"))


def _explain(brain: Brain, *args: str) -> Result:
    return brain.cli("matrix", "explain", *args)


def _agent(brain: Brain, name: str, gate: dict[str, Any]) -> None:
    brain.python_agent(name, AGENT_OK, gate=gate)


PROJECT = {
    "receives_from": ["orchestrator", "human", "ambient"],
    "sends_to": ["orchestrator", "human", "ambient"],
    "zone_access": ["project"],
    "signals": ["RETURN", "ERROR", "ESCALATE", "BLOCKED_ON"],
}


# ---------------------------------------------------------------- ambient send


def _exit_codes(brain: Brain) -> None:
    delivered = _send(brain, CHECKPOINT)
    assert delivered.rc == 0, delivered
    pkt_id = delivered.json()["id"]
    assert delivered.json()["status"] == "delivered"
    denied = _send(
        brain,
        {
            "from": "human",
            "to": "worker",
            "signal": "SPAWN",
            "scope": {"zone": "personal"},
            "payload": {"context": {"x": 1}},
        },
    )
    assert denied.rc == 1, denied
    assert denied.json()["status"] == "denied" and denied.json()["rule"], denied
    invalid = _send(brain, {"from": "human", "to": "worker", "signal": "RETURN", "payload": {"context": {"x": 1}}})
    assert invalid.rc == 2, invalid
    assert invalid.json()["status"] == "invalid"
    garbage = _send(brain, "{not a packet")
    assert garbage.rc == 2, garbage
    wait(lambda: _audited(brain, id=pkt_id, status="delivered"), "the delivered packet in the audit log")
    wait(lambda: _audited(brain, id=denied.json()["id"], status="denied"), "the denied packet in the audit log")


def test_send_exit_codes_without_a_daemon(brain: Brain, tmp_path: Path) -> None:
    """`ambient send` without a daemon routes the packet itself: exit 0 delivered, 1 denied, 2 invalid; a YAML file
    works as well as JSON on stdin."""
    _agent(brain, "worker", PROJECT)
    _exit_codes(brain)
    packet = tmp_path / "checkpoint.yml"
    packet.write_text("from: human\nto: bsi\nsignal: CHECKPOINT\npayload:\n  context: {note: from a file}\n")
    res = brain.cli("send", str(packet))
    assert res.rc == 0, res
    assert "delivered" in res.out


def test_send_exit_codes_with_a_running_daemon(brain: Brain) -> None:
    """With the daemon running, `ambient send` hands the packet over .ambient/run/send.sock (a 0700 folder): the same
    exit codes and audit records."""
    _agent(brain, "worker", PROJECT)
    with brain.daemon() as daemon:
        sock_dir = brain.root / ".ambient" / "run"
        wait(lambda: (sock_dir / "send.sock").exists(), "the send socket")
        assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700
        _exit_codes(brain)
        daemon.wait_log("packet_sent", via="socket", status="delivered")


def test_send_after_a_crash_routes_the_packet_itself(brain: Brain) -> None:
    """A socket left by a daemon killed with -9 does not stop `ambient send`: the command routes the packet itself."""
    daemon = brain.daemon().start()
    wait(lambda: (brain.root / ".ambient" / "run" / "send.sock").exists(), "the send socket")
    daemon.kill()
    res = _send(brain, CHECKPOINT)
    assert res.rc == 0, res
    assert _audited(brain, id=res.json()["id"], status="delivered")


@pytest.mark.parametrize("daemon", [False, True], ids=["no-daemon", "daemon"])
def test_rejected_packets_are_audited_by_size_and_sha256_never_content(brain: Brain, daemon: bool) -> None:
    """Rejected packets are recorded in .ambient/audit.jsonl by size and sha256, never by content."""
    _agent(brain, "worker", PROJECT)
    canary = "Canary-9f3e1c7d-payload"
    denied_raw = json.dumps(
        {
            "from": "human",
            "to": "worker",
            "signal": "SPAWN",
            "scope": {"zone": "personal"},
            "payload": {"context": {"secret": canary}},
        }
    )
    invalid_raw = json.dumps(
        {
            "from": "human",
            "to": "worker",
            "signal": "RETURN",
            "payload": {"context": {"secret": canary}, "result": {"note": canary}},
        }
    )
    yaml_raw = f'from: human\nto: bsi\nsignal: CHECKPOINT\npayload:\n  context: {{x: "{canary} [unclosed\n'
    proc = brain.daemon().start() if daemon else None
    try:
        assert _send(brain, denied_raw).rc == 1
        assert _send(brain, invalid_raw).rc == 2
        assert _send(brain, yaml_raw).rc == 2
        for raw, status in ((denied_raw, "denied"), (invalid_raw, "invalid"), (yaml_raw, "invalid")):
            data = raw.encode()
            digest = hashlib.sha256(data).hexdigest()
            [rec] = wait(lambda d=digest: _audited(brain, sha256=d), f"the {status} packet's audit record")
            assert rec["status"] == status
            assert rec["size"] == len(data)
    finally:
        if proc is not None:
            proc.stop()
    assert canary not in (brain.root / ".ambient" / "audit.jsonl").read_text()


def test_an_oversized_packet_is_audited_by_its_own_size_and_sha256(brain: Brain) -> None:
    """A packet rejected for its size is recorded by its size and sha256 too."""
    raw = json.dumps(
        {
            "from": "human",
            "to": "bsi",
            "signal": "CHECKPOINT",
            "payload": {"context": {k: "x" * 60_000 for k in "abcde"}},
        }
    )
    assert _send(brain, raw).rc == 2
    [rec] = [r for r in _audit(brain) if r["status"] == "invalid"]
    assert rec["size"] == len(raw.encode())
    assert rec["sha256"] == hashlib.sha256(raw.encode()).hexdigest()


SIGNAL_RULES = [
    ({"to": "worker", "signal": "RETURN", "payload": {"context": {"x": 1}}}, ["RETURN", "payload.context"]),
    (
        {"to": "worker", "signal": "RETURN", "scope": {"files": ["a.md"]}, "payload": {"result": {"status": "ok"}}},
        ["RETURN", "scope.files"],
    ),
    ({"to": "worker", "signal": "SPAWN", "payload": {"result": {"status": "ok"}}}, ["SPAWN", "payload.result"]),
    ({"to": "worker", "signal": "BLOCKED_ON", "payload": {}}, ["BLOCKED_ON", "payload.context"]),
    ({"to": "worker", "signal": "ERROR", "payload": {"options": ["a"]}}, ["ERROR", "payload.options"]),
    ({"to": "worker", "signal": "ESCALATE", "payload": {"options": []}}, ["ESCALATE", "payload.options"]),
    (
        {"to": "worker", "signal": "ESCALATE", "payload": {"options": ["a"], "context": {"question": "q", "why": 1}}},
        ["ESCALATE", "payload.context.why"],
    ),
    ({"to": "worker", "signal": "CHECKPOINT", "payload": {"context": {"x": 1}}}, ["CHECKPOINT", "bsi"]),
    (
        {
            "to": "worker",
            "signal": "HANDOFF",
            "session_id": "s1",
            "payload": {"context": {"x": 1}, "decision": {"d": 1}},
        },
        ["HANDOFF", "from"],
    ),
    (
        {"to": "human", "signal": "HANDOFF", "payload": {"context": {"x": 1}, "decision": {"d": 1}}},
        ["HANDOFF", "session_id"],
    ),
    (
        {"to": "ambient", "signal": "ORCHESTRATE", "payload": {"context": {"step": 1}}},
        ["ORCHESTRATE", "payload.context.workflow"],
    ),
    (
        {"to": "ambient", "signal": "ABORT", "payload": {"context": {"workflow": "w", "reason": "r", "extra": 1}}},
        ["ABORT", "payload.context.extra"],
    ),
    (
        {"to": "broadcast", "signal": "DONE", "payload": {"context": {"workflow": "w", "summary": "s"}}},
        ["broadcast", "NOTIFY", "DONE"],
    ),
]


@pytest.mark.parametrize(
    ("packet", "named"), SIGNAL_RULES, ids=[f"{p['signal']}-{i}" for i, (p, _) in enumerate(SIGNAL_RULES)]
)
def test_payload_rules_per_signal_are_rejected_with_the_field_named(
    brain: Brain, packet: dict[str, Any], named: list[str]
) -> None:
    """Each signal carries only its payload (ADR-026); a packet breaking the rule is rejected (exit 2) with the
    signal, the field and what is allowed."""
    _agent(brain, "worker", PROJECT)
    res = _send(brain, {"from": "human", **packet})
    assert res.rc == 2, res
    reason = res.json()["reason"]
    for word in named:
        assert word in reason, reason


def test_the_packets_the_signal_rules_allow_are_delivered(brain: Brain) -> None:
    """CHECKPOINT to bsi, HANDOFF to the sender itself with a session_id, NOTIFY to broadcast are delivered."""
    for packet in (
        CHECKPOINT,
        {
            "from": "human",
            "to": "human",
            "signal": "HANDOFF",
            "session_id": "s1",
            "payload": {"context": {"x": 1}, "decision": {"d": 1}},
        },
        {"from": "human", "to": "broadcast", "signal": "NOTIFY", "payload": {"context": {"message": "hi"}}},
    ):
        res = _send(brain, packet)
        assert res.rc == 0, res


def _file_packet(n: int) -> dict[str, Any]:
    return {
        "from": "human",
        "to": "worker",
        "signal": "SPAWN",
        "scope": {"zone": "project", "files": [f"workspace/f{i}.md" for i in range(n)]},
        "payload": {"context": {"x": 1}},
    }


def test_bounds_per_packet_string_files_and_options(brain: Brain) -> None:
    """Bounds: 256 KiB per packet, 64 KiB per string, 256 files, 16 options; at the bound a packet passes."""
    _agent(brain, "worker", PROJECT)
    big = {
        "from": "human",
        "to": "bsi",
        "signal": "CHECKPOINT",
        "payload": {"context": {k: "x" * 60_000 for k in "abcde"}},
    }
    assert len(json.dumps(big)) > 256 * 1024
    res = _send(brain, big)
    assert res.rc == 2 and "262144" in res.json()["reason"], res

    long_string = {
        "from": "human",
        "to": "bsi",
        "signal": "CHECKPOINT",
        "payload": {"context": {"a": "x" * (64 * 1024 + 1)}},
    }
    res = _send(brain, long_string)
    assert res.rc == 2 and "payload.context" in res.json()["reason"], res
    long_string["payload"]["context"]["a"] = "x" * (64 * 1024)
    assert _send(brain, long_string).rc == 0

    res = _send(brain, _file_packet(257))
    assert res.rc == 2 and "scope.files" in res.json()["reason"], res
    assert _send(brain, _file_packet(256)).rc == 0

    # To ambient: an ESCALATE goes up (agent → pilot), never down to an agent that reports to the sender.
    options = {
        "from": "human",
        "to": "ambient",
        "signal": "ESCALATE",
        "payload": {"options": [f"o{i}" for i in range(17)]},
    }
    res = _send(brain, options)
    assert res.rc == 2 and "payload.options" in res.json()["reason"], res
    options["payload"]["options"] = options["payload"]["options"][:16]
    assert _send(brain, options).rc == 0


# ---------------------------------------------------------------- the access matrix


def test_matrix_prints_the_effective_matrix(example_brain: Brain) -> None:
    """`ambient matrix` prints every principal with its rights and where they come from (agent file:line)."""
    res = example_brain.ok("matrix")
    assert "hello  [agents/hello.md:" in res.out, res
    for principal in ("human", "ambient", "bsi", "orchestrator"):
        assert f"\n{principal}  [" in res.out, principal
    data = example_brain.ok("matrix", "--json").json()
    hello = next(p for p in data["principals"] if p["name"] == "hello")
    assert hello["zone_access"] == ["project"]
    assert set(hello["signals"]) == {"RETURN", "ERROR", "ESCALATE", "BLOCKED_ON"}


def test_matrix_explain_says_allow_or_deny_with_the_rule(example_brain: Brain) -> None:
    """`ambient matrix explain FROM TO SIGNAL`: exit 0 allow, 1 deny, 2 bad input, with the rule that decided."""
    allow = _explain(example_brain, "ambient", "hello", "SPAWN", "--file", "infrastructure/vps/x.yml")
    assert allow.rc == 0, allow
    assert "ALLOW" in allow.out
    signal = _explain(example_brain, "hello", "ambient", "SPAWN", "--json")
    assert signal.rc == 1, signal
    assert signal.json()["allowed"] is False
    assert signal.json()["rule"] == "sender.signals"
    assert signal.json()["source"].startswith("agents/hello.md:")
    zone = _explain(example_brain, "hello", "human", "RETURN", "--zone", "personal", "--json")
    assert zone.rc == 1 and zone.json()["rule"].startswith("zone"), zone
    stranger = _explain(example_brain, "ghost", "human", "RETURN")
    assert stranger.rc == 1 and "ghost" in stranger.out, stranger
    assert _explain(example_brain, "hello", "human", "BOGUS").rc == 2
    assert _explain(example_brain, "ambient", "hello", "SPAWN", "--file", "../outside.yml").rc == 2


def test_an_agent_without_a_gate_sends_and_receives_nothing(brain: Brain) -> None:
    """An agent without a gate (no `brain.ipc`) sends and receives nothing."""
    brain.write("agents/mute.md", "---\nname: mute\ntype: agent\nstatus: active\ndescription: no gate\n---\n# mute\n")
    assert _explain(brain, "ambient", "mute", "SPAWN", "--zone", "project").rc == 1
    assert _explain(brain, "mute", "human", "RETURN").rc == 1
    assert _explain(brain, "human", "mute", "SPAWN").rc == 1


def test_a_gate_naming_orchestrator_admits_ambient_and_a_declared_gate_replaces_the_kernel_default(
    brain: Brain,
) -> None:
    """`ambient` acts as the orchestrator (a list naming `orchestrator` admits it); an agent that declares `brain.ipc`
    gets exactly that entry, not the kernel default of its name."""
    _agent(brain, "worker", {**PROJECT, "receives_from": ["orchestrator"], "sends_to": ["orchestrator"]})
    assert _explain(brain, "ambient", "worker", "SPAWN", "--zone", "project").rc == 0
    assert _explain(brain, "worker", "ambient", "RETURN").rc == 0
    assert _explain(brain, "human", "worker", "SPAWN", "--zone", "project").rc == 1

    assert _explain(brain, "debug", "orchestrator", "RETURN").rc == 0  # the kernel default of ADR-026
    _agent(
        brain,
        "debug",
        {"receives_from": ["human"], "sends_to": ["human"], "zone_access": ["project"], "signals": ["RETURN"]},
    )
    assert _explain(brain, "debug", "orchestrator", "RETURN").rc == 1
    assert _explain(brain, "debug", "human", "RETURN").rc == 0
    assert "debug  [agents/debug.md:" in brain.ok("matrix").out


ZONES = [
    ("agents/x.md", "kernel"),
    ("profil/ambient.yml", "kernel"),
    ("scripts/run.sh", "kernel"),
    ("KERNEL.md", "kernel"),
    ("profil/capital.md", "personal"),
    ("profil/objectifs.md", "personal"),
    ("progression/week-1.md", "personal"),
    ("MYSECRETS", "personal"),
    ("workspace/a.md", "project"),
    ("infrastructure/vps/x.yml", "project"),
]


def test_paths_are_zoned_kernel_personal_project(brain: Brain) -> None:
    """Zones of paths: agents/ profil/ scripts/ KERNEL.md kernel; profil/capital.md profil/objectifs.md progression/
    MYSECRETS personal; everything else project."""
    _agent(brain, "anywhere", {**PROJECT, "zone_access": ["*"]})
    _agent(brain, "worker", PROJECT)
    for path, zone in ZONES:
        res = _explain(brain, "ambient", "anywhere", "SPAWN", "--file", path)
        assert res.rc == 0 and f"zones {zone} allowed" in res.out, (path, zone, res)
    assert _explain(brain, "ambient", "worker", "SPAWN", "--file", "profil/capital.md").rc == 1
    assert _explain(brain, "ambient", "worker", "SPAWN", "--file", "agents/x.md").rc == 1


def test_a_path_leaving_the_brain_root_is_refused_never_zoned(brain: Brain, tmp_path: Path) -> None:
    """A path leaving the brain root (`..`, absolute, a symlink out) is refused, never zoned."""
    _agent(brain, "worker", {**PROJECT, "zone_access": ["*"]})
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, brain.root / "escape")
    for path in ("../x.md", "/etc/passwd", "escape/x.md"):
        res = _explain(brain, "ambient", "worker", "SPAWN", "--file", path)
        assert res.rc == 2, res
        sent = _send(
            brain,
            {
                "from": "human",
                "to": "worker",
                "signal": "SPAWN",
                "scope": {"files": [path]},
                "payload": {"context": {"x": 1}},
            },
        )
        assert sent.rc in (1, 2), sent
        assert sent.json()["status"] in ("denied", "invalid")
    assert list(outside.iterdir()) == []


def test_unknown_zones_are_kept_with_a_warning_and_mapped_in_zones_yml(brain: Brain) -> None:
    """A zone beyond kernel/project/personal is kept with a warning; profil/zones.yml maps paths to it."""
    _agent(brain, "librarian", {**PROJECT, "zone_access": ["project", "reference"]})
    _agent(brain, "worker", PROJECT)
    checked = brain.cli("validate")
    assert checked.rc == 0, checked
    assert "reference" in checked.text and "warning" in checked.text
    before = _explain(brain, "ambient", "worker", "SPAWN", "--file", "reference/book.md")
    assert before.rc == 0, before  # not mapped yet: a project path

    brain.write("profil/zones.yml", "reference: [reference/]\n")
    assert _explain(brain, "ambient", "librarian", "SPAWN", "--file", "reference/book.md").rc == 0
    denied = _explain(brain, "ambient", "worker", "SPAWN", "--file", "reference/book.md")
    assert denied.rc == 1 and "reference" in denied.out, denied
    assert _explain(brain, "ambient", "librarian", "SPAWN", "--zone", "reference").rc == 0
    assert _explain(brain, "ambient", "worker", "SPAWN", "--zone", "reference").rc == 1


# ---------------------------------------------------------------- the routing table


def test_the_routing_table_only_narrows(example_brain: Brain) -> None:
    """profil/routing.yml narrows the matrix: a routed sender may send only what its entries carry."""
    _routing(
        example_brain,
        """
        version: 1
        default: matrix
        routes:
          - from: hello
            to: [human]
            signals: [RETURN]
    """,
    )
    assert example_brain.cli("validate").rc == 0
    allowed = _explain(example_brain, "hello", "human", "RETURN")
    assert allowed.rc == 0 and "profil/routing.yml:4" in allowed.out, allowed
    for to, signal in (("ambient", "RETURN"), ("human", "ESCALATE")):
        res = _explain(example_brain, "hello", to, signal, "--json")
        assert res.rc == 1, res
        assert res.json()["rule"] == "routing"


def test_a_widening_route_is_an_error_with_file_line_and_is_not_applied(example_brain: Brain) -> None:
    """A routing entry that would widen the matrix is an error at load (file:line), not applied; the others are."""
    _routing(
        example_brain,
        """
        version: 1
        default: matrix
        routes:
          - from: hello
            to: [human]
            signals: [RETURN]
          - from: hello
            to: [debug]
            signals: [SPAWN]
          - from: hello
            to: [human]
            zones: [personal]
    """,
    )
    res = example_brain.cli("validate")
    assert res.rc == 1, res
    assert "profil/routing.yml:7:" in res.text and "profil/routing.yml:10:" in res.text, res
    assert _explain(example_brain, "hello", "debug", "SPAWN").rc == 1
    assert _explain(example_brain, "hello", "human", "RETURN", "--zone", "personal").rc == 1
    assert _explain(example_brain, "hello", "human", "RETURN").rc == 0
    assert _explain(example_brain, "hello", "ambient", "RETURN").rc == 1  # the first entry still narrows
    shown = example_brain.cli("matrix")
    assert shown.rc == 0 and "profil/routing.yml:7" in shown.err, shown


def test_default_deny_lets_senders_without_routes_send_nothing(brain: Brain) -> None:
    """`default: deny`: senders without routes send nothing; routed senders keep what their entries carry."""
    _agent(brain, "routed", PROJECT)
    _agent(brain, "unrouted", PROJECT)
    assert _explain(brain, "unrouted", "human", "RETURN").rc == 0
    _routing(
        brain,
        """
        version: 1
        default: deny
        routes:
          - from: routed
            to: [human]
    """,
    )
    assert _explain(brain, "routed", "human", "RETURN").rc == 0
    denied = _explain(brain, "unrouted", "human", "RETURN")
    assert denied.rc == 1 and "deny" in denied.out, denied
    assert _explain(brain, "unrouted", "ambient", "ERROR").rc == 1


# ---------------------------------------------------------------- identity


TALKER = """
    import json, os, pathlib, subprocess, sys
    json.load(sys.stdin)
    out = pathlib.Path(os.environ["OUT"])
    (out / "token").write_text(os.environ["AMBIENT_CHANNEL_TOKEN"])

    def send(packet):
        res = subprocess.run([sys.executable, "-m", "ambient", "send", "--json", "-"], input=json.dumps(packet),
                             capture_output=True, text=True)
        return {"rc": res.returncode, "answer": json.loads(res.stdout or "null")}

    results = {
        "as_itself": send({"from": "talker", "to": "human", "signal": "ERROR",
                           "payload": {"context": {"error": "disk full"}}}),
        "as_another_agent": send({"from": "mute", "to": "human", "signal": "ERROR",
                                  "payload": {"context": {"error": "disk full"}}}),
    }
    (out / "results.json").write_text(json.dumps(results))
    print(json.dumps({"status": "ok"}))
"""


def test_identity_comes_from_the_channel(brain: Brain, tmp_path: Path) -> None:
    """Identity comes from the channel: the person at the CLI is `human`; a spawned agent is known by its per-spawn
    token (only its sha256 kept), cannot speak as another agent, and a token of a daemon that died is refused."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"OUT": str(out)}
    if os.environ.get("PYTHONPATH"):  # the agent's `python -m ambient` is then the ambient under test too
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    brain.python_agent("talker", TALKER, runner={"env": env})
    brain.python_agent("mute", AGENT_OK)

    as_hello = _send(
        brain, {"from": "talker", "to": "human", "signal": "ERROR", "payload": {"context": {"error": "x"}}}
    )
    assert as_hello.rc == 1, as_hello
    assert as_hello.json()["rule"] == "identity"
    assert _audited(brain, status="denied", channel="human", rule="identity")

    brain.workflow(
        "talk",
        """
        workflow: talk
        for_each:
          items: [one]
          spawn: talker
          scope: {zone: project, files: ["workspace/talk/{{item}}.md"]}
    """,
    )
    daemon = brain.daemon().start()
    try:
        [record] = brain.wait_finished("talk")
        assert record["outcome"] == "success"
        results = json.loads((out / "results.json").read_text())
        assert results["as_itself"]["rc"] == 0, results
        assert results["as_another_agent"]["rc"] == 1, results
        assert results["as_another_agent"]["answer"]["rule"] == "identity"
        itself = results["as_itself"]["answer"]["id"]
        wait(lambda: _audited(brain, id=itself, channel="talker", status="delivered"), "the agent's packet audited")
        token = (out / "token").read_text()
        assert len(token) >= 16
        daemon.kill()
    finally:
        daemon.kill()
    raw = json.dumps({"from": "talker", "to": "human", "signal": "ERROR", "payload": {"context": {"error": "x"}}})
    orphan = _send(brain, raw, env={"AMBIENT_CHANNEL_TOKEN": token})
    assert orphan.rc == 1, orphan
    assert orphan.json()["status"] == "denied"
    assert _audited(brain, channel="unauthenticated", sha256=hashlib.sha256(raw.encode()).hexdigest())
    leaked = [str(p) for p in brain.root.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaked == []


CHANNEL_PEEK = """
    import json, os, pathlib, stat, subprocess, sys
    json.load(sys.stdin)
    channels = pathlib.Path(os.environ["AMBIENT_BRAIN"], ".ambient", "channels")
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in channels.iterdir() if not p.name.startswith(".")}
    packet = {"from": "peeker", "to": "human", "signal": "ERROR", "payload": {"context": {"error": "x"}}}
    sent = subprocess.run([sys.executable, "-m", "ambient", "send", "--json", "-"], input=json.dumps(packet),
                          capture_output=True, text=True)
    pathlib.Path(os.environ["OUT"]).write_text(json.dumps(
        {"token": os.environ["AMBIENT_CHANNEL_TOKEN"], "files": files, "rc": sent.returncode}))
    print(json.dumps({"status": "ok"}))
"""


def test_a_brain_path_too_long_for_a_socket_keeps_each_token_as_a_file_of_its_sha256(tmp_path: Path) -> None:
    """Where the send socket cannot be served (a brain path too long for a unix socket), each token gets a file in
    .ambient/channels/ (its sha256, mode 0600), removed when the agent ends, nothing of it kept under another name;
    `ambient send` still works."""
    brain = Brain.init(tmp_path / ("long-" + "x" * 100) / "brain", "--no-example")
    out = tmp_path / "peek.json"
    env = {"OUT": str(out)}
    if os.environ.get("PYTHONPATH"):  # the agent's `python -m ambient` is then the ambient under test too
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    brain.python_agent("peeker", CHANNEL_PEEK, runner={"env": env})
    brain.workflow(
        "peek",
        """
        workflow: peek
        for_each:
          items: [one]
          spawn: peeker
          scope: {zone: project, files: ["workspace/peek/{{item}}.md"]}
    """,
    )
    with brain.daemon():
        [record] = brain.wait_finished("peek")
    assert record["outcome"] == "success"
    seen = json.loads(out.read_text())
    digest = hashlib.sha256(seen["token"].encode()).hexdigest()
    assert [(name.split(".")[0], mode) for name, mode in seen["files"].items()] == [(digest, 0o600)], seen
    assert seen["rc"] == 0, seen
    channels = brain.root / ".ambient" / "channels"
    assert [p.name for p in channels.iterdir()] == []
    leaked = [str(p) for p in brain.root.rglob("*") if p.is_file() and seen["token"].encode() in p.read_bytes()]
    assert leaked == []


def test_direction_a_leaf_never_spawns_its_orchestrator_and_results_flow_up(example_brain: Brain) -> None:
    """ADR-026's directions: SPAWN goes parent → child, RETURN/ERROR child → parent, ESCALATE and
    BLOCKED_ON agent → pilot; `matrix explain` says so with the rule."""
    brain = example_brain
    brain.python_agent(
        "leaf",
        "print('{}')\n",
        gate={
            "receives_from": ["orchestrator"],
            "sends_to": ["orchestrator"],
            "zone_access": ["project"],
            "signals": ["SPAWN", "RETURN"],
        },
    )
    up = brain.cli("matrix", "explain", "leaf", "orchestrator", "RETURN")
    assert up.rc == 0, up
    spawn_up = brain.cli("matrix", "explain", "leaf", "orchestrator", "SPAWN")
    assert spawn_up.rc == 1 and "direction.spawn" in spawn_up.out, spawn_up
    spawn_down = brain.cli("matrix", "explain", "orchestrator", "leaf", "SPAWN")
    assert spawn_down.rc == 0, spawn_down
    down = brain.cli("matrix", "explain", "ambient", "hello", "RETURN")
    assert down.rc == 1 and "direction.upward" in down.out and "reports to ambient" in down.out, down


def test_a_gate_less_scribe_works_in_its_declared_scope_only(brain: Brain) -> None:
    """The kernel scribe's zones are "as declared by scope" (ADR-026): a scribe without a gate and with
    `brain.scope: project` is never SPAWNed on a personal path."""
    brain.write(
        "agents/scribe.md",
        "---\nname: scribe\nbrain: {version: 1, scope: project}\nambient:\n"
        '  runner: {kind: command, argv: ["true"]}\n---\n# scribe\n',
    )
    brain.workflow(
        "secrets",
        """
        workflow: secrets
        for_each: {items: [x], spawn: scribe, scope: {files: [MYSECRETS]}}
    """,
    )
    res = brain.cli("validate")
    assert res.rc == 1 and "may not SPAWN 'scribe'" in res.out and "personal" in res.out, res
    assert brain.cli("matrix", "explain", "ambient", "scribe", "SPAWN", "--file", "projets/a/README.md").rc == 0
    assert brain.cli("matrix", "explain", "ambient", "scribe", "SPAWN", "--file", "MYSECRETS").rc == 1


def test_validate_names_an_unknown_principal_in_a_gate_with_a_suggestion(example_brain: Brain) -> None:
    """`sends_to: [orchestrater]` is reported at its line, with the name that exists nearby."""
    path = example_brain.path("agents/hello.md")
    lines = path.read_text().splitlines()
    at = next(n for n, line in enumerate(lines, 1) if line.strip().startswith("sends_to:"))
    path.write_text(path.read_text().replace("sends_to:      [orchestrator,", "sends_to:      [orchestrater,"))
    res = example_brain.cli("validate")
    assert f"agents/hello.md:{at}:" in res.out and "'orchestrater'" in res.out, res
    assert "did you mean 'orchestrator'?" in res.out, res
    assert "'orchestrater'" in example_brain.cli("doctor").out


def test_a_misspelt_zone_is_named_with_the_zone_it_looks_like(brain: Brain) -> None:
    """`zone_access: [projet]` is kept (zones beyond the kernel's are allowed) and warned about with `project`."""
    gate = {**PROJECT_GATE, "zone_access": ["projet"]}
    brain.write("agents/zoned.md", agent_md("zoned", ["bash", "bin/zoned.sh"], gate=gate))
    res = brain.cli("validate")
    assert "agents/zoned.md:" in res.out and "zone 'projet' is not a kernel zone" in res.out, res
    assert "did you mean 'project'?" in res.out, res


# ---------------------------------------------------------------- ADAPT and ABORT to ambient

#: ``one`` works until ``work/release`` appears, holding the fan-out's only slot; the others answer ok at once.
#: Every item run leaves ``work/ran-<item>``.
_HOLDS_FIRST = """
    import json, os, pathlib, sys, time
    json.load(sys.stdin)
    item = os.environ["AMBIENT_ITEM"]
    work = pathlib.Path(os.environ["AMBIENT_BRAIN"]) / "work"
    work.mkdir(exist_ok=True)
    (work / f"ran-{item}").write_text("")
    while item == "one" and not (work / "release").exists():
        time.sleep(0.05)
    print(json.dumps({"status": "ok"}))
"""


def _adapt(workflow: str, changes: Any) -> dict[str, Any]:
    return {
        "from": "human",
        "to": "ambient",
        "signal": "ADAPT",
        "payload": {"context": {"workflow": workflow, "changes": changes}},
    }


def test_adapt_skips_named_items_of_a_running_fan_out_and_says_what_it_did(brain: Brain) -> None:
    """ADAPT `changes: {skip: [...]}` to ambient skips those items of a running for_each that have not started: they
    end `skipped` and never run; a name the run does not have is said in the log, not dropped in silence."""
    brain.python_agent("worker", _HOLDS_FIRST, timeout_s=120)
    brain.workflow(
        "fan",
        """
        workflow: fan
        for_each:
          items: [one, two, three]
          spawn: worker
          concurrency: 1
    """,
    )
    with brain.daemon() as daemon:
        wait(lambda: brain.path("work/ran-one").exists(), "item one at work")
        res = _send(brain, _adapt("fan", {"skip": ["three", "four"]}))
        assert res.rc == 0, res
        [skipped] = daemon.wait_log("run_adapted")
        assert skipped["skipped"] == ["three"], skipped
        assert "four" in json.dumps(skipped["not_skipped"]), skipped
        brain.write("work/release", "")
        [record] = brain.wait_finished("fan")
    assert brain.path("work/ran-two").exists() and not brain.path("work/ran-three").exists()
    claim = next(brain.path("claims").glob(f"{record['run_id']}-item-003.yml")).read_text()
    assert "status: closed" in claim and "ADAPT" in claim, claim
    assert [s["item"] for s in record["steps"]] == ["one", "two"], record


@pytest.mark.parametrize(
    "changes",
    [{"skip": "three"}, {"add": ["four"]}, ["three"], {"skip": []}, {"skip": [3]}],
    ids=["skip-not-a-list", "unknown-change", "not-a-mapping", "skip-empty", "skip-not-names"],
)
def test_an_adapt_ambient_cannot_carry_out_is_refused_saying_what_it_accepts(brain: Brain, changes: Any) -> None:
    """An ADAPT to ambient that asks for something ambient does not do is refused at `ambient send` (exit 2), the
    reason saying what ADAPT accepts; it is never delivered to change nothing."""
    res = _send(brain, _adapt("fan", changes))
    assert res.rc == 2, res
    assert "changes: {skip: [" in res.json()["reason"], res


def test_adapt_or_abort_naming_no_running_run_is_said_in_the_log(brain: Brain) -> None:
    """ADAPT or ABORT naming a workflow or run that is not running is delivered (it may be meant for a run that
    just ended), and the daemon says it found nothing to act on."""
    abort = {
        "from": "human",
        "to": "ambient",
        "signal": "ABORT",
        "payload": {"context": {"workflow": "ghost", "reason": "why not"}},
    }
    with brain.daemon() as daemon:
        assert _send(brain, _adapt("ghost", {"skip": ["one"]})).rc == 0
        assert _send(brain, abort).rc == 0
        daemon.wait_log("packet_found_no_run", signal="ADAPT", workflow="ghost")
        daemon.wait_log("packet_found_no_run", signal="ABORT", workflow="ghost")
