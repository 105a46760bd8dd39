"""The one YAML reader: hostile input (S-03) answered with clear errors naming file and line; lines and round trips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from ambient.core.errors import InputError, UnsafePathError, YamlError
from ambient.storage.yamlfile import (
    MAX_DEPTH,
    MAX_WORKFLOW_BYTES,
    dump_yaml,
    expect_mapping,
    load_file,
    parse_yaml,
    problems_from_validation,
    split_frontmatter,
)
from tests.conftest import REPO

# A 9x9x9... "billion laughs": each level multiplies the previous one by 9.
ALIAS_BOMB = "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n" + "".join(
    f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
DEEP_FLOW = "[" * 100_000 + "]" * 100_000
DEEP_MAP = "a: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n"


def err(text: str, source: str = "w.yml") -> YamlError:
    """The YamlError raised for ``text``."""
    with pytest.raises(YamlError) as info:
        parse_yaml(text, source=source)
    return info.value


class TestHostile:
    def test_alias_bomb(self) -> None:
        """An alias bomb is refused at the first alias, with its line, before anything expands."""
        e = err(ALIAS_BOMB)
        assert (e.file, e.line) == ("w.yml", 2) and "aliases" in e.message

    def test_single_alias_refused(self) -> None:
        """Even one harmless alias is refused (the rule is simple: write the value out)."""
        assert err("a: &x 1\nb: *x\n").line == 2

    @pytest.mark.parametrize("text", [DEEP_FLOW, DEEP_MAP], ids=["flow-list", "flow-map"])
    def test_deep_nesting(self, text: str) -> None:
        """100k levels of nesting: a clean error at the depth limit, no RecursionError, no segfault."""
        e = err(text)
        assert f"nesting deeper than {MAX_DEPTH} levels" in e.message and e.line == 1

    def test_depth_limit_is_exact(self) -> None:
        """MAX_DEPTH levels parse; one more does not."""
        assert parse_yaml("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))[0] is not None
        with pytest.raises(YamlError):
            parse_yaml("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))

    def test_huge_file_refused_before_reading(self, tmp_path: Path) -> None:
        """A 1 GiB file is refused from fstat, before a byte is read."""
        big = tmp_path / "big.yml"
        with big.open("wb") as fh:
            fh.truncate(1 << 30)  # sparse: no disk used
        with pytest.raises(InputError) as info:
            load_file(big, max_bytes=MAX_WORKFLOW_BYTES)
        assert info.value.file == str(big) and "1073741824 bytes; the limit" in info.value.message

    def test_non_utf8(self, tmp_path: Path) -> None:
        """Non-UTF-8 bytes are refused with the line of the first bad byte."""
        f = tmp_path / "w.yml"
        f.write_bytes(b"a: 1\nb: 2\nc: caf\xe9\n")
        with pytest.raises(YamlError) as info:
            load_file(f, max_bytes=1024, source="workflows/w.yml")
        assert (info.value.file, info.value.line) == ("workflows/w.yml", 3)
        assert str(info.value) == "workflows/w.yml:3: is not valid UTF-8; brain files must be UTF-8 text"

    def test_duplicate_keys(self) -> None:
        """A duplicate key is refused at the second occurrence, naming the first (PyYAML keeps the last silently)."""
        e = err("signal: RETURN\nother: 1\nsignal: SPAWN\n")
        assert e.line == 3 and "duplicate key 'signal' (first at line 1)" in e.message
        assert err("a:\n  b: 1\n  b: 2\n").line == 3

    @pytest.mark.parametrize(
        "text",
        [
            "x: !!python/object:os.system {}\n",
            "x: !!python/object/apply:os.system [touch PWNED]\n",
            "x: !!python/name:os.system\n",
            "x: !custom 3\n",
        ],
    )
    def test_unsafe_tags(self, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Python object tags (and unknown tags) are refused with their line; nothing is executed."""
        monkeypatch.chdir(tmp_path)
        e = err("ok: 1\n" + text)
        assert e.line == 2 and "could not determine a constructor" in e.message
        assert not (tmp_path / "PWNED").exists()

    def test_symlink_and_fifo(self, tmp_path: Path) -> None:
        """A symlinked file is refused (no follow); a FIFO is not a regular file (and does not block)."""
        real = tmp_path / "real.yml"
        real.write_text("a: 1\n")
        (tmp_path / "link.yml").symlink_to(real)
        with pytest.raises(UnsafePathError):
            load_file(tmp_path / "link.yml", max_bytes=1024)
        os.mkfifo(tmp_path / "fifo.yml")
        with pytest.raises(InputError, match="not a regular file"):
            load_file(tmp_path / "fifo.yml", max_bytes=1024)

    def test_malformed(self) -> None:
        """Malformed YAML says what and where, and what is expected."""
        e = err("a: [1, 2\nb: 3\n")
        assert e.line == 2 and e.message.endswith("expected valid YAML")
        assert err("a: 1\n b: 2\n").line == 2

    def test_malformed_says_where_what_was_left_open_began(self) -> None:
        """A bracket or a quote left open is noticed lines later: the message says where it began too."""
        e = err("workflow: w\nfor_each:\n  items: [a, b\n  spawn: hello\n")
        assert e.line == 4 and "(while parsing a flow sequence started at line 3)" in e.message, e.message
        e = err('a: 1\nb: "open\nc: 3\n')
        assert "started at line 2" in e.message, e.message
        assert "started at line" not in err("a: 1\n b: 2\n").message  # noticed where it is

    @pytest.mark.slow
    def test_rss_stays_sane(self, tmp_path: Path) -> None:
        """In a fresh interpreter, every hostile document together keeps peak RSS well under 200 MB."""
        docs = {
            "bomb": ALIAS_BOMB,
            "flow": DEEP_FLOW,
            "map": DEEP_MAP,
            "dup": "a: 1\na: 2\n",
            "tag": "a: !!python/object:x {}\n",
        }
        for name, text in docs.items():
            (tmp_path / f"{name}.yml").write_text(text)
        script = textwrap.dedent(
            f"""
            import json, resource, sys
            from pathlib import Path
            from ambient.core.errors import InputError
            from ambient.storage.yamlfile import load_file
            out = {{}}
            for f in sorted(Path({str(tmp_path)!r}).glob("*.yml")):
                try:
                    load_file(f, max_bytes=1 << 20)
                    out[f.stem] = "parsed"
                except InputError as exc:
                    out[f.stem] = type(exc).__name__
            # VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child of a big pytest process reports its parent
            hwm = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:")]
            out["maxrss_kb"] = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print(json.dumps(out))
            """
        )
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert {k: v for k, v in result.items() if k != "maxrss_kb"} == dict.fromkeys(docs, "YamlError")
        assert result["maxrss_kb"] < 200 * 1024


class TestReading:
    def test_timestamps_stay_text(self) -> None:
        """A claim's timestamps are kept as the user wrote them."""
        data, _ = parse_yaml("opened_at: 2026-03-16T20:36\nday: 2026-03-16\n")
        assert data == {"opened_at": "2026-03-16T20:36", "day": "2026-03-16"}

    def test_line_map(self) -> None:
        """Every key and item has its line; line_for falls back to the deepest known prefix."""
        _, lines = parse_yaml("a: 1\nchain:\n  - step: 1\n  - step: 2\n    gate: human\n", line_offset=10)
        assert lines.line_for(("chain", 1, "gate")) == 15
        assert lines.line_for(("chain", 1, "missing")) == 14
        assert lines.line_for(("nope",)) == 11

    def test_frontmatter(self) -> None:
        """Frontmatter splits off with its line offset; a missing or unclosed block is an error at line 1."""
        yaml_text, offset, body = split_frontmatter("---\nname: x\n---\n# body\n")
        assert (yaml_text, offset, body) == ("name: x\n", 1, "# body\n")
        _, lines = parse_yaml(yaml_text, line_offset=offset)
        assert lines.line_for(("name",)) == 2
        with pytest.raises(YamlError, match="no YAML frontmatter"):
            split_frontmatter("# title\n", source="a.md")
        with pytest.raises(YamlError, match="not closed"):
            split_frontmatter("---\nname: x\n", source="a.md")

    def test_round_trip_keeps_order_and_unknown_keys(self) -> None:
        """dump_yaml writes block YAML in insertion order, multi-line strings as blocks, readable back."""
        data = {"z": 1, "a": {"unknown": [1, "two"], "when": "2026-03-16T20:36"}, "text": "line1\nline2\n"}
        text = dump_yaml(data)
        assert text.index("z:") < text.index("a:") and "text: |" in text
        assert parse_yaml(text)[0] == data

    def test_shared_objects_are_written_out(self) -> None:
        """A value shared twice is dumped twice, never as an anchor our reader would refuse."""
        shared = [1, 2]
        assert parse_yaml(dump_yaml({"a": shared, "b": shared}))[0] == {"a": [1, 2], "b": [1, 2]}

    def test_expect_mapping(self) -> None:
        """A document that is not a mapping is a clear error at line 1."""
        assert expect_mapping({"a": 1}, source="f", what="a workflow") == {"a": 1}
        with pytest.raises(YamlError, match="a workflow must be a YAML mapping"):
            expect_mapping(["x"], source="f", what="a workflow")
        with pytest.raises(YamlError, match="got empty"):
            expect_mapping(None, source="f", what="a claim")

    def test_problems_from_validation(self) -> None:
        """pydantic errors become file:line problems with the field path."""

        class M(BaseModel):
            name: str
            n: int

        data, lines = parse_yaml("name: x\nn: many\n")
        with pytest.raises(ValidationError) as info:
            M.model_validate(data)
        (problem,) = problems_from_validation(info.value, file="f.yml", lines=lines)
        assert str(problem).startswith("f.yml:2: n: Input should be a valid integer") and "'many'" in str(problem)

    def test_a_value_where_a_block_goes_says_a_mapping_is_expected_never_the_class_name(self) -> None:
        """A text where a nested model goes is said in the file's words: a mapping, an example with its first key,
        the keys it takes; never pydantic's "instance of <Model>" (the model's class is no word of the file)."""

        class Hook(BaseModel, extra="forbid"):
            urls: list[str] = []
            retries: int = 1

        class Plain(BaseModel):
            limit: float = 1.0

        class Top(BaseModel, extra="forbid"):
            hook: Hook = Hook()
            plain: Plain = Plain()

        data, lines = parse_yaml('hook: "json://x"\nplain: [1]\n')
        with pytest.raises(ValidationError) as info:
            Top.model_validate(data)
        hook, plain = problems_from_validation(info.value, file="f.yml", lines=lines, model=Top)
        assert str(hook) == (
            "f.yml:1: hook: expected a mapping (key: value), e.g. hook: {urls: [...]}; its keys: urls, retries "
            "(got 'json://x')"
        )
        expected = "f.yml:2: plain: expected a mapping (key: value), e.g. plain: {limit: ...}; its keys: limit"
        assert str(plain) == expected
        (bare, _) = problems_from_validation(info.value, file="f.yml", lines=lines)
        assert str(bare) == "f.yml:1: hook: expected a mapping (key: value) (got 'json://x')"

    def test_empty_document(self) -> None:
        """An empty document is None with no lines."""
        assert parse_yaml("")[0] is None


# -- the dumper: a direct path for simple documents, PyYAML for the rest (hypothesis)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_keys = st.one_of(
    st.sampled_from(["status", "yes", "on", "null", "sess_id", "1", "a b", "x:y", "-", "_k"]),
    st.text(min_size=1, max_size=12),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.sampled_from(
        [
            "2026-11-30T14:07",
            "yes",
            "No",
            "~",
            "null",
            "0x1F",
            "1e3",
            ".inf",
            "- a",
            "a: b",
            "#x",
            "'q'",
            '"d"',
            "{a}",
            "[b]",
            "&x",
            "*y",
            "!t",
            "%p",
            "@z",
            "`w",
            "a #b",
            " lead",
            "trail ",
            "projects/x/item-00001.md",
            "run-20261130--item.7",
            "multi\nline",
            "tab\there",
            "é ü 漢",
        ]
    ),
    st.text(max_size=20),
)
_docs = st.recursive(
    st.dictionaries(_keys, st.one_of(_scalars, st.lists(_scalars, max_size=4)), max_size=6),
    lambda inner: st.dictionaries(_keys, st.one_of(_scalars, st.lists(_scalars, max_size=3), inner), max_size=5),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_docs)
def test_dump_yaml_round_trips_through_our_parser_and_pyyaml(doc: dict[str, object]) -> None:
    """Whatever path dump_yaml takes, our parser and PyYAML's safe loader read back the very document."""
    import yaml

    from ambient.storage.yamltext import dump_yaml, parse_yaml

    text = dump_yaml(doc)
    assert parse_yaml(text, source="t.yml")[0] == (doc or {})
    assert (yaml.safe_load(text) or {}) == doc


def test_dump_yaml_fast_path_quotes_what_yaml_would_reinterpret() -> None:
    """Dates, booleans, numbers and indicators are quoted; paths and ids stay plain."""
    from ambient.storage.yamltext import dump_yaml

    text = dump_yaml(
        {
            "opened_at": "2026-11-30T14:07",
            "flag": "yes",
            "count": "12",
            "scope": "projects/a-1.md",
            "angle": "deploy: item-1",
            "result": {"status": "ok"},
            "list": ["a", "on"],
        }
    )
    assert text == (
        'opened_at: "2026-11-30T14:07"\nflag: "yes"\ncount: "12"\nscope: projects/a-1.md\n'
        'angle: "deploy: item-1"\nresult:\n  status: ok\nlist:\n- a\n- "on"\n'
    )


def test_a_document_that_takes_too_long_to_read_is_a_problem_at_the_line_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loader's time budget: past it, a YamlError at the line it reached, not a loader that holds on. (The
    comments put the document outside the subset read in one pass, which is linear in the capped size.)"""
    from ambient.storage import yamlfile, yamltext

    monkeypatch.setattr(yamltext, "PARSE_BUDGET_S", -1.0)
    text = "items:\n" + "".join(f"  - {i}  # n\n" for i in range(600))
    assert yamltext.parse_yaml(text, source="w.yml")[0] == {"items": list(range(600))}  # no clock: pure, no budget
    with pytest.raises(YamlError) as info:
        yamlfile.parse_yaml(text, source="w.yml")
    assert "took more than" in info.value.message
    assert info.value.file == "w.yml" and info.value.line is not None and info.value.line > 1


def test_the_workflow_value_count_gives_up_past_its_budget_and_the_depth_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pre-check that counts a workflow's values stops (leaving the bounded parse to tell) past its time budget
    or past the nesting bound; within both it still finds the line where a document passes the limit."""
    from ambient.config import workflows

    many = "items: [" + ", ".join("x" for _ in range(30)) + "]\n"
    assert workflows._too_many_values(many, limit=20) == 1
    assert workflows._too_many_values("a: " + "[" * 80 + "x" + "]" * 80 + "\n" + many, limit=20) is None
    monkeypatch.setattr(workflows, "COUNT_BUDGET_S", -1.0)
    long = "items: [" + ", ".join("x" for _ in range(3000)) + "]\n"
    assert workflows._too_many_values(long, limit=2500) is None
