"""A hostile YAML document is a ``file:line`` problem wherever it is dropped, never a crash.

Explicit tags (``!!int x``, ``!!bool maybe``, ``!!timestamp foo``...), integers past Python's 4,300-digit limit
and merge keys (``<<:``) used to escape the safe loader as ValueError, KeyError, AttributeError (or to overwrite a
key silently). The loader is tested directly (examples and a hypothesis fuzz: data or YamlError, nothing else), then
each kind of brain file is attacked through the real CLI and the real daemon.
"""

from __future__ import annotations

import contextlib
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambient.core.errors import YamlError
from ambient.human.escalation_store import to_yaml
from ambient.human.escalations import EscalationDraft, new_escalation
from ambient.storage.fsutil import atomic_write
from ambient.storage.paths import BrainPaths
from ambient.storage.yamltext import MAX_DEPTH, parse_yaml
from tests.e2e.helpers import (
    DaemonProcess,
    ambient_cli,
    drop,
    finished_run,
    foreach_workflow,
    lock_files,
    make_brain,
    running,
    stub_agent_md,
    wait_for,
)

HUGE_INT = "9" * 5000

# (document, line of the offending node): each was an uncaught exception (or a silent overwrite) before.
HOSTILE = {
    "int-tag": ("a: 1\nb: !!int x\n", 2),
    "float-tag": ("a: 1\nb: !!float x\n", 2),
    "bool-tag": ("a: 1\nb: !!bool maybe\n", 2),
    "timestamp-tag": ("a: 1\nb: !!timestamp foo\n", 2),
    "timestamp-range": ("a: 1\nb: !!timestamp 2020-13-45\n", 2),
    "int-tag-empty": ("a: 1\nb: !!int ''\n", 2),
    "int-tag-sign": ("a: 1\nb: !!int '-'\n", 2),
    "int-tag-0b": ("a: 1\nb: !!int '0b'\n", 2),
    "verbatim-int": ("a: 1\nb: !<tag:yaml.org,2002:int> x\n", 2),
    "huge-int": (f"a: 1\nb: {HUGE_INT}\n", 2),
    "huge-int-tag": (f"a: 1\nb: !!int {HUGE_INT}\n", 2),
    "huge-hex": ("a: 1\nb: 0x" + "f" * 5000 + "\n", 2),
    "huge-sexagesimal": ("a: 1\nb: !!int 1" + ":59" * 3000 + "\n", 2),
    "huge-int-key": (f"a: 1\n{HUGE_INT}: x\n", 2),
    "nested": ("a:\n  b:\n    - 1\n    - !!float nope\n", 4),
    "binary": ("a: 1\nb: !!binary aGVsbG8=\n", 2),
    "set": ("a: 1\nb: !!set {x: null}\n", 2),
    "omap": ("a: 1\nb: !!omap [x: 1]\n", 2),
    "pairs": ("a: 1\nb: !!pairs [x: 1]\n", 2),
    "merge-then-key": ("a: 1\n<<: {b: 1}\nb: 2\n", 3),
    "key-then-merge": ("a: 1\nb: 2\n<<: {b: 1}\n", 3),
    "merge-twice": ("a: 1\n<<: [{b: 1}, {b: 2}]\n", 2),
    "merge-nested": ("a: 1\n<<: {<<: {b: 1}}\nb: 2\n", 3),
    "same-int-key": ("a: 1\n1: x\n0x1: y\n", 3),
    "same-bool-key": ("a: 1\nyes: x\ntrue: y\n", 3),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_document_is_a_line_problem(name: str) -> None:
    """Each hostile document raises the loader's own YamlError naming the file and the offending node's line."""
    text, line = HOSTILE[name]
    with pytest.raises(YamlError) as info:
        parse_yaml(text, source="w.yml")
    assert (info.value.file, info.value.line) == ("w.yml", line), info.value
    assert "sys.set_int_max_str_digits" not in info.value.message  # Python's advice is not the user's fix


def test_hostile_line_counts_the_frontmatter_offset() -> None:
    """In an agent's frontmatter the line is the file's, not the YAML block's."""
    with pytest.raises(YamlError) as info:
        parse_yaml("name: x\nb: !!bool maybe\n", source="agents/x.md", line_offset=1)
    assert info.value.line == 3


def test_well_formed_tags_still_read() -> None:
    """Valid explicit tags keep working; an explicit timestamp stays the user's text, as implicit ones do."""
    data, _ = parse_yaml(
        "a: !!int '12'\nb: !!float '1.5'\nc: !!bool yes\nd: !!str 7\ne: !!null ''\nf: !!timestamp 2026-03-16T20:36:00\n"
        "g: 0x10\n",
        source="w.yml",
    )
    assert data == {"a": 12, "b": 1.5, "c": True, "d": "7", "e": None, "f": "2026-03-16T20:36:00", "g": 16}


def test_merge_without_duplicates_reads() -> None:
    """A merge that gives keys no one else gives is read as YAML says."""
    data, lines = parse_yaml("a: 1\n<<: [{b: 2}, {c: 3}]\nd: 4\n", source="w.yml")
    assert data == {"a": 1, "b": 2, "c": 3, "d": 4}
    assert (lines.line_for(("b",)), lines.line_for(("d",))) == (2, 3)


def test_int_at_the_limit_reads() -> None:
    """4,300 digits is Python's limit, not a problem; one more is."""
    data, _ = parse_yaml("a: " + "9" * 4300 + "\n", source="w.yml")
    assert data["a"] == int("9" * 4300)


# ---------------------------------------------------------------- fuzz

TAGS = [
    "",
    "!!int ",
    "!!float ",
    "!!bool ",
    "!!null ",
    "!!str ",
    "!!timestamp ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!!pairs ",
    "!!seq ",
    "!!map ",
    "!!merge ",
    "!!value ",
    "!!yaml ",
    "!!python/object:os.system ",
    "!!python/name:os.system ",
    "!!python/object/apply:os.system ",
    "!<tag:yaml.org,2002:int> ",
    "!local ",
    "! ",
    "!!unknown ",
]
SCALARS = st.one_of(
    st.sampled_from(
        [
            "x",
            "maybe",
            "yes",
            "0",
            "-",
            "+",
            "''",
            "0b",
            "0x",
            "0o9",
            "1:2:x",
            "190:20:30",
            ".",
            ".inf",
            "-.nan",
            "1e999",
            "1_000",
            "2026-03-16",
            "2026-13-45",
            "2001-12-14t21:59:43.10-05:00",
            "2001-01-01 25:00:00",
            "aGVsbG8=",
            "'%%%'",
            "~",
            "<<",
            "=",
            HUGE_INT,
            "0x" + "f" * 5000,
            "1" + ":59" * 3000,
            "9" * 4301,
            "1." + "1" * 400,
        ]
    ),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=12).map(lambda s: '"' + s.replace('"', "") + '"'),
    st.from_regex(r"[-+0-9a-fA-Fxob_.:eE ]{0,12}", fullmatch=True),
)


@st.composite
def nodes(draw: st.DrawFn, depth: int = 0) -> str:
    """A flow-style YAML node with an optional tag: a scalar, a sequence, a mapping or a merge."""
    tag = draw(st.sampled_from(TAGS))
    kind = draw(st.sampled_from(["scalar", "scalar", "seq", "map", "merge"] if depth < 4 else ["scalar"]))
    if kind == "scalar":
        return tag + draw(SCALARS)
    children = draw(st.lists(nodes(depth + 1), max_size=3))
    if kind == "seq":
        return tag + "[" + ", ".join(children) + "]"
    keys = draw(st.lists(st.one_of(SCALARS, st.sampled_from(["<<", "a", "b"])), min_size=len(children)))
    pairs = [f"{k}: {v}" for k, v in zip(keys, children, strict=False)]
    if kind == "merge":
        pairs.append("<<: " + draw(st.sampled_from(["{a: 1}", "[{a: 1}, {b: 2}]", "x", "[x]", "{<<: {a: 2}}"])))
    return tag + "{" + ", ".join(pairs) + "}"


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A block mapping of tagged flow nodes, sometimes with anchors, aliases, deep nesting or merges."""
    entries = draw(st.lists(nodes(), min_size=1, max_size=4))
    lines = [f"k{i}: {v}" for i, v in enumerate(entries)]
    extra = draw(
        st.sampled_from(
            [
                "",
                "m: &a [1, 2]\nn: *a\n",
                "<<: {k0: 1}\n",
                "<<: [{z: 1}, {z: 2}]\n",
                "d: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n",
                "lol: &l [lol, lol]\nlol2: [*l, *l, *l]\n",
            ]
        )
    )
    return "\n".join(lines) + "\n" + extra


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_fuzz_loader_returns_data_or_yaml_error(text: str) -> None:
    """Whatever the tags, scalars and structures: data, or the loader's own error with the file; nothing else."""
    try:
        parse_yaml(text, source="f.yml")
    except YamlError as exc:
        assert exc.file == "f.yml"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("!:[]{}-?&*<>|'\",# \n\tx01.")), max_size=60))
def test_fuzz_loader_on_raw_syntax(text: str) -> None:
    """Raw YAML punctuation in any order: data or the loader's own error."""
    try:
        parse_yaml(text, source="f.yml")
    except YamlError as exc:
        assert exc.file == "f.yml"


READER_KEYS = {
    "workflow": ["concurrency", "scope", "on_return", "timeout_s"],
    "agent": ["name", "brain", "ambient", "type"],
    "config": ["tick_seconds", "concurrency", "notify", "log_level", "runners"],
    "routing": ["version", "default", "routes"],
    "zones": ["project", "ops"],
    "lock": ["file", "holder", "expires_at", "ttl_min", "pid"],
    "claim": ["sess_id", "type", "status", "opened_at", "attempt"],
}


@pytest.mark.parametrize("reader", list(READER_KEYS))
def test_fuzz_each_reader_gives_problems_not_exceptions(tmp_path: Path, reader: str) -> None:
    """Past the loader, each reader of a brain file turns tagged, odd or merged values into problems (or its
    documented InputError), never another exception."""
    from ambient.claims.lockfile import parse_lock
    from ambient.claims.store import ClaimStore
    from ambient.config.brain import read_settings
    from ambient.config.workflows import load_workflow_bytes
    from ambient.core.errors import InputError
    from ambient.kernel.agents import load_agent
    from ambient.kernel.routing_table import load_routing, load_zone_rules

    paths = make_brain(tmp_path / "brain", example_agents=False)

    def read(text: str) -> None:
        if reader == "workflow":
            load_workflow_bytes(f"workflow: w\nfor_each:\n  items: [a]\n  spawn: stub\n{text}".encode(), source="w.yml")
        elif reader == "agent":
            (paths.agents / "x.md").write_text(f"---\nname: x\n{text}---\n")
            load_agent(paths.agents / "x.md", source="agents/x.md")
        elif reader == "config":
            paths.config.write_text(text)
            read_settings(paths, {})
        elif reader in ("routing", "zones"):
            (paths.routing if reader == "routing" else paths.zones).write_text(text)
            load_routing(paths) if reader == "routing" else load_zone_rules(paths)
        elif reader == "lock":
            with contextlib.suppress(InputError):
                parse_lock(text.encode(), "locks/x.lock")
        else:
            (paths.claims / "x.yml").write_text(text)
            with contextlib.suppress(InputError):
                ClaimStore(paths).read(paths.claims / "x.yml")

    keys = st.lists(st.sampled_from(READER_KEYS[reader]), min_size=1, max_size=3, unique=True)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        indent = "  " if reader == "workflow" else ""
        read("".join(f"{indent}{k}: {data.draw(nodes())}\n" for k in data.draw(keys)))

    fuzz()


# ---------------------------------------------------------------- hostile brain files, through the CLI and the daemon


def _escalation_text(esc_id: str) -> str:
    esc = new_escalation(
        EscalationDraft(workflow="good", run_id="sess-x", kind="fail", question="?", item="a"),
        now=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return to_yaml(esc.model_copy(update={"id": esc_id}))


def _with_line(text: str, old: str, new: str) -> tuple[str, int]:
    """``text`` with the line ``old`` replaced by ``new``, and the line number it is on."""
    lines = text.splitlines()
    at = lines.index(old)
    lines[at] = new
    return "\n".join(lines) + "\n", at + 1


def hostile_files() -> dict[str, tuple[str, str, int]]:
    """Kind → (brain-relative path, hostile text, line of the hostile node): one of each file ambient reads."""
    esc, esc_line = _with_line(_escalation_text("esc-hostil"), "reminded: false", "reminded: !!bool maybe")
    lock = (
        'file: "projets/x.md"\nholder: "someone"\nclaimed_at: "2026-01-01T00:00:00+00:00"\n'
        'expires_at: "2099-01-01T00:00:00+00:00"\nttl_min: !!int x\n'
    )
    return {
        "workflow": ("workflows/hostile.yml", "workflow: hostile\nfor_each:\n  items: [a]\n  spawn: !!int x\n", 4),
        "workflow-merge": (
            "workflows/hostile.yml",
            "workflow: hostile\nfor_each:\n  <<: {spawn: stub}\n  items: [a]\n  spawn: stub\n",
            5,
        ),
        "agent": ("agents/hostile.md", "---\nname: hostile\ntype: agent\ntimeout: !!float x\n---\n# hostile\n", 4),
        "config": ("profil/ambient.yml", "tick_seconds: 30\nconcurrency: !!bool maybe\n", 2),
        "routing": ("profil/routing.yml", f"version: 1\ndefault: matrix\nroutes: {HUGE_INT}\n", 3),
        "zones": ("profil/zones.yml", "project: [projets/]\nops: !!timestamp foo\n", 2),
        "escalation": (".ambient/escalations/esc-hostil.yml", esc, esc_line),
        "lock": ("locks/hostile.lock", lock, 5),
        "claim": ("claims/hostile.yml", f"sess_id: hostile\ntype: satellite\nstatus: open\nattempt: {HUGE_INT}\n", 4),
    }


HOSTILE_KINDS = list(hostile_files())
# What each command must say about the file: validate checks these kinds (exit 1); the others are no config.
VALIDATED = {"workflow", "workflow-merge", "agent", "config", "routing", "zones", "claim"}
LISTED_BY = {"escalations": "escalation", "lock list": "lock", "claim list": "claim"}
# The daemon's own log names these at file:line (claims, locks, escalations: `doctor` and their own listings do).
# doctor: an unreadable lock or claim is a warning (exit 0), any other file that does not load an error (exit 1).
DOCTOR_WARNS = {"lock", "claim"}
DAEMON_TELLS = {"workflow", "workflow-merge", "agent", "config", "routing", "zones"}


def _brain(tmp_path: Path, kind: str) -> tuple[BrainPaths, str, int]:
    """A brain with a stub agent, a good workflow and the hostile file of ``kind``."""
    paths = make_brain(tmp_path / "brain", agents={"stub": stub_agent_md("stub", ["--sleep-ms", "10-20"])})
    (paths.workflows / "good.yml").write_text(foreach_workflow("good", ["a", "b"]))
    rel, text, line = hostile_files()[kind]
    target = paths.root / rel
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    target.write_text(text)
    return paths, rel, line


def _no_traceback(result: subprocess.CompletedProcess[str], what: str) -> str:
    out = result.stdout + result.stderr
    assert "Traceback" not in out, f"{what}: {out[-2000:]}"
    return out


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_cli_tells_the_hostile_file_at_its_line_and_keeps_working(tmp_path: Path, kind: str) -> None:
    """Every reading command on a brain holding one hostile file: its documented exit code, no traceback, and the
    file at the hostile node's line where the command looks at that kind of file (validate, doctor, the listings)."""
    paths, rel, line = _brain(tmp_path, kind)
    where = f"{rel}:{line}: "
    expected = {"validate": 1 if kind in VALIDATED else 0, "doctor": 0 if kind in DOCTOR_WARNS else 1}
    for command in ("validate", "status", "claim list", "escalations", "lock list", "rules", "doctor"):
        result = ambient_cli(paths.root, *command.split(), timeout=120)
        out = _no_traceback(result, command)
        assert result.returncode == expected.get(command, 0), (command, out[-2000:])
        if command == "doctor" or (command == "validate" and kind in VALIDATED) or LISTED_BY.get(command) == kind:
            assert where in out, (command, out[-2000:])


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_daemon_starts_and_runs_the_other_workflows_beside_a_hostile_file(tmp_path: Path, kind: str) -> None:
    """``ambient run --until-idle`` beside one hostile file: it starts, runs the good workflow to success, logs the
    file at its line (the files it loads itself) and ends cleanly. A routing table that does not load restricts every
    sender to nothing until fixed (fail closed, by design): there the good workflow waits instead."""
    paths, rel, line = _brain(tmp_path, kind)
    result = ambient_cli(paths.root, "run", "--until-idle", "--log-format", "json", timeout=120)
    out = _no_traceback(result, "run --until-idle")
    assert result.returncode == 0, out[-2000:]
    if kind in DAEMON_TELLS:
        assert f"{rel}:{line}" in out, out[-2000:]
    good = finished_run(paths, "good")
    if kind == "routing":
        assert good is None
    else:
        assert good is not None and good.outcome == "success", out[-2000:]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("workflow: hostile\nfor_each:\n  items: [a]\n  spawn: stub\n  concurrency: !!int x\n", 5),
        ("workflow: hostile\nfor_each: " + "[" * 40_000 + "\n", 2),  # 40 KB of nesting, dropped while it runs
    ],
    ids=["tag", "deep"],
)
def test_a_workflow_dropped_after_a_hostile_one_runs(tmp_path: Path, text: str, line: int) -> None:
    """A running daemon: a hostile workflow is told at file:line and the workflow dropped after it still runs."""
    paths = make_brain(tmp_path / "brain", agents={"stub": stub_agent_md("stub", ["--sleep-ms", "10-20"])})
    with running(paths) as daemon:
        drop(paths, "hostile.yml", text)
        drop(paths, "good.yml", foreach_workflow("good", ["a", "b"]))
        good = wait_for(lambda: finished_run(paths, "good"), 30, f"good to finish; tail: {daemon.tail()}")
        assert good.outcome == "success"
        assert any(f"workflows/hostile.yml:{line}" in entry for entry in daemon.lines()), daemon.tail(20)
        assert not any("Traceback" in line for line in daemon.lines())
        assert daemon.stop() == 0


def test_a_decision_is_applied_beside_a_hostile_escalation_file(tmp_path: Path) -> None:
    """An item fails and escalates; a hostile escalation file lies beside it. ``escalations`` lists the real one and
    tells the hostile file at its line, ``decide`` is accepted, and the next daemon applies it: the run ends."""
    agent = stub_agent_md("stub", ["--sleep-ms", "10-20", "--fail-items", "a"])
    paths = make_brain(tmp_path / "brain", agents={"stub": agent})
    (paths.workflows / "good.yml").write_text(foreach_workflow("good", ["a", "b"]))
    first = ambient_cli(paths.root, "run", "--until-idle", timeout=120)
    _no_traceback(first, "first run")
    pending = [p.stem for p in paths.escalations.glob("esc-*.yml")]
    assert len(pending) == 1, first.stdout + first.stderr
    text, line = _with_line(_escalation_text("esc-hostil"), "reminded: false", "reminded: !!bool maybe")
    atomic_write(paths.escalations / "esc-hostil.yml", text, mode=0o600)

    listed = ambient_cli(paths.root, "escalations")
    out = _no_traceback(listed, "escalations")
    assert listed.returncode == 0 and pending[0] in out and f".ambient/escalations/esc-hostil.yml:{line}: " in out
    decided = ambient_cli(paths.root, "decide", pending[0], "skip")
    assert decided.returncode == 0, _no_traceback(decided, "decide")
    second = ambient_cli(paths.root, "run", "--until-idle", timeout=120)
    _no_traceback(second, "second run")
    assert finished_run(paths, "good") is not None, second.stdout + second.stderr
    assert "status: answered\ndecision: skip" in (paths.escalations / f"{pending[0]}.yml").read_text()


def test_a_hostile_lock_under_a_running_item_neither_holds_it_nor_stops_a_restart(tmp_path: Path) -> None:
    """The lock of a running item is rewritten with a hostile value: the item still ends, the run finishes, the
    daemon stops cleanly and starts again."""
    paths = make_brain(tmp_path / "brain", agents={"stub": stub_agent_md("stub", ["--sleep-ms", "3000-3000"])})
    with running(paths) as daemon:
        (paths.workflows / "good.yml").write_text(foreach_workflow("good", ["a"]))
        lock = wait_for(lambda: [p for p in lock_files(paths) if p.suffix == ".lock"], 15, "the item's lock")[0]
        text, _ = _with_line(lock.read_text(), "ttl_min: 60", "ttl_min: !!int x")
        atomic_write(lock, text)
        good = wait_for(lambda: finished_run(paths, "good"), 30, f"good to finish; tail: {daemon.tail()}")
        assert good.outcome == "success"
        assert daemon.stop() == 0
    again = DaemonProcess(paths).start()
    try:
        again.wait_ready()
        assert again.stop() == 0
    finally:
        again.kill()
    assert not any("Traceback" in line for line in again.lines())
    listed = ambient_cli(paths.root, "lock", "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr


# ---------------------------------------------------------------- deep nesting: bounded in depth and time everywhere

#: 40 KB of opening brackets, braces or dashes: each level is cheap to write and was costly to count.
DEEP = {
    "brackets": "[" * 40_000,
    "braces": "{a: " * 10_000,
    "mixed": "[{a: " * 8_000,
    "lines": "[\n" * 20_000,
}
#: The line each is told at: the first level past the bound.
DEEP_LINE = {"brackets": 2, "braces": 2, "mixed": 2, "lines": 2 + MAX_DEPTH}
#: A generous bound on one command over such a file, against a hang; what matters is the file:line problem.
WALL_S = 20.0


@pytest.mark.parametrize("shape", list(DEEP))
def test_a_deep_document_is_a_nesting_problem_for_every_loader(tmp_path: Path, shape: str) -> None:
    """The workflow loader and its pre-checks, and the loader of every other brain file, stop at the nesting
    bound: a problem at the file's line, quickly."""
    import time

    from ambient.config.workflows import load_workflow_bytes

    text = f"workflow: deep\nfor_each: {DEEP[shape]}\n"
    started = time.monotonic()
    loaded, problems = load_workflow_bytes(text.encode(), source="workflows/deep.yml")
    elapsed = time.monotonic() - started
    assert loaded is None
    [problem] = problems
    assert (problem.file, problem.line) == ("workflows/deep.yml", DEEP_LINE[shape]), problem
    assert f"nesting deeper than {MAX_DEPTH} levels" in problem.message
    assert elapsed < WALL_S, elapsed
    with pytest.raises(YamlError) as info:
        parse_yaml(text, source="w.yml")
    assert info.value.line == DEEP_LINE[shape]


@pytest.mark.parametrize("reader", ["agent", "config", "routing", "zones", "claim", "lock"])
def test_every_other_brain_file_stops_at_the_nesting_bound(tmp_path: Path, reader: str) -> None:
    """The same 40 KB of `[` in an agent's frontmatter, the settings, the routing table, the zones, a claim or a
    lock: a problem (or the reader's documented InputError) naming the nesting, quickly."""
    import time

    from ambient.claims.lockfile import parse_lock
    from ambient.claims.store import ClaimStore
    from ambient.config.brain import read_settings
    from ambient.core.errors import InputError
    from ambient.kernel.agents import load_agent
    from ambient.kernel.routing_table import load_routing, load_zone_rules

    paths = make_brain(tmp_path / "brain", example_agents=False)
    deep = DEEP["brackets"]
    told: list[str] = []
    started = time.monotonic()
    try:
        if reader == "agent":
            (paths.agents / "x.md").write_text(f"---\nname: x\ntools: {deep}\n---\n")
            told += [p.message for p in load_agent(paths.agents / "x.md", source="agents/x.md")[1]]
        elif reader == "config":
            paths.config.write_text(f"runners: {deep}\n")
            told += [p.message for p in read_settings(paths, {}).problems]
        elif reader in ("routing", "zones"):
            (paths.routing if reader == "routing" else paths.zones).write_text(f"routes: {deep}\n")
            found = load_routing(paths)[1] if reader == "routing" else load_zone_rules(paths)[1]
            told += [p.message for p in found]
        elif reader == "lock":
            parse_lock(f"file: {deep}\n".encode(), "locks/x.lock")
        else:
            (paths.claims / "x.yml").write_text(f"sess_id: {deep}\n")
            ClaimStore(paths).read(paths.claims / "x.yml")
    except InputError as exc:
        told.append(str(exc))
    elapsed = time.monotonic() - started
    assert any(f"nesting deeper than {MAX_DEPTH} levels" in m for m in told), told
    assert elapsed < WALL_S, elapsed


def _deep_brain(tmp_path: Path) -> BrainPaths:
    paths = make_brain(tmp_path / "brain", agents={"stub": stub_agent_md("stub", ["--sleep-ms", "10-20"])})
    (paths.workflows / "good.yml").write_text(foreach_workflow("good", ["a", "b"]))
    (paths.workflows / "deep.yml").write_text("workflow: deep\nfor_each: " + DEEP["brackets"] + "\n")
    return paths


def test_validate_tells_a_deep_workflow_at_its_line_quickly(tmp_path: Path) -> None:
    """`ambient validate` beside a 40 KB workflow of nested `[`: exit 1 with the file:line problem, not a hang."""
    import time

    paths = _deep_brain(tmp_path)
    started = time.monotonic()
    result = ambient_cli(paths.root, "validate", timeout=120)
    elapsed = time.monotonic() - started
    out = _no_traceback(result, "validate")
    assert result.returncode == 1, out[-2000:]
    assert f"workflows/deep.yml:2: nesting deeper than {MAX_DEPTH} levels" in out, out[-2000:]
    assert elapsed < WALL_S, elapsed


def test_the_daemon_beside_a_deep_workflow_starts_and_runs_the_others(tmp_path: Path) -> None:
    """`ambient run --until-idle` beside the same file: it starts promptly, logs the file at its line and runs the
    good workflow to success."""
    import time

    paths = _deep_brain(tmp_path)
    started = time.monotonic()
    result = ambient_cli(paths.root, "run", "--until-idle", "--log-format", "json", timeout=120)
    elapsed = time.monotonic() - started
    out = _no_traceback(result, "run --until-idle")
    assert result.returncode == 0, out[-2000:]
    assert "workflows/deep.yml:2" in out, out[-2000:]
    good = finished_run(paths, "good")
    assert good is not None and good.outcome == "success", out[-2000:]
    assert elapsed < 3 * WALL_S, elapsed


def test_a_run_context_nested_past_the_json_decoders_depth_is_refused_with_a_reason() -> None:
    """`ambient start --context` (and the console's form) with JSON nested 100,000 deep: a reason, not a crash."""
    from ambient.actions.start import parse_context

    told = parse_context("[" * 100_000)
    assert isinstance(told, str) and "nested too deeply" in told
