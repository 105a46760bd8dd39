"""`ambient claim`, `gate`, `lock` and `preflight` through ``ambient.cli.main`` with their exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ambient.cli import main

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def brain(tmp_path: Path) -> Path:
    """An empty brain with claims/, locks/ and agents/."""
    root = tmp_path / "brain"
    for sub in ("claims", "locks", "agents"):
        (root / sub).mkdir(parents=True)
    return root


def run(brain: Path, *argv: str) -> int:
    """main() with --brain placed after the subcommand, as users type it."""
    return main([*argv, "--brain", str(brain)])


def open_claim(brain: Path, sid: str, *extra: str) -> None:
    assert run(brain, "claim", "open", "--sess-id", sid, "--type", "satellite", "--agent", "coder", *extra) == 0


class TestLockCli:
    def test_exit_codes(self, brain: Path, capsys: Capture) -> None:
        """acquire 0 / 1 held by another; check 1 held / 0 free; release 2 wrong holder / 0 / 2 not held."""
        assert run(brain, "lock", "acquire", "agents/x.md", "sess-a", "--ttl", "30") == 0
        assert "token" in capsys.readouterr().out
        assert run(brain, "lock", "acquire", "agents/x.md", "sess-b") == 1
        assert "locked by sess-a" in capsys.readouterr().err
        assert run(brain, "lock", "check", "agents/x.md") == 1
        assert "holder sess-a" in capsys.readouterr().out
        assert run(brain, "lock", "release", "agents/x.md", "sess-b") == 2
        assert "release refused" in capsys.readouterr().err
        assert run(brain, "lock", "acquire", "agents/x.md", "sess-a") == 0  # same holder: refreshed
        assert "refreshed" in capsys.readouterr().out
        assert run(brain, "lock", "release", "agents/x.md", "sess-a") == 0
        assert run(brain, "lock", "check", "agents/x.md") == 0
        assert run(brain, "lock", "release", "agents/x.md", "sess-a") == 2

    def test_cli_locks_are_bound_to_the_session(self, brain: Path, capsys: Capture) -> None:
        """A lock taken by the (exiting) CLI process is not freed by that process's death."""
        assert run(brain, "lock", "acquire", str(brain / "agents/y.md"), "sess-a", "--json") == 0
        grant = json.loads(capsys.readouterr().out)
        assert grant["file"] == "agents/y.md" and isinstance(grant["token"], int)
        assert run(brain, "lock", "check", "agents/y.md", "--json") == 1
        info = json.loads(capsys.readouterr().out)
        assert info["state"] == "held" and info["info"]["pid_bound"] is False

    def test_list_cleanup_and_bad_input(self, brain: Path, capsys: Capture) -> None:
        """list shows locks (bad ones reported); cleanup removes stale ones; escapes and bad TTLs exit 2."""
        assert run(brain, "lock", "list") == 0 and "No locks." in capsys.readouterr().out
        run(brain, "lock", "acquire", "a.md", "sess-a")
        (brain / "locks" / "b.md.lock").write_text("")
        capsys.readouterr()
        assert run(brain, "lock", "list", "--json") == 0
        states = {row["file"]: row["state"] for row in json.loads(capsys.readouterr().out)}
        assert states == {"a.md": "held", "b.md": "malformed"}
        assert run(brain, "lock", "cleanup") == 0
        assert "0 lock(s) removed" in capsys.readouterr().out
        assert run(brain, "lock", "acquire", "../../etc/passwd", "sess-a") == 2
        assert "'..'" in capsys.readouterr().err
        assert run(brain, "lock", "acquire", "c.md", "sess-a", "--ttl", "0") == 2
        assert run(brain, "lock") == 2  # an action is required


class TestClaimCli:
    def test_open_list_show_close(self, brain: Path, capsys: Capture) -> None:
        """open prints the id; list and show give tier and zone; a tier-2 close without tests is refused (2)."""
        open_claim(brain, "s1", "--scope", "brain-engine/", "--satellite-type", "code", "--ttl", "4h")
        assert capsys.readouterr().out.strip() == "s1"
        assert run(brain, "claim", "list") == 0
        assert "s1  open  satellite/code  brain-engine/  agent coder  tier 2  zone project" in capsys.readouterr().out
        assert run(brain, "claim", "show", "s1") == 0
        assert "close_tier 2, zone project" in capsys.readouterr().out
        assert run(brain, "claim", "close", "s1", "--status", "ok") == 2
        assert "tier 2" in capsys.readouterr().err
        assert (
            run(
                brain,
                "claim",
                "close",
                "s1",
                "--status",
                "ok",
                "--tests-total",
                "3",
                "--tests-passed",
                "3",
                "--tests-failed",
                "0",
                "--files",
                "brain-engine/a.py",
                "--commit",
                "abc123",
            )
            == 0
        )
        capsys.readouterr()
        assert run(brain, "claim", "show", "s1", "--json") == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["claim"]["status"] == "closed" and shown["claim"]["result"]["tests"]["failed"] == 0
        assert run(brain, "claim", "list", "--status", "open") == 0
        assert "No claims." in capsys.readouterr().out

    def test_open_refuses_conflicts_unless_forced(self, brain: Path, capsys: Capture) -> None:
        """A test satellite on the folder of an active code satellite waits (exit 1); --force opens it."""
        open_claim(brain, "code", "--scope", "be/", "--satellite-type", "code")
        extra = ("--scope", "be/t.py", "--satellite-type", "test")
        assert run(brain, "claim", "open", "--sess-id", "test", "--type", "satellite", "--agent", "t", *extra) == 1
        assert "must wait" in capsys.readouterr().err
        assert (
            run(
                brain,
                "claim",
                "open",
                "--sess-id",
                "srch",
                "--type",
                "satellite",
                "--agent",
                "t",
                "--scope",
                "be/",
                "--satellite-type",
                "search",
            )
            == 0
        )
        assert (
            run(brain, "claim", "open", "--sess-id", "test", "--type", "satellite", "--agent", "t", *extra, "--force")
            == 0
        )
        assert (
            run(brain, "claim", "open", "--sess-id", "test", "--type", "solo", "--agent", "t", "--scope", "x/") == 2
        )  # exists already

    def test_corpus_claim_is_listed(self, brain: Path, corpus: Path, capsys: Capture) -> None:
        """The real claims-init.yml lists with its unknown type and a warning, without being rewritten."""
        shutil.copy(corpus / "claims-init.yml", brain / "claims" / "claims-init.yml")
        before = (brain / "claims" / "claims-init.yml").read_bytes()
        assert run(brain, "claim", "list") == 0
        captured = capsys.readouterr()
        assert "sess-init-cold-start  closed  explore  brain/" in captured.out
        assert "claims/claims-init.yml:2: warning: type 'explore'" in captured.err
        assert (brain / "claims" / "claims-init.yml").read_bytes() == before


class TestGateCli:
    def test_gate_flow_and_refusal(self, brain: Path, capsys: Capture) -> None:
        """gate → approve → pause (cascade) → resume; an illegal approve exits 2 and changes nothing."""
        open_claim(brain, "p", "--scope", "be/", "--satellite-type", "domain", "--satellite-level", "domain")
        open_claim(brain, "c", "--scope", "be/x/", "--satellite-type", "code", "--parent", "p", "--force")
        capsys.readouterr()
        assert run(brain, "gate", "gate", "p", "deploy now?") == 0
        assert "p: open -> waiting_human" in capsys.readouterr().out
        assert run(brain, "gate", "approve", "p") == 0
        before = (brain / "claims" / "p.yml").read_bytes()
        assert run(brain, "gate", "approve", "p") == 2
        assert "cannot approve claim p: it is open" in capsys.readouterr().err
        assert (brain / "claims" / "p.yml").read_bytes() == before
        assert run(brain, "gate", "pause", "p", "lunch") == 0
        assert "c: open -> paused (cascade)" in capsys.readouterr().out
        assert run(brain, "gate", "resume", "c") == 2
        assert run(brain, "gate", "resume", "p") == 0
        capsys.readouterr()
        assert run(brain, "gate", "status", "c") == 0
        out = capsys.readouterr().out
        assert out.startswith("c: open") and "(cascade from p): lunch" in out
        assert run(brain, "gate", "status", "p", "--json") == 0
        history = json.loads(capsys.readouterr().out)["gate_history"]
        assert [h["action"] for h in history] == ["gate", "approve", "pause", "resume"]
        assert run(brain, "gate", "abort", "nope") == 2
        assert run(brain, "gate", "launch", "p") == 2


class TestPreflightCli:
    def test_exit_codes_0_to_6(self, brain: Path, capsys: Capture) -> None:
        """check exits 0 when clear and with the failed check's code otherwise."""
        open_claim(brain, "s", "--scope", "be/", "--theme-branch", "theme/x")
        (brain / ".git").mkdir()
        (brain / ".git" / "HEAD").write_text("ref: refs/heads/theme/x\n")
        assert run(brain, "preflight", "check", "s", "be/a.py") == 0
        assert "ok: s may write" in capsys.readouterr().out
        assert run(brain, "preflight", "check", "s", "other/a.py") == 1
        run(brain, "lock", "acquire", "be/locked.py", "sess-other")
        assert run(brain, "preflight", "check", "s", "be/locked.py") == 2
        assert run(brain, "preflight", "check", "nope", "be/a.py") == 4
        (brain / "agents" / "coder.md").write_text("---\nipc:\n  zone_access: [kernel]\n---\n")
        assert run(brain, "preflight", "check", "s", "be/a.py") == 5
        (brain / "agents" / "coder.md").unlink()
        (brain / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        capsys.readouterr()
        assert run(brain, "preflight", "check", "s", "be/a.py", "--json") == 6
        assert json.loads(capsys.readouterr().out)[-1]["code"] == 6
        (brain / ".git" / "HEAD").write_text("ref: refs/heads/theme/x\n")
        for expected in (0, 0, 3):
            assert run(brain, "preflight", "fail", "s") == expected
        assert "TRIPPED" in capsys.readouterr().out
        assert run(brain, "preflight", "check", "s", "be/a.py") == 3
        assert run(brain, "preflight", "status", "be/") == 3
        assert run(brain, "preflight", "reset", "s") == 0
        assert run(brain, "preflight", "status", "s") == 0
        run(brain, "gate", "pause", "s")
        assert run(brain, "preflight", "check", "s", "be/a.py") == 4

    def test_threshold_option(self, brain: Path, capsys: Capture) -> None:
        """--threshold changes how many failures trip the breaker."""
        assert run(brain, "preflight", "fail", "be/", "--threshold", "1") == 3
        assert run(brain, "preflight", "status", "be/", "--threshold", "5") == 3  # tripped stays tripped
        assert "TRIPPED" in capsys.readouterr().out
