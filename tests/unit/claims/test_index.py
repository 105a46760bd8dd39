"""The claims census (``ambient.claims.index``): ClaimStore.load's verdicts, parsing only the files that changed."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from ambient.claims.claim import ClaimFacts
from ambient.claims.index import _RULES, INDEX_NAME, ClaimCensus, census
from ambient.claims.store import ClaimStore
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import ambient_cli


def _claim(sid: str, status: str = "open", extra: str = "") -> str:
    return (
        f"sess_id: {sid}\ntype: satellite\nscope: projects/{sid}.md\nagent: worker\nstatus: {status}\n"
        f'opened_at: "2026-11-30T10:00"\n{extra}'
    )


@pytest.fixture
def brain(tmp_path: Path) -> BrainPaths:
    root = tmp_path / "brain"
    (root / "claims").mkdir(parents=True)
    (root / ".ambient").mkdir()
    paths = BrainPaths(root)
    claims = paths.claims
    (claims / "sess-a.yml").write_text(_claim("sess-a"))
    (claims / "sess-b.yml").write_text(_claim("sess-b", "closed"))
    (claims / "sess-c.yaml").write_text(_claim("sess-c", "paused", "ttl: 2h\n"))
    (claims / "sess-d.yml").write_text(_claim("sess-d", "waiting_human", "type_extra: kept\n"))
    (claims / "broken.yml").write_text("sess_id: sess-x\nstatus: [unclosed\n")  # not YAML
    (claims / "invalid.yml").write_text("sess_id: sess-y\nstatus: open\n")  # YAML, not a claim
    (claims / "sess-a-copy.yml").write_text(_claim("sess-a"))  # a second file for sess-a
    (claims / "link.yml").symlink_to(claims / "sess-b.yml")
    (claims / ".hidden.yml").write_text(_claim("sess-h"))
    (claims / "notes.txt").write_text("not a claim")
    return paths


def _expected(paths: BrainPaths) -> ClaimCensus:
    loaded = ClaimStore(paths, check_filesystem=False).load()
    return ClaimCensus(
        facts={sid: ClaimFacts.of(c) for sid, c in loaded.claims.items()},
        files={sid: paths.rel(p) for sid, p in loaded.files.items()},
        problems=loaded.problems,
    )


def _same(got: ClaimCensus, want: ClaimCensus) -> None:
    assert got.facts == want.facts
    assert got.files == want.files
    assert [str(p) for p in got.problems] == [str(p) for p in want.problems]


def _census(paths: BrainPaths) -> ClaimCensus:
    return census(ClaimStore(paths, check_filesystem=False))


def test_census_gives_what_load_gives(brain: BrainPaths) -> None:
    want = _expected(brain)
    assert set(want.facts) == {"sess-a", "sess-b", "sess-c", "sess-d"}
    assert len(want.problems) >= 4  # broken, invalid, the copy of sess-a, the symlink
    first = _census(brain)
    _same(first, want)
    assert first.count("open", "waiting_human", "paused") == 3
    second = _census(brain)  # from the index
    _same(second, want)
    assert second.parsed == 1  # the symlink only: never indexed, refused each time
    assert (brain.state / INDEX_NAME).is_file()


def test_only_changed_files_are_read_again(brain: BrainPaths) -> None:
    _census(brain)
    path = brain.claims / "sess-a-copy.yml"  # the file sess-a is read from (the first by name)
    old = path.stat()
    # A person closes sess-a: same size, and the old mtime put back. The ctime still tells.
    text = _claim("sess-a").replace("status: open", "status: stale").replace("agent: worker", "agent: worke")
    path.write_text(text)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert path.stat().st_size == old.st_size and path.stat().st_mtime_ns == old.st_mtime_ns
    (brain.claims / "sess-b.yml").unlink()
    (brain.claims / "sess-e.yml").write_text(_claim("sess-e"))
    (brain.claims / "broken.yml").write_text(_claim("sess-f", "closed"))  # a person mends a file
    got = _census(brain)
    _same(got, _expected(brain))
    assert got.parsed == 4  # sess-a, sess-e, the mended file, the symlink (now dangling)
    assert got.facts["sess-a"].status == "stale" and "sess-b" not in got.facts and "sess-f" in got.facts


@pytest.mark.parametrize(
    "index",
    [
        b"",
        b"{not json",
        b'{"format": 1, "code": "other code", "files": {}}',
        b"[1, 2, 3]",
        b'{"format": 1, "code": "CODE", "files": {"sess-a.yml": [[1, 2], {"sess_id": "forged"}, []]}}',
    ],
    ids=["empty", "torn", "other-code", "not-a-map", "malformed-entry"],
)
def test_a_bad_or_foreign_index_is_rebuilt(brain: BrainPaths, index: bytes) -> None:
    _census(brain)
    code = json.loads((brain.state / INDEX_NAME).read_bytes())["code"]
    (brain.state / INDEX_NAME).write_bytes(index.replace(b"CODE", code.encode()))
    got = _census(brain)
    _same(got, _expected(brain))
    assert got.parsed >= 1


def test_an_index_from_other_code_is_not_trusted(brain: BrainPaths) -> None:
    _census(brain)
    data = json.loads((brain.state / INDEX_NAME).read_bytes())
    entry = data["files"]["sess-a-copy.yml"]  # where sess-a is read from
    entry[1][2] = "closed"  # what older rules might have said of the file
    data["code"] = "0" * 16
    (brain.state / INDEX_NAME).write_text(json.dumps(data))
    assert _census(brain).facts["sess-a"].status == "open"


def test_an_index_that_cannot_be_written_costs_only_speed(brain: BrainPaths) -> None:
    (brain.state / INDEX_NAME).mkdir()  # the rename onto it fails
    first = _census(brain)
    _same(first, _expected(brain))
    again = _census(brain)
    _same(again, _expected(brain))
    assert again.parsed == first.parsed  # nothing was kept, all parsed again
    assert not list(brain.state.glob(f".{INDEX_NAME}*"))  # no temp file left behind


def test_no_claims_folder(tmp_path: Path) -> None:
    got = _census(BrainPaths(tmp_path))
    assert got.facts == {} and got.problems == []


@pytest.mark.slow
def test_status_counts_open_claims_through_the_index(brain: BrainPaths) -> None:
    done = ambient_cli(brain.root, "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["claims"]["open"] == 3
    (brain.claims / "sess-d.yml").write_text(_claim("sess-d", "closed"))  # edited between two looks
    done = ambient_cli(brain.root, "status", "--json")
    data = json.loads(done.stdout)
    assert data["claims"]["open"] == 2
    assert any("broken.yml" in p for p in data["claims"]["problems"])


@pytest.mark.slow
@pytest.mark.parametrize("statuses", [("open",), ("open", "paused"), ("closed",), ("failed",)])
def test_claim_list_by_status_reads_only_those_and_says_the_same(brain: BrainPaths, statuses: tuple[str, ...]) -> None:
    every = ambient_cli(brain.root, "claim", "list")  # the full path: every claim loaded
    assert every.returncode == 0, every.stderr
    want = [line for line in every.stdout.splitlines() if line.split()[1] in statuses]
    args = [arg for s in statuses for arg in ("--status", s)]
    picked = ambient_cli(brain.root, "claim", "list", *args)  # the census, then only those files
    assert picked.returncode == 0, picked.stderr
    assert picked.stdout.splitlines() == (want or ["No claims."])
    assert picked.stderr == every.stderr  # the same problems, in the same order
    as_json = json.loads(ambient_cli(brain.root, "claim", "list", *args, "--json").stdout)
    assert [row["sess_id"] for row in as_json] == [line.split()[0] for line in want]


@pytest.mark.slow
def test_doctor_and_validate_use_the_index_and_write_none(brain: BrainPaths) -> None:
    index = brain.state / INDEX_NAME
    for sub in ("agents", "workflows", "locks", "profil"):  # a brain doctor recognises
        (brain.root / sub).mkdir()
    for args in (("doctor",), ("validate",)):
        done = ambient_cli(brain.root, *args)
        assert "broken.yml" in done.stdout + done.stderr, (args, done.stdout, done.stderr)
        assert not index.exists(), args  # they promise to write nothing
    _census(brain)
    before = index.read_bytes()
    done = ambient_cli(brain.root, "validate")
    assert "broken.yml" in done.stdout + done.stderr and index.read_bytes() == before


def test_the_index_code_covers_the_modules_that_judge_claims() -> None:
    """An index is trusted only by the code that wrote it: every module that reads or validates claims is found and
    hashed (moving the modules into packages once left only ambient's version in the hash)."""
    assert {"ambient.claims.claim", "ambient.claims.claimfile", "ambient.storage.yamltext"} <= set(_RULES)
    for name in _RULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None and Path(spec.origin).is_file(), name
