"""Claim store: lossless rewrites, bad files reported and untouched, fencing, crash safety (R-02)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.claims.claim import new_claim
from ambient.claims.store import ClaimStore
from ambient.core.errors import FencingError, InputError, StateError, TransitionError
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import load_file

SRC = Path(__file__).resolve().parents[3] / "src"
NOW = datetime(2026, 3, 16, 21, 0, tzinfo=UTC)

CUSTOM = """\
# a comment a person wrote
sess_id: sess-20260316-2145-brain-engine-code
type: satellite
scope: brain-engine/
agent: satellite-boot
status: open
opened_at: 2026-03-16T21:45
story_angle: "Implémenter BE-6 feature X"
satellite_type: code
priority: high
labels: [urgent, be-6]
handoff_level: "NO"
custom:
  nested: {a: 1, b: [x, y]}
  when: 2026-03-16
on_done: trigger → type:test scope:brain-engine/
"""


@pytest.fixture
def brain(tmp_path: Path) -> BrainPaths:
    """An empty brain with claims/."""
    root = tmp_path / "brain"
    (root / "claims").mkdir(parents=True)
    return BrainPaths(root)


def write(brain: BrainPaths, name: str, text: str) -> Path:
    """A claim file written by hand."""
    path = brain.claims / name
    path.write_text(text)
    return path


def parsed(path: Path) -> dict[str, object]:
    """A file's YAML as data."""
    data, _ = load_file(path, max_bytes=1 << 20)
    assert isinstance(data, dict)
    return data


class TestRoundTrip:
    def test_unknown_keys_and_values_survive_transitions(self, brain: BrainPaths) -> None:
        """gate + approve + close rewrite the file; every unknown key and value is still there, in order."""
        path = write(brain, "sess-20260316-2145-brain-engine-code.yml", CUSTOM)
        original = parsed(path)
        store = ClaimStore(brain)
        sid = "sess-20260316-2145-brain-engine-code"
        store.transition(sid, "gate", "deploy?", now=NOW)
        store.transition(sid, "approve", now=NOW)
        store.close(sid, {"status": "partial", "files_modified": ["brain-engine/x.py"], "extra": 1}, now=NOW)
        after = parsed(path)
        for key, value in original.items():
            if key != "status":
                assert after[key] == value, key
        assert list(after)[: len(original)] == list(original)
        assert after["status"] == "closed" and after["result"] == {
            "status": "partial",
            "files_modified": ["brain-engine/x.py"],
            "extra": 1,
        }
        assert [e["action"] for e in after["gate_history"]] == ["gate", "approve", "close"]  # type: ignore[index]

    def test_corpus_claim_rewrite_keeps_every_field(self, brain: BrainPaths, corpus: Path) -> None:
        """The real claims-init.yml (type: explore, zone, result_status...) loads and rewrites losslessly."""
        path = brain.claims / "claims-init.yml"
        shutil.copy(corpus / "claims-init.yml", path)
        original = parsed(path)
        store = ClaimStore(brain)
        loaded = store.load()
        claim = loaded.claims["sess-init-cold-start"]
        assert claim.type == "explore" and claim.close_tier == 1 and claim.zone == "project"
        assert {(p.line, p.severity) for p in loaded.problems} == {(2, "warning"), (10, "warning")}
        store.update("sess-init-cold-start", {"story_angle": claim.story_angle})
        assert parsed(path) == original
        store.write_claim(store.get("sess-init-cold-start"))
        assert parsed(path) == original
        assert list(parsed(path)) == list(original)


class TestBadFiles:
    @pytest.mark.parametrize(
        ("text", "line", "message"),
        [
            ("sess_id: a\ntype: solo\nscope: x/\nagent: a\nstatus: open\n", None, "opened_at"),
            (
                "sess_id: a\ntype: solo\nscope: x/\nagent: a\nstatus: open\nopened_at: x\n"
                "result: {files_modified: 3}\n",
                7,
                "result",
            ),
            ("sess_id: a\nsess_id: b\n", 2, "duplicate key"),
            ("sess_id: [unclosed\n", 2, "expected"),
            ("- just\n- a list\n", 1, "mapping"),
            ("a: &x 1\nb: *x\n", 2, "aliases"),
        ],
    )
    def test_malformed_claim_is_reported_and_untouched(
        self, brain: BrainPaths, text: str, line: int | None, message: str
    ) -> None:
        """A bad claim becomes a file:line problem; load, transitions and writes never rewrite or delete it."""
        bad = write(brain, "bad.yml", text)
        write(brain, "good.yml", CUSTOM)
        stat_before = bad.stat()
        store = ClaimStore(brain)
        loaded = store.load()
        assert list(loaded.claims) == ["sess-20260316-2145-brain-engine-code"]
        errors = [p for p in loaded.problems if p.severity == "error"]
        assert len(errors) >= 1 and errors[0].file == "claims/bad.yml" and message in errors[0].message
        if line is not None:
            assert errors[0].line == line
        assert str(errors[0]).startswith("claims/bad.yml:")
        store.transition("sess-20260316-2145-brain-engine-code", "pause", now=NOW)
        with pytest.raises(InputError):
            store.transition("bad", "gate", now=NOW)
        assert bad.read_text() == text and bad.stat().st_mtime_ns == stat_before.st_mtime_ns

    def test_write_claim_never_overwrites_a_bad_file(self, brain: BrainPaths) -> None:
        """write_claim refuses to replace a malformed or symlinked claim file."""
        bad = write(brain, "s.yml", "sess_id: [\n")
        store = ClaimStore(brain)
        with pytest.raises(InputError):
            store.write_claim(new_claim("s", "solo", "x/", "a", NOW))
        assert bad.read_text() == "sess_id: [\n"

    def test_symlinks_are_never_followed(self, brain: BrainPaths, tmp_path: Path) -> None:
        """A symlinked claim is reported and skipped; its target is never read into a claim nor written."""
        target = tmp_path / "secret.yml"
        target.write_text(CUSTOM)
        (brain.claims / "link.yml").symlink_to(target)
        store = ClaimStore(brain)
        loaded = store.load()
        assert loaded.claims == {} and "symlink" in loaded.problems[0].message
        with pytest.raises(InputError):
            store.write_claim(new_claim("link", "solo", "x/", "a", NOW))
        assert target.read_text() == CUSTOM and (brain.claims / "link.yml").is_symlink()

    def test_duplicate_sess_id_and_oversize(self, brain: BrainPaths) -> None:
        """Two files with one sess_id: the second is reported and ignored; a huge file is refused unread."""
        write(brain, "a.yml", CUSTOM)
        write(brain, "b.yml", CUSTOM)
        write(brain, "huge.yml", "x: " + "y" * 70_000 + "\n")
        loaded = ClaimStore(brain).load()
        assert len(loaded.claims) == 1
        messages = " ".join(p.message for p in loaded.problems)
        assert "already used by claims/a.yml" in messages and "limit" in messages


class TestWrites:
    def test_open_update_and_refusals(self, brain: BrainPaths) -> None:
        """open creates claims/<id>.yml once; update sets keys but never the status or the id."""
        store = ClaimStore(brain)
        claim = store.open(new_claim("s1", "satellite", "agents/", "a", NOW, satellite_type="code"))
        assert (brain.claims / "s1.yml").exists() and claim.status == "open"
        with pytest.raises(StateError, match="exists already"):
            store.open(new_claim("s1", "solo", "x/", "a", NOW))
        assert store.update("s1", {"workflow_step": 2}, remove=["satellite_type"]).workflow_step == 2
        assert store.get("s1").satellite_type is None
        with pytest.raises(InputError, match="use transition"):
            store.update("s1", {"status": "closed"})
        with pytest.raises(InputError, match="no claim"):
            store.get("nope")
        with pytest.raises(InputError, match="file name"):
            store.get("../escape")
        assert [c.sess_id for c in store.list(status="open")] == ["s1"]

    def test_cascade_is_written_to_every_file(self, brain: BrainPaths) -> None:
        """pause/resume/abort cascades reach the children's files; an illegal move writes nothing."""
        store = ClaimStore(brain)
        store.open(new_claim("p", "pilote", "be/", "a", NOW))
        store.open(new_claim("c", "satellite", "be/x/", "a", NOW, parent_satellite="p"))
        store.transition("p", "pause", "lunch", now=NOW)
        assert store.get("c").status == "paused" and store.get("c").paused_by == "p"
        before = (brain.claims / "c.yml").read_bytes()
        with pytest.raises(TransitionError):
            store.transition("c", "resume", now=NOW)
        assert (brain.claims / "c.yml").read_bytes() == before
        store.transition("p", "resume", now=NOW)
        assert store.get("c").status == "open"
        store.transition("p", "abort", now=NOW)
        assert store.get("c").status == "failed"

    def test_mark_stale(self, brain: BrainPaths) -> None:
        """Open claims past their TTL are written as stale."""
        store = ClaimStore(brain)
        store.open(new_claim("old", "solo", "x/", "a", NOW, ttl=5))
        changed = store.mark_stale(now=datetime(2026, 3, 16, 22, 0, tzinfo=UTC))
        assert set(changed) == {"old"} and store.get("old").status == "stale"


class TestFencing:
    def test_older_token_is_refused(self, brain: BrainPaths) -> None:
        """The store keeps the highest token accepted in fence:, and refuses older ones without writing."""
        store = ClaimStore(brain)
        store.open(new_claim("s", "solo", "x/", "a", NOW), token=5)
        assert store.get("s").fence == 5
        store.update("s", {"story_angle": "six"}, token=6)
        before = (brain.claims / "s.yml").read_bytes()
        with pytest.raises(FencingError, match="token 5 is older than 6"):
            store.update("s", {"story_angle": "stale"}, token=5)
        with pytest.raises(FencingError):
            store.transition("s", "gate", now=NOW, token=4)
        with pytest.raises(FencingError):
            store.write_claim(store.get("s"), token=3)
        assert (brain.claims / "s.yml").read_bytes() == before
        store.transition("s", "gate", now=NOW)  # a person's gate command carries no token: allowed
        assert store.get("s").fence == 6

    def test_a_blind_write_from_a_stale_copy_is_refused_once_a_newer_holder_fenced_the_claim(
        self, brain: BrainPaths
    ) -> None:
        """A claim written without a token from an old in-memory copy is made under the fence its
        writer last wrote: it passed a file a newer token had fenced since (the daemon woken past its lease
        overwrote the result a newer holder had closed). Its own rewrites still keep the fence, never lower it."""
        store = ClaimStore(brain)
        stale_copy = new_claim("s", "solo", "x/", "a", NOW)
        store.write_claim(stale_copy, token=10)
        store.write_claim(stale_copy.model_copy(update={"story_angle": "mine"}), durable=False)
        assert store.get("s").fence == 10  # its own rewrite without a token: the fence stays
        other = ClaimStore(brain)
        other.update("s", {"story_angle": "x"}, token=12)
        with pytest.raises(FencingError, match="older than 12"):
            store.write_claim(stale_copy, durable=False)
        with pytest.raises(FencingError):
            store.write_claim(stale_copy, token=11)
        assert store.get("s").story_angle == "x" and store.get("s").fence == 12
        store.write_claim(stale_copy, token=12, durable=False)  # under the current token it may write again


class TestFaults:
    @pytest.mark.parametrize(("call", "code"), [("write", errno.ENOSPC), ("fsync", errno.EIO)])
    def test_injected_io_errors_fail_loudly(
        self, brain: BrainPaths, monkeypatch: pytest.MonkeyPatch, call: str, code: int
    ) -> None:
        """R-02: ENOSPC from os.write or EIO from os.fsync raise; the old claim stays intact, no temp is left."""
        store = ClaimStore(brain)
        store.open(new_claim("s", "solo", "x/", "a", NOW, story_angle="old"))
        before = (brain.claims / "s.yml").read_bytes()
        real = getattr(os, call)
        claims_dir = str(brain.claims)

        def failing(fd: int, *args: object) -> object:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(claims_dir):
                raise OSError(code, os.strerror(code))
            return real(fd, *args)

        monkeypatch.setattr(os, call, failing)
        with pytest.raises(OSError) as info:
            store.update("s", {"story_angle": "new"})
        assert info.value.errno == code
        monkeypatch.undo()
        assert (brain.claims / "s.yml").read_bytes() == before
        assert sorted(p.name for p in brain.claims.iterdir()) == ["s.yml"]


KILL_DRIVER = r"""
import json, os, random, signal, sys, time
from pathlib import Path
from ambient.claims.claim import new_claim
from ambient.claims.store import ClaimStore
from ambient.claims.locks import LockManager
from ambient.storage.paths import BrainPaths
from datetime import datetime, UTC
root, kills, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
paths = BrainPaths(root)
store = ClaimStore(paths, check_filesystem=False)
locks = LockManager(paths, check_filesystem=False)
PAD = "x" * 4000
def claim(tag):
    return new_claim("sess-w", "satellite", "agents/", "writer", datetime.now(UTC), story_angle=tag + "|" + PAD)
store.write_claim(claim("initial"))
rng = random.Random(seed)
torn = bad_locks = 0
versions = set()
for k in range(kills):
    pid = os.fork()
    if pid == 0:
        s2 = ClaimStore(paths, check_filesystem=False)
        m2 = LockManager(paths, check_filesystem=False)
        n = 0
        while True:
            n += 1
            s2.write_claim(claim(f"k{k}-v{n}"), durable=(n % 2 == 0))
            g = m2.acquire("agents/w.md", f"writer-{k}", ttl_s=60, wait=5)
            m2.release_grant(g)
    time.sleep(rng.uniform(0.005, 0.06))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    try:
        c, _ = store.read(store.path_for("sess-w"))
        tag, pad = c.story_angle.split("|")
        assert pad == PAD and (tag == "initial" or tag.startswith(f"k"))
        versions.add(tag)
    except Exception as exc:
        torn += 1
        print("TORN", exc, file=sys.stderr)
    st = locks.check("agents/w.md")
    if st.state in ("malformed", "stale"):
        bad_locks += 1
        print("BAD LOCK", st, file=sys.stderr)
# On a line of its own: a child killed while logging (a takeover warning) can leave half a line on stdout.
print("\n" + json.dumps({"kills": kills, "torn": torn, "bad_locks": bad_locks, "versions": len(versions)}))
"""


@pytest.mark.slow
def test_r02_kill_9_mid_write_never_tears(brain: BrainPaths) -> None:
    """R-02: a claim+lock writer killed -9 fifty times leaves no torn claim or lock; the sweep removes only temps."""
    (brain.root / "locks").mkdir()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", KILL_DRIVER, str(brain.root), "50", "7"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["torn"] == 0 and report["bad_locks"] == 0, proc.stderr
    assert report["versions"] > 10  # the kills landed at many different points
    # Decoys the sweep must leave alone: a claim, a hidden non-temp file, a live writer's temp file.
    keep = [brain.claims / ".keep", brain.claims / f".other.yml.tmp.{os.getpid()}.abcd1234"]
    for path in keep:
        path.write_text("keep me")
    # Crash leftovers: temp files, and a lock renamed aside by a takeover the kill interrupted (``.stale.``).
    temps = {
        p for d in (brain.claims, brain.locks) for p in d.iterdir() if ".tmp." in p.name or ".lock.stale." in p.name
    } - set(keep)
    t1 = time.monotonic()
    removed = set(ClaimStore(brain).sweep())
    from ambient.claims.locks import LockManager

    manager = LockManager(brain)
    removed |= set(manager.sweep())
    sweep_s = time.monotonic() - t1
    assert removed == temps
    assert all(p.exists() for p in keep)
    assert ClaimStore(brain).get("sess-w").story_angle  # still a whole, valid claim
    assert manager.check("agents/w.md").state in ("free", "dead")
    manager.close()
    claim_temps = sum(1 for p in temps if p.parent == brain.claims)
    print(
        f"\nR-02: kills {report['kills']}, torn 0 (claims and locks), distinct versions seen {report['versions']}, "
        f"temp files left {len(temps)} ({claim_temps} claim temps, {len(temps) - claim_temps} lock spares/temps) "
        f"swept in {sweep_s * 1000:.1f} ms, total {time.monotonic() - t0:.1f} s"
    )


def test_write_claims_fsyncs_each_file_before_its_rename(brain: BrainPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch is written, fsync'd, then renamed (R-03): every rename comes after the fsync of its file, and a
    failed fsync puts nothing of its round in place (the old claims stay, no temp file is left)."""
    store = ClaimStore(brain, check_filesystem=False)
    now = datetime(2026, 3, 16, 21, 45, tzinfo=UTC)
    old = [new_claim(f"sess-20260316-2145-item-{i:03d}", "satellite", f"x/{i}", "qa", now) for i in range(3)]
    assert store.write_claims(old) == []
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("rename", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    new = [c.model_copy(update={"status": "closed"}) for c in old]
    assert store.write_claims(new) == []
    renamed = [p for kind, p in events if kind == "rename"]
    assert len(renamed) == 3
    for tmp in renamed:
        assert events.index(("fsync", tmp)) < events.index(("rename", tmp))
    assert all(load_file(brain.claims / f"{c.sess_id}.yml", max_bytes=65536)[0]["status"] == "closed" for c in old)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    reopened = [c.model_copy(update={"status": "open"}) for c in old]
    failed = store.write_claims(reopened)
    assert sorted(sid for sid, _ in failed) == [c.sess_id for c in old]
    assert all(load_file(brain.claims / f"{c.sess_id}.yml", max_bytes=65536)[0]["status"] == "closed" for c in old)
    assert [p.name for p in brain.claims.iterdir() if ".tmp." in p.name] == []


def test_write_claims_fsyncs_a_round_together(brain: BrainPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's files are fsync'd several at a time, not one after another: each fsync here waits until another
    is under way too (one by one, each waited 2-3 ms for the device, ~3 s per 1,000-item fan-out, and the next run
    found the writer still busy). Every file is still fsync'd before its rename."""
    store = ClaimStore(brain, check_filesystem=False)
    now = datetime(2026, 3, 16, 21, 45, tzinfo=UTC)
    claims = [new_claim(f"sess-20260316-2145-item-{i:03d}", "satellite", f"x/{i}", "qa", now) for i in range(6)]
    together = threading.Barrier(2, timeout=10)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            together.wait()  # BrokenBarrierError when no other fsync comes meanwhile
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert store.write_claims(claims) == []
    assert len(synced) == 6
    assert all(load_file(brain.claims / f"{c.sess_id}.yml", max_bytes=65536)[0]["status"] == "open" for c in claims)


def test_what_the_store_remembers_is_bounded(brain: BrainPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-12 found the daemon growing with every claim it ever wrote: the store keeps only the newest files it
    wrote or read; an older one is read again from disk when needed (and a rewrite still keeps its fence)."""
    import ambient.claims.store as cs

    monkeypatch.setattr(cs, "KNOWN_MAX", 8)
    store = ClaimStore(brain, check_filesystem=False)
    now = datetime(2026, 3, 16, 21, 45, tzinfo=UTC)
    claims = [new_claim(f"sess-20260316-2145-item-{i:03d}", "satellite", f"x/{i}", "qa", now) for i in range(20)]
    first = claims[0].model_copy(update={"fence": 7})
    store.write_claim(first, durable=False)
    assert store.write_claims(claims[1:], durable=False) == []
    assert len(store._known) <= 8 and len(store._files) <= 8
    newest = brain.claims / f"{claims[-1].sess_id}.yml"
    st = newest.stat()
    assert store.known_facts(newest, (st.st_ino, st.st_size, st.st_mtime_ns)) is not None
    oldest = brain.claims / f"{first.sess_id}.yml"
    st = oldest.stat()
    assert store.known_facts(oldest, (st.st_ino, st.st_size, st.st_mtime_ns)) is None  # fell out: read from disk
    store.write_claim(claims[0].model_copy(update={"status": "closed"}), durable=False)
    assert store.get(first.sess_id).fence == 7  # the fence was read back from the file, never lowered


@pytest.mark.slow
def test_what_the_store_keeps_per_claim_is_small(brain: BrainPaths) -> None:
    """R-12: the store keeps a claim's facts, not its model (~3.4 KB): what stays in memory after writing 300
    claims, once the caller's claims are gone, is under 1 KB a claim (paths and signatures included)."""
    import gc
    import tracemalloc

    store = ClaimStore(brain, check_filesystem=False)
    now = datetime(2026, 3, 16, 21, 45, tzinfo=UTC)
    store.write_claims([new_claim("sess-20260316-2145-warm-up", "satellite", "x/w", "qa", now)], durable=False)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        claims = [
            new_claim(f"sess-20260316-2145-item-{i:03d}", "satellite", f"projects/p/item-{i:05d}.md", "qa", now)
            for i in range(300)
        ]
        assert store.write_claims(claims, durable=False) == []
        del claims
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(store._known) == 301
    assert kept / 300 < 1000, kept / 300  # ~0.7 KB; 2.9 KB with the models and Paths


def test_batch_write_skips_a_broken_file_and_writes_the_others(brain: BrainPaths) -> None:
    """write_claims (the writer thread's batch): a claim file a person broke is reported, kept, and not overwritten."""
    store = ClaimStore(brain)
    broken = store.dir / "sess-b.yml"
    broken.write_text("sess_id: [unclosed\n")
    batch = [new_claim(f"sess-{k}", "satellite", f"x/{k}.md", "coder", NOW) for k in ("a", "b", "c")]
    failed = store.write_claims(batch, durable=False)
    assert [sid for sid, _ in failed] == ["sess-b"]
    assert broken.read_text() == "sess_id: [unclosed\n"
    assert store.get("sess-a").scope == "x/a.md" and store.get("sess-c").scope == "x/c.md"
