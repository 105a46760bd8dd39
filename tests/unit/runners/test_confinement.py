"""Whom an agent runs as, and what of its scope is given to that user."""

from __future__ import annotations

import os
import queue
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ambient.runners.base import RunRequest
from ambient.runners.confinement import (
    AGENT_USER,
    TempDirs,
    default_agent_user,
    left_behind,
    maker_pid,
    resolve_in,
    run_as,
    scope_write,
    share_scope,
)
from ambient.runners.runner_config import CommandRunnerConfig, parse_runner_config


def _cfg(**kw: object) -> CommandRunnerConfig:
    cfg = parse_runner_config({"kind": "command", "argv": ["true"], **kw})
    assert isinstance(cfg, CommandRunnerConfig)
    return cfg


def test_a_root_daemon_runs_agents_as_the_agent_user_unless_the_runner_names_one() -> None:
    assert default_agent_user(0) == AGENT_USER
    assert default_agent_user(1000) is None  # ambient's own user: it cannot take another
    assert run_as(_cfg(), default_agent_user(0)) == AGENT_USER
    assert run_as(_cfg(user="root"), default_agent_user(0)) == "root"  # the person's choice (no capability)
    assert run_as(_cfg(user="alice"), None) == "alice"
    assert run_as(_cfg(), None) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another group needs root")
def test_share_scope_gives_the_scope_and_the_shared_folders_to_the_agents_group(tmp_path: Path) -> None:
    """The scope's file (and the folder of one not there yet), claims/ and locks/: the agent's group, group-writable,
    setgid on folders; owners kept, nothing opened to others, the rest of the brain untouched."""
    brain = tmp_path / "brain"
    for d in ("claims", "locks", "notes", "private"):
        (brain / d).mkdir(parents=True)
        (brain / d).chmod(0o755)
    kept = brain / "notes" / "kept.md"
    kept.write_text("x")
    kept.chmod(0o644)
    (brain / "private" / "p.md").write_text("p")
    packet = {"scope": {"files": ["notes/kept.md", "out/new.md", "../outside.md"]}}
    req = RunRequest(packet=packet, agent="a", run_id="r", item="i", attempt=1, key="k", channel_token="t", brain=brain)
    share_scope(req, 12345, 54321)
    for path, want in ((kept, 0o664), (brain / "out", 0o2775), (brain / "claims", 0o2775), (brain / "locks", 0o2775)):
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 54321, want), path
    for path in (brain / "notes", brain / "private", brain / "private" / "p.md", brain):
        assert path.stat().st_gid == 0, path
    assert not (tmp_path / "outside.md").exists()


def test_temp_dirs_are_private_fresh_never_handed_out_twice_and_removed_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dirs = TempDirs(spare=2)
    taken = [dirs.take("scribe") for _ in range(5)]
    assert dirs.wait(60)
    assert len(set(taken)) == 5
    for path in taken:
        st = path.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        assert path.parent == tmp_path and path.name.startswith("ambient-scribe-")
    ready = set(tmp_path.iterdir()) - set(taken)
    assert len(ready) == 2  # made ahead for the next agents of that name
    (taken[0] / "scratch").write_text("x")
    for path in taken:
        dirs.drop(str(path))
    assert dirs.wait(60)
    assert set(tmp_path.iterdir()) == ready
    dirs.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("ambient-scribe-1234-k2x_9aqz", 1234),
        ("ambient-build-2-77-abcdefgh", 77),  # a dash and digits in the agent's name
        ("ambient-scribe-k2x_9aqz", None),  # named before the maker's pid was in the name
        ("ambient-demo-k2x_9aqz", None),  # the demo's brain
        ("ambient--12-abc", None),
        ("ambient-scribe-12-", None),
        ("pytest-of-root", None),
    ],
)
def test_the_maker_of_a_temp_dir_is_read_from_its_name(name: str, pid: int | None) -> None:
    assert maker_pid(name) == pid


def test_only_the_empty_temp_dirs_of_makers_gone_are_removed(tmp_path: Path) -> None:
    """What a daemon killed -9 made ahead goes; a living maker's dirs, a dir holding an agent's files, a dir opened to
    others and anything named otherwise stay."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    dead = int(done.stdout)  # reaped: gone (a pid is not reused within this test)
    alive = os.getppid()

    def made(name: str, mode: int = 0o700) -> Path:
        path = tmp_path / name
        path.mkdir()
        path.chmod(mode)
        return path

    gone = [made(f"ambient-scribe-{dead}-aaaaaaaa"), made(f"ambient-build-2-{dead}-bbbbbbbb")]
    kept = [
        made(f"ambient-scribe-{alive}-cccccccc"),
        made(f"ambient-scribe-{dead}-dddddddd", 0o755),
        made("ambient-scribe-eeeeeeee"),
        made(f"other-{dead}-ffffffff"),
    ]
    busy = made(f"ambient-scribe-{dead}-gggggggg")
    (busy / "scratch").write_text("an agent's file")
    kept.append(busy)
    assert left_behind(str(tmp_path)) == 2
    assert not any(path.exists() for path in gone)
    assert all(path.exists() for path in kept)
    assert (busy / "scratch").read_text() == "an agent's file"


def test_a_daemon_start_removes_what_a_killed_one_made_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    left = tmp_path / f"ambient-scribe-{int(done.stdout)}-aaaaaaaa"
    left.mkdir(mode=0o700)
    dirs = TempDirs(spare=1)
    dirs.sweep_left_behind()
    assert dirs.wait(60)
    assert not left.exists()
    dirs.close()


def test_a_temp_dir_made_ahead_then_changed_is_not_handed_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dirs = TempDirs(spare=1)
    first = dirs.take("scribe")
    assert dirs.wait(60)
    (ready,) = set(tmp_path.iterdir()) - {first}
    ready.chmod(0o755)  # opened to others meanwhile
    second = dirs.take("scribe")
    assert second not in (first, ready)
    assert stat.S_IMODE(second.lstat().st_mode) == 0o700
    dirs.close()


def test_taking_and_dropping_temp_dirs_in_a_fan_out_does_not_wake_their_thread_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wake-up of the thread could take the core from the event loop while it holds the GIL: while the thread
    has work (it dozes and looks again by itself) and enough dirs are ready, agents' takes and drops wake it not."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dirs = TempDirs(spare=8)
    dirs.DOZE_S = 30.0  # it dozes through this test once it has worked: no look of its own can hide a wake-up
    wakes: list[object] = []

    class Counted(queue.SimpleQueue[bool | None]):
        def put(self, item: bool | None, block: bool = True, timeout: float | None = None) -> None:
            wakes.append(item)
            super().put(item, block, timeout)

    dirs._jobs = Counted()
    first = dirs.take("scribe")
    assert dirs.wait(60)  # the spare dirs are made: it has worked, it dozes
    wakes.clear()
    taken = [dirs.take("scribe") for _ in range(3)]  # 8 ready, then 7, 6, 5: at least half the spare is left
    for path in [first, *taken]:
        dirs.drop(str(path))
    assert wakes == []
    assert dirs.wait(60)  # asking for its jobs to be done wakes it
    assert wakes == [True]
    assert not any(path.exists() for path in [first, *taken])
    assert len(list(tmp_path.iterdir())) == 8  # made ahead again for the next agents
    dirs.close()
    assert list(tmp_path.iterdir()) == []


def test_a_scope_path_is_resolved_as_realpath_resolves_it_looking_up_only_its_own_components(tmp_path: Path) -> None:
    """Every path of up to three components over folders, a file, symlinks (into the brain, out of it, dangling,
    a loop), missing names, ``.`` and ``..``: the same answer as ``os.path.realpath``, and, when no symlink was met,
    the type of what is there and whether its folder is one."""
    root = tmp_path / "brain"
    (root / "a" / "b").mkdir(parents=True)
    (root / "f").write_text("x")
    (root / "l1").symlink_to("a")
    (root / "l2").symlink_to("../outside")
    (root / "l3").symlink_to("missing")
    (root / "loop").symlink_to("loop")
    names = ["a", "b", "f", "l1", "l2", "l3", "loop", "x", ".", "..", ""]
    rels = [*names, *(f"{p}/{q}" for p in names for q in names)]
    rels += [f"{p}/{q}/{r}" for p in names for q in names for r in names] + ["/etc/passwd", "/a"]
    for rel in rels:
        path, mode, parent_is_dir = resolve_in(str(root), rel)
        assert path == os.path.realpath(os.path.join(root, rel)), rel
        if mode is not None:
            try:
                assert mode == stat.S_IFMT(os.lstat(path).st_mode), rel
            except FileNotFoundError:
                assert mode == 0, rel
            except NotADirectoryError:
                assert mode == 0, rel
            assert parent_is_dir == os.path.isdir(os.path.dirname(path)), rel


def test_a_new_file_at_the_top_of_the_brain_grants_nothing(tmp_path: Path) -> None:
    """Its folder would be the whole brain, ambient's state with it; a file there already, or a new one in a
    folder, is granted as before."""
    brain = tmp_path / "brain"
    (brain / ".ambient").mkdir(parents=True)
    (brain / "kept.md").write_text("x")
    assert scope_write(brain, ["new.md", "./other.md"]) == []
    assert scope_write(brain, ["kept.md", "notes/new.md"]) == [str(brain / "kept.md"), str(brain / "notes")]


def test_a_user_lookup_without_a_descriptor_left_says_what_ran_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """`getpwnam` reads /etc/passwd: with no descriptor left it finds nobody, which is not "no such user"."""
    import errno
    import os
    import pwd

    from ambient.core.health import resource_of
    from ambient.runners import confinement

    def none_left(*_a: object, **_k: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(pwd, "getpwnam", lambda name: (_ for _ in ()).throw(KeyError(name)))
    monkeypatch.setattr(confinement, "_USERS", {})
    monkeypatch.setattr(os, "open", none_left)
    with pytest.raises(OSError) as caught:
        confinement._user_entry("nobody-left")
    assert resource_of(caught.value, spawning=True) == "descriptors"
    monkeypatch.undo()
    monkeypatch.setattr(pwd, "getpwnam", lambda name: (_ for _ in ()).throw(KeyError(name)))
    monkeypatch.setattr(confinement, "_USERS", {})
    with pytest.raises(KeyError):  # descriptors to spare: the user truly does not exist
        confinement._user_entry("no-such-user")
