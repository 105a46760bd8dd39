"""fsutil: containment checks (S-01, S-02), atomic writes and the start-up sweep of their temp files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ambient.core.errors import InputError, UnsafePathError
from ambient.core.process import own_start_time, process_start_time
from ambient.storage import fsutil
from ambient.storage.fsutil import (
    TMP_MARK,
    TmpWriter,
    append_whole,
    atomic_write,
    check_local_filesystem,
    check_relative,
    copy_tree,
    cut_to,
    filesystem_type,
    is_leftover,
    iter_files,
    move,
    publish_new,
    read_capped,
    resolve_in_brain,
    sweep_stale_tmp,
    tmp_name,
    tmp_writer,
    unnamed_file,
    write_new,
    writer_mark,
)

# S-01: what a templated {{item}} may try (RELIABILITY 1.6).
TRAVERSALS = [
    ("../../etc/passwd", "'..'"),
    ("/etc/passwd", "absolute"),
    ("a/../../b", "'..'"),
    ("a/..", "'..'"),
    ("..\\x", "backslash"),
    ("x\x00y", "NUL"),
    ("a/" + "n" * 300, "longer than 255 bytes"),
    ("é" * 128, "longer than 255 bytes"),  # 256 bytes in UTF-8
]


class TestContainment:
    @pytest.mark.parametrize(("rel", "why"), TRAVERSALS)
    def test_check_relative_rejects(self, rel: str, why: str) -> None:
        """Each traversal form is rejected before any join, with the reason."""
        with pytest.raises(UnsafePathError, match=why):
            check_relative(rel)

    @pytest.mark.parametrize(("rel", "why"), TRAVERSALS)
    def test_resolve_in_brain_rejects(self, tmp_path: Path, rel: str, why: str) -> None:
        """resolve_in_brain applies the same checks (os.path.join would drop the root on '/etc/passwd')."""
        with pytest.raises(UnsafePathError):
            resolve_in_brain(tmp_path, rel)

    @pytest.mark.parametrize(
        ("rel", "clean"), [("./a//b/", "a/b"), ("%2e%2e/x", "%2e%2e/x"), ("a..b", "a..b"), ("", ""), (".", "")]
    )
    def test_check_relative_normalises(self, rel: str, clean: str) -> None:
        """Harmless forms are normalised; %2e%2e is a literal name (nothing URL-decodes paths)."""
        assert check_relative(rel) == clean

    def test_resolve_inside(self, tmp_path: Path) -> None:
        """A path inside the root resolves below it, existing or not; the root itself is allowed."""
        root = tmp_path / "brain"
        (root / "projets").mkdir(parents=True)
        assert resolve_in_brain(root, "projets/new/file.md") == (root / "projets/new/file.md").resolve()
        assert resolve_in_brain(root, "") == root.resolve()

    def test_symlink_out_rejected(self, tmp_path: Path) -> None:
        """A symlink inside the brain that points outside is rejected, for the link and anything below it (S-02)."""
        root = tmp_path / "brain"
        root.mkdir()
        secret = tmp_path / "ssh"
        secret.mkdir()
        (root / "out").symlink_to(secret)
        (root / "file").symlink_to(tmp_path / "elsewhere.txt")
        for rel in ("out", "out/id_rsa", "file"):
            with pytest.raises(UnsafePathError, match="outside the brain root"):
                resolve_in_brain(root, rel)

    def test_symlinked_parent_directory(self, tmp_path: Path) -> None:
        """A parent directory swapped for a symlink to outside is caught too."""
        root = tmp_path / "brain"
        (root / "projets").mkdir(parents=True)
        (root / "projets" / "app").symlink_to(tmp_path)
        with pytest.raises(UnsafePathError):
            resolve_in_brain(root, "projets/app/x")
        # ...while a link that loops back inside the root is fine
        assert resolve_in_brain(root, "projets/app/brain/x") == (root / "x").resolve()

    def test_symlink_inside_allowed(self, tmp_path: Path) -> None:
        """A symlink that stays inside resolves to its target."""
        root = tmp_path / "brain"
        (root / "profil").mkdir(parents=True)
        (root / "profil" / "capital.md").write_text("x")
        (root / "cap").symlink_to("profil/capital.md")
        assert resolve_in_brain(root, "cap") == (root / "profil/capital.md").resolve()


class TestAtomicWrite:
    def test_write_replace_mode(self, tmp_path: Path) -> None:
        """atomic_write creates or replaces the whole content, with the mode asked, leaving no temp file."""
        f = tmp_path / "claim.yml"
        atomic_write(f, "a: 1\n")
        atomic_write(f, b"a: 2\n", mode=0o600)
        assert f.read_text() == "a: 2\n"
        assert f.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["claim.yml"]

    def test_new_file_mode(self, tmp_path: Path) -> None:
        """A new file gets the requested mode (tokens, packets: 0600)."""
        f = tmp_path / "secret.json"
        atomic_write(f, "{}", mode=0o600)
        assert f.stat().st_mode & 0o777 == 0o600

    def test_not_durable_still_atomic(self, tmp_path: Path) -> None:
        """durable=False still replaces atomically."""
        f = tmp_path / "view.yml"
        atomic_write(f, "x", durable=False)
        assert f.read_text() == "x"

    def test_failure_leaves_old_content(self, tmp_path: Path) -> None:
        """A write whose rename fails leaves the old file intact and no temp file behind."""
        target = tmp_path / "dir_target"
        target.mkdir()
        (target / "keep").write_text("x")
        with pytest.raises(OSError):
            atomic_write(target, "data")  # cannot replace a non-empty directory
        assert (target / "keep").read_text() == "x"
        assert not [p for p in tmp_path.iterdir() if TMP_MARK in p.name]

    def test_a_temp_name_carries_its_writers_pid_and_start_time(self, tmp_path: Path) -> None:
        """The name a write stages under says who writes it: this process, as /proc knows it."""
        writer = tmp_writer(tmp_name(tmp_path / "a.yml").name)
        assert writer == TmpWriter(os.getpid(), own_start_time())
        assert writer_mark() == f"{os.getpid()}.{round(own_start_time() * 100)}"  # type: ignore[operator]
        for other in ("a.yml", ".hidden", "b.tmp.yml", ".a.yml.tmp.x.abc", ".a.yml.tmp.12.34.zz"):
            assert tmp_writer(other) is None, other
        assert tmp_writer(".a.yml.tmp.12.ab3") == TmpWriter(12, None)  # a name from before start times
        assert tmp_writer(".a.yml.stale.12.170000000012.ab3") == TmpWriter(12, 1700000000.12)

    def test_the_sweep_rule_spares_every_live_writer(self) -> None:
        """A temp file goes only when its writer is gone; a name without a start time, also once it is old."""
        live = {(7, 100.0), (7, None)}

        def alive(pid: int, start: float | None) -> bool:
            return (pid, start) in live

        young, old = 1.0, 601.0
        assert not is_leftover(TmpWriter(7, 100.0), old, alive, min_age_s=600)  # live, however old the file
        assert is_leftover(TmpWriter(7, 200.0), young, alive, min_age_s=600)  # pid reused by another process
        assert is_leftover(TmpWriter(8, 100.0), young, alive, min_age_s=600)  # gone
        assert not is_leftover(TmpWriter(7, None), young, alive, min_age_s=600)  # pid runs, file young: kept
        assert is_leftover(TmpWriter(7, None), old, alive, min_age_s=600)  # unknown writer, old file
        assert is_leftover(TmpWriter(8, None), young, alive, min_age_s=600)

    def test_sweep_removes_only_temp_files_whose_writer_is_gone(self, tmp_path: Path) -> None:
        """sweep_stale_tmp deletes the temp files of dead writers and nothing else: targets, other dot files, a
        sub-folder's files and a live writer's temp file (this process's, a young one without start time) stay."""
        keep = [tmp_path / "a.yml", tmp_path / ".hidden", tmp_path / "b.tmp.yml"]
        for p in keep:
            p.write_text("x")
        mine = tmp_name(tmp_path / "a.yml")
        mine.write_text("being written")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        dead_start = process_start_time(child.pid)
        assert dead_start is not None
        child.kill()
        child.wait()
        dead = tmp_path / f".c.yml.tmp.{child.pid}.{round(dead_start * 100)}.abc1"
        reused = tmp_path / f".d.yml.tmp.{os.getpid()}.{round(dead_start * 100)}.abc2"  # our pid, not our start
        unknown_young = tmp_path / f".e.yml.tmp.{os.getpid()}.abc3"
        unknown_old = tmp_path / f".f.yml.tmp.{os.getpid()}.abc4"
        for p in (dead, reused, unknown_young, unknown_old):
            p.write_text("torn")
        os.utime(unknown_old, (time.time() - 3600, time.time() - 3600))
        (tmp_path / "sub").mkdir()
        sub_left = tmp_path / "sub" / f".g.yml.tmp.{child.pid}.abc5"
        sub_left.write_text("torn")
        removed = sweep_stale_tmp(tmp_path)
        assert sorted(removed) == sorted([dead, reused, unknown_old])
        assert all(p.exists() for p in [*keep, mine, unknown_young, sub_left])
        assert sweep_stale_tmp(tmp_path / "missing") == []


class TestWriteNew:
    def test_creates_only_new_files_and_never_follows_a_symlink(self, tmp_path: Path) -> None:
        """write_new creates a 0600 file; an existing file (or a symlink planted at the name) is refused and left
        as it was."""
        f = tmp_path / "token.json"
        write_new(f, '{"principal": "deploy"}')
        assert f.read_text() == '{"principal": "deploy"}' and f.stat().st_mode & 0o777 == 0o600
        with pytest.raises(FileExistsError):
            write_new(f, "other")
        assert f.read_text() == '{"principal": "deploy"}'
        target = tmp_path / "elsewhere"
        (tmp_path / "planted.json").symlink_to(target)
        with pytest.raises(FileExistsError):
            write_new(tmp_path / "planted.json", "x")
        assert not target.exists()


class TestTheOtherWrites:
    """The writes modules make through storage instead of by themselves (ARCHITECTURE.md, rule (e))."""

    def test_publish_new_never_clobbers_and_leaves_no_temp_file(self, tmp_path: Path) -> None:
        target = tmp_path / "key"
        publish_new(target, b"first", mode=0o600)
        with pytest.raises(FileExistsError):
            publish_new(target, b"second")
        assert target.read_bytes() == b"first" and (target.stat().st_mode & 0o777) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["key"]

    @pytest.mark.parametrize("durable", [False, True])
    def test_move_renames_over_what_is_there(self, tmp_path: Path, durable: bool) -> None:
        (tmp_path / "done").mkdir()
        (tmp_path / "a.json").write_text("new")
        (tmp_path / "done" / "a.json").write_text("old")
        move(tmp_path / "a.json", tmp_path / "done" / "a.json", durable=durable)
        assert not (tmp_path / "a.json").exists() and (tmp_path / "done" / "a.json").read_text() == "new"

    def test_cut_to_cuts_and_refuses_a_symlink(self, tmp_path: Path) -> None:
        log = tmp_path / "run.jsonl"
        log.write_bytes(b'{"a": 1}\n{"b"')
        cut_to(log, 9)
        assert log.read_bytes() == b'{"a": 1}\n'
        (tmp_path / "link").symlink_to(log)
        with pytest.raises(OSError):
            cut_to(tmp_path / "link", 0)
        assert log.read_bytes() == b'{"a": 1}\n'

    def test_append_whole_leaves_no_fragment_when_a_write_fails(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        log = tmp_path / "log.jsonl"
        log.write_bytes(b"one\n")
        fd = os.open(log, os.O_RDWR | os.O_APPEND)
        try:
            append_whole(fd, b"two\n", 4)
            assert log.read_bytes() == b"one\ntwo\n"

            def half_then_full(fd: int, data: bytes) -> None:
                os.write(fd, data[:3])
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(fsutil, "write_all", half_then_full)
            with pytest.raises(OSError, match="No space"):
                append_whole(fd, b"three\n", 8)
        finally:
            os.close(fd)
        assert log.read_bytes() == b"one\ntwo\n"

    def test_unnamed_file_reads_back_from_the_start(self) -> None:
        fd = unnamed_file(b"packet")
        try:
            assert os.read(fd, 100) == b"packet"
            assert os.fstat(fd).st_nlink == 0  # no name anywhere
        finally:
            os.close(fd)

    def test_copy_tree_copies_into_an_existing_folder(self, tmp_path: Path) -> None:
        (tmp_path / "src" / "sub").mkdir(parents=True)
        (tmp_path / "src" / "sub" / "f.txt").write_text("x")
        (tmp_path / "dest").mkdir()
        copy_tree(tmp_path / "src", tmp_path / "dest")
        assert (tmp_path / "dest" / "sub" / "f.txt").read_text() == "x"


class TestReading:
    def test_read_capped(self, tmp_path: Path) -> None:
        """Reads up to the cap; refuses bigger files, symlinks and non-regular files."""
        f = tmp_path / "a"
        f.write_bytes(b"12345")
        assert read_capped(f, 5) == b"12345"
        with pytest.raises(InputError, match="limit"):
            read_capped(f, 4)
        (tmp_path / "l").symlink_to(f)
        with pytest.raises(UnsafePathError):
            read_capped(tmp_path / "l", 10)
        with pytest.raises(InputError, match="not a regular file"):
            read_capped(tmp_path, 10)
        with pytest.raises(FileNotFoundError):
            read_capped(tmp_path / "none", 10)

    def test_iter_files(self, tmp_path: Path) -> None:
        """iter_files lists regular, visible files with the suffixes, sorted; no symlinks, no temp files."""
        for name in ("b.md", "a.md", ".h.md", "c.txt"):
            (tmp_path / name).write_text("x")
        (tmp_path / "d.md").mkdir()
        (tmp_path / "e.md").symlink_to(tmp_path / "a.md")
        tmp_name(tmp_path / "f.md").write_text("x")
        assert [p.name for p in iter_files(tmp_path, (".md",))] == ["a.md", "b.md"]
        assert list(iter_files(tmp_path / "missing", (".md",))) == []

    def test_filesystem_checks(self, tmp_path: Path) -> None:
        """The tmp filesystem is named and accepted as local."""
        assert filesystem_type(tmp_path) != ""
        check_local_filesystem(tmp_path)


def test_atomic_write_keeps_no_partial_file_on_concurrent_readers(tmp_path: Path) -> None:
    """Readers between writes see one complete version or the other, never a mix."""
    f = tmp_path / "x"
    versions = [f"v{i}\n" * 2000 for i in range(20)]
    seen: set[str] = set()
    for v in versions:
        atomic_write(f, v, durable=False)
        seen.add(f.read_text())
    assert seen <= set(versions)
    assert os.listdir(tmp_path) == ["x"]


def test_keep_state_modes_closes_what_is_open_and_follows_no_link(tmp_path: Path) -> None:
    """Folders back to 0700, files to 0600 (an executable bit of the owner stays), a symlink neither followed nor
    changed; a second pass finds nothing; ``fix=False`` only says."""
    import stat as st

    from ambient.storage.fsutil import keep_state_modes

    state = tmp_path / ".ambient"
    (state / "web").mkdir(parents=True)
    (state / "web").chmod(0o700)
    token = state / "web" / "token"
    token.write_text("t")
    outside = tmp_path / "outside"
    outside.write_text("o")
    outside.chmod(0o644)
    (state / "link").symlink_to(outside)
    token.chmod(0o644)
    state.chmod(0o755)
    assert [(r.path, r.was) for r in keep_state_modes(state, fix=False)] == [(str(state), "0755"), (str(token), "0644")]
    assert st.S_IMODE(token.stat().st_mode) == 0o644  # only said
    done = keep_state_modes(state)
    assert [(r.path, r.was, r.now) for r in done] == [(str(state), "0755", "0700"), (str(token), "0644", "0600")]
    assert st.S_IMODE(token.stat().st_mode) == 0o600 and st.S_IMODE(state.stat().st_mode) == 0o700
    assert st.S_IMODE(outside.stat().st_mode) == 0o644
    assert keep_state_modes(state) == []
