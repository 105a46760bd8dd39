"""The console's cache of what it derived from a file: served again while the file is the same file, unchanged;
derived again once it changed; bounded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ambient.web.filecache import FileCache


def _counting(calls: list[Path]) -> Callable[[Path], str]:
    def derive(path: Path) -> str:
        calls.append(path)
        return path.read_text() if path.exists() else "<missing>"

    return derive


def test_an_unchanged_file_is_derived_once_and_a_changed_one_again(tmp_path: Path) -> None:
    f = tmp_path / "j.jsonl"
    f.write_text("a\n")
    calls: list[Path] = []
    cache: FileCache[str] = FileCache(4)
    derive = _counting(calls)
    assert cache.get(f, None, derive) == "a\n"
    assert cache.get(f, None, derive) == "a\n"
    assert len(calls) == 1
    assert cache.get(f, ("other", "key"), derive) == "a\n"
    assert len(calls) == 2  # what the caller derived it with is part of the key
    with f.open("a") as fh:
        fh.write("b\n")
    assert cache.get(f, None, derive) == "a\nb\n"
    replaced = tmp_path / "new"
    replaced.write_text("c\n")
    replaced.replace(f)  # another inode at the same path
    assert cache.get(f, None, derive) == "c\n"
    assert len(calls) == 4


def test_a_missing_file_is_not_kept_and_the_oldest_value_goes_first(tmp_path: Path) -> None:
    calls: list[Path] = []
    cache: FileCache[str] = FileCache(2)
    derive = _counting(calls)
    gone = tmp_path / "gone"
    assert cache.get(gone, None, derive) == "<missing>"
    assert cache.get(gone, None, derive) == "<missing>"
    assert len(calls) == 2
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_text(f.name)
        cache.get(f, None, derive)
    calls.clear()
    cache.get(files[2], None, derive)
    cache.get(files[1], None, derive)
    assert calls == []
    cache.get(files[0], None, derive)
    assert calls == [files[0]]  # dropped when the third came in
    cache.clear()
    cache.get(files[1], None, derive)
    assert calls == [files[0], files[1]]
