"""The layer contract of ``src/ambient``: the layer table as data, checked over every import of every module.

Rules (an import is every ``import``/``from ... import`` statement, wherever it stands: at module level, inside a
function, under ``if TYPE_CHECKING:`` (a type dependency is a dependency), in a ``try``; absolute or relative; and
``importlib.import_module("ambient....")`` with a literal name):

(a) **layers**: a module never imports a package of a higher rank (:data:`RANK`), nor a different package of the
    same rank unless :data:`SAME_RANK_ALLOWED` says so; ``testing`` is a leaf nothing in ``src`` imports (tests and
    ``python -m ambient.testing...`` do); only the package root (``ambient/__init__.py``) and ``__main__`` stand
    above the CLI. Anything may import the root package itself (``__version__``; it imports nothing).
(b) **no cycles** between modules, in the graph of every import above, function-level ones included: importing
    ``ambient.x.y`` also runs ``ambient/x/__init__.py``, so that edge counts too. Each tangle is reported as the
    shortest cycle through each of its imports, so a fix that leaves another way round is still caught.
(c) **pure modules do no I/O** (:data:`PURE`): they import only the stdlib minus :data:`IO_MODULES`, pydantic and
    yaml, and other pure modules; that holds transitively, so the rules they hold (routing, planning, statistics,
    learned rules) run the same in the daemon, the CLI, replay and the tests.
(d) the checker is itself tested on planted imports of each form (:class:`TestTheCheckerCatches`), so this file
    cannot pass by seeing nothing.

A dynamic import whose name is computed (``cli/__init__.py`` loads its own command modules by file name) is out
of reach; it stays inside its package.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

SRC: Final = Path(__file__).resolve().parent.parent / "src" / "ambient"
ROOT: Final = "ambient"

#: The layer table (ARCHITECTURE.md): lower never imports higher.
RANK: Final[Mapping[str, int]] = {
    "core": 0,  # foundation: errors, problems, clock, redact, terminal, pathrules, health
    "storage": 1,  # the only code that puts bytes on disk
    "kernel": 2,  # packets, zones, the access matrix, routing
    "claims": 3,  # domain packages: claims and locks...
    "workflows": 3,  # ...workflow specs...
    "human": 3,  # ...escalations and notifications...
    "live": 3,  # ...agents' live context
    "runners": 4,
    "engine": 5,
    "cluster": 5,  # agents on worker hosts: the daemon's dispatcher and the worker, beside the engine
    "learning": 6,  # reads the engine's records, replays through its planner
    "config": 7,
    "query": 7,  # the derived SQLite query store over runs, items, claims, escalations, costs
    "service": 8,
    "actions": 9,  # what a person does (decide, start, gates, rules): one code path for the CLI and the console
    "web": 10,  # the web console
    "cli": 11,
}
#: Packages of the same rank that may import each other: (importer, imported). None today.
SAME_RANK_ALLOWED: Final[frozenset[tuple[str, str]]] = frozenset()
#: Nothing in src imports it; it may import anything.
LEAF: Final = "testing"
#: Above the CLI: ``python -m ambient`` and the package root.
ENTRY: Final = frozenset({ROOT, f"{ROOT}.__main__"})

#: Modules that do no I/O: the rules and models of the functional core, run alike by the daemon, the CLI, replay
#: and the tests. Every module that is pure today is listed, whatever its package: storage/yamltext parses and
#: renders YAML text (the files are storage/yamlfile's), core/health is the daemon's conditions as a model and
#: functions over it, engine/slots is arithmetic, config/scaffold is the text of a new brain (cli/init writes it).
#: Not pure, and not listed: core/clock (reads the time), kernel/agents and kernel/routing_table (load their
#: files), runners/extras (importlib finds packages on disk), runners/base (a request holds the brain's path), the
#: stores, engine/runs, the service and the CLI.
PURE: Final = frozenset(
    {
        "core.errors",
        "core.problems",
        "core.redact",
        "core.terminal",
        "core.pathrules",
        "core.health",
        "storage.yamltext",
        "kernel.packet",
        "kernel.matrix",
        "kernel.zones",
        "claims.claim",
        "claims.preflight",
        "claims.statusline",
        "workflows.actions",
        "workflows.checks",
        "workflows.fields",
        "workflows.spec",
        "workflows.templating",
        "workflows.triggers",
        "workflows.variables",
        "human.escalations",
        "human.messages",
        "live.turn",
        "live.handoff",
        "testing.fakeapi.playbook",
        "runners.argv",
        "runners.config",
        "runners.result",
        "runners.answer",
        "runners.pricing",
        "cluster.protocol",
        "engine.planner",
        "engine.runstate",
        "engine.events",
        "engine.compile",
        "engine.records",
        "engine.budget",
        "engine.slots",
        "learning.stats",
        "learning.rules",
        "learning.replay",
        "config.settings",
        "config.scaffold",
    }
)
#: Stdlib modules that read or write the world (files, processes, sockets, the clock, signals, logs, the
#: packages on disk).
IO_MODULES: Final = frozenset(
    {
        "asyncio",
        "fcntl",
        "glob",
        "http",
        "importlib",
        "io",
        "logging",
        "mmap",
        "multiprocessing",
        "os",
        "pathlib",
        "select",
        "selectors",
        "shutil",
        "signal",
        "socket",
        "sqlite3",
        "ssl",
        "subprocess",
        "sys",
        "tempfile",
        "time",
        "urllib.request",
    }
)
#: Third-party libraries a pure module may use: models and YAML text.
PURE_LIBRARIES: Final = frozenset({"pydantic", "pydantic_core", "yaml"})

# ---------------------------------------------------------------------------------------------- the checker


@dataclass(frozen=True)
class Import:
    """One imported name: ``file:line``, the statement as written (one name of it), who imports what."""

    file: str  # src/ambient/kernel/matrix.py
    line: int
    text: str  # from ambient.service import daemon
    importer: str  # ambient.kernel.matrix
    target: str  # the module it names: ambient.service.daemon (an outside one as written: os.path)
    where: str  # "" (module level), "in a function", "under TYPE_CHECKING"

    @property
    def internal(self) -> bool:
        return _is_ambient(self.target)


@dataclass(frozen=True)
class Violation:
    """A broken rule, said with the file, the line, the import and the rule."""

    rule: str  # layer, leaf, cycle, pure
    file: str
    line: int
    text: str
    why: str
    key: tuple[str, ...]  # stable across line moves

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}` breaks the {self.rule} rule: {self.why}"


def module_name(rel: str) -> str:
    """``kernel/matrix.py`` → ``ambient.kernel.matrix``; ``kernel/__init__.py`` → ``ambient.kernel``."""
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ROOT, *parts])


def read_tree(root: Path = SRC) -> dict[str, str]:
    """Every module's source, by path under ``src/ambient``."""
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))}


class _Collector(ast.NodeVisitor):
    """Every import of one module as written, with where it stands (module level, function, TYPE_CHECKING); an
    import of ambient is kept as the full dotted name it spells (``ambient.kernel.zone_of``), resolved later."""

    def __init__(self, rel: str) -> None:
        me = module_name(rel)
        self.package = me if rel.endswith("__init__.py") else me.rpartition(".")[0]
        self.where: list[str] = []
        self.out: list[tuple[int, str, str, str]] = []  # line, text, dotted name, where

    def _add(self, node: ast.stmt | ast.expr, text: str, name: str) -> None:
        self.out.append((node.lineno, text, name, self.where[-1] if self.where else ""))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""), alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            base = ".".join([*parts[: len(parts) - (node.level - 1)], *([node.module] if node.module else [])])
        for alias in node.names:
            text = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
            text += f" as {alias.asname}" if alias.asname else ""
            self._add(node, text, base if alias.name == "*" else f"{base}.{alias.name}")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self._add(node, f"{name}({arg.value!r})", arg.value)
        self.generic_visit(node)

    def _nested(self, node: ast.AST, where: str) -> None:
        self.where.append(where)
        self.generic_visit(node)
        self.where.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._nested(node, "in a function")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._nested(node, "in a function")

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            self.visit(test)
            self.where.append("under TYPE_CHECKING")
            for stmt in node.body:
                self.visit(stmt)
            self.where.pop()
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)


@functools.cache
def _written(rel: str, text: str) -> tuple[tuple[int, str, str, str], ...]:
    """The imports of one module as written (cached: the planted trees below differ from the real one by a file)."""
    collector = _Collector(rel)
    collector.visit(ast.parse(text, filename=rel))
    return tuple(collector.out)


def _is_ambient(name: str) -> bool:
    return name == ROOT or name.startswith(ROOT + ".")


def imports_of(sources: Mapping[str, str]) -> list[Import]:
    """Every import of every module in ``sources`` (path under src/ambient → text), each resolved to the module it
    names: the longest prefix of its dotted name that is a module of the tree (``from ambient.kernel import zones``
    names ``ambient.kernel.zones``, ``from ambient.kernel.zones import zone_of`` names it too)."""
    modules = frozenset(module_name(rel) for rel in sources)

    def resolve(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    out: list[Import] = []
    for rel, text in sorted(sources.items()):
        me = module_name(rel)
        for line, said, name, where in _written(rel, text):
            target = resolve(name) if _is_ambient(name) else name
            out.append(Import(f"src/ambient/{rel}", line, said, me, target, where))
    return out


def package_of(module: str) -> str | None:
    """``ambient.kernel.matrix`` → ``kernel``; the root and ``__main__`` have none."""
    parts = module.split(".")
    if len(parts) < 2 or module in ENTRY:
        return None
    return parts[1]


def _layer(imp: Import) -> Violation | None:
    mine, theirs = package_of(imp.importer), package_of(imp.target)
    where = f" ({imp.where})" if imp.where else ""

    def broken(rule: str, why: str) -> Violation:
        return Violation(rule, imp.file, imp.line, imp.text, why + where, (rule, imp.importer, imp.target))

    if imp.target == f"{ROOT}.__main__":
        return broken("layer", "nothing imports the entry point `python -m ambient`")
    if theirs == LEAF and mine != LEAF:
        return broken("leaf", f"`{LEAF}` is a leaf: nothing in src imports it (tests and `python -m` do)")
    if theirs is None or mine == theirs or mine == LEAF or imp.importer in ENTRY:
        return None
    if mine is None or mine not in RANK or theirs not in RANK:
        unknown = mine if mine not in RANK else theirs
        return broken("layer", f"package `{unknown}` has no rank in the layer table (RANK)")
    if RANK[theirs] > RANK[mine]:
        return broken(
            "layer",
            f"{mine} (rank {RANK[mine]}) imports {theirs} (rank {RANK[theirs]}): "
            "a lower layer never imports a higher one",
        )
    if RANK[theirs] == RANK[mine] and (mine, theirs) not in SAME_RANK_ALLOWED:
        return broken(
            "layer",
            f"{mine} and {theirs} are both rank {RANK[mine]}: packages of the same rank do not import each other",
        )
    return None


def layer_violations(imports: list[Import]) -> list[Violation]:
    """Rule (a): layers and the leaf."""
    return [v for imp in imports if imp.internal and (v := _layer(imp)) is not None]


def _graph(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """Module → module it imports → the first import that says so. Importing ``ambient.x.y`` runs ``ambient.x``
    first (unless the importer is inside ``ambient.x``, which is then already running)."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if not imp.internal or imp.target == imp.importer:
            continue
        edges = graph.setdefault(imp.importer, {})
        edges.setdefault(imp.target, imp)
        parts = imp.target.split(".")
        for n in range(2, len(parts)):
            ancestor = ".".join(parts[:n])
            if not (imp.importer + ".").startswith(ancestor + "."):
                edges.setdefault(ancestor, imp)
    return graph


def _tangles(graph: Mapping[str, Mapping[str, Import]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _shortest_path(graph: Mapping[str, Mapping[str, Import]], src: str, dst: str, within: set[str]) -> list[str]:
    seen = {src: src}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        if node == dst:
            path = [dst]
            while path[-1] != src:
                path.append(seen[path[-1]])
            return path[::-1]
        for nxt in sorted(graph.get(node, {})):
            if nxt in within and nxt not in seen:
                seen[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no path {src} → {dst} in a strongly connected component")


def cycle_violations(imports: list[Import]) -> list[Violation]:
    """Rule (b): every import inside a tangle, with the shortest cycle it closes (each cycle said once)."""
    graph = _graph(imports)
    out: list[Violation] = []
    for component in _tangles(graph):
        members = set(component)
        seen: set[tuple[str, ...]] = set()
        for a in component:
            for b in sorted(graph[a]):
                if b not in members:
                    continue
                cycle = [a, *_shortest_path(graph, b, a, members)[:-1]]
                turn = cycle.index(min(cycle))
                canonical = tuple(cycle[turn:] + cycle[:turn])
                if canonical in seen:
                    continue
                seen.add(canonical)
                hops = [graph[x][y] for x, y in zip(canonical, (*canonical[1:], canonical[0]), strict=True)]
                first = hops[0]
                said = " → ".join(
                    f"{h.importer} ({h.file.removeprefix('src/ambient/')}:{h.line} `{h.text}`"
                    + (f", {h.where}" if h.where else "")
                    + ")"
                    for h in hops
                )
                why = f"import cycle: {said} → {canonical[0]}"
                out.append(Violation("cycle", first.file, first.line, first.text, why, ("cycle", *canonical)))
    return out


def _is_io(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in IO_MODULES)


def pure_violations(imports: list[Import], pure: frozenset[str] = PURE) -> list[Violation]:
    """Rule (c): a pure module imports only the stdlib minus I/O, pydantic/yaml, and other pure modules."""
    pure_modules = {f"{ROOT}.{m}" for m in pure}
    out: list[Violation] = []
    for imp in imports:
        if imp.importer not in pure_modules:
            continue
        top = imp.target.split(".")[0]
        if imp.internal:
            bad = imp.target not in pure_modules and imp.target != ROOT
            why = f"{imp.target} is not a pure module (PURE): a pure module imports only pure ones"
        elif top in PURE_LIBRARIES:
            bad = False
        elif top in sys.stdlib_module_names:
            bad = _is_io(imp.target)
            why = f"{imp.target} does I/O (IO_MODULES): a pure module does none"
        else:
            bad = True
            why = f"{top} is neither the stdlib nor pydantic/yaml: a pure module depends on no more"
        if bad:
            where = f" ({imp.where})" if imp.where else ""
            key = ("pure", imp.importer, imp.target)
            out.append(Violation("pure", imp.file, imp.line, imp.text, why + where, key))
    return out


def check(sources: Mapping[str, str]) -> list[Violation]:
    """Every violation of rules (a), (b) and (c) in a tree of sources (path under src/ambient → text)."""
    imports = imports_of(sources)
    return [*layer_violations(imports), *cycle_violations(imports), *pure_violations(imports)]


# ---------------------------------------------------------------------------------------------- the tree


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return read_tree()


@pytest.fixture(scope="module")
def found(tree: dict[str, str]) -> list[Violation]:
    return check(tree)


def _report(violations: list[Violation]) -> str:
    return "\n".join(["", *(str(v) for v in violations)])


@pytest.mark.parametrize("rule", ["layer", "leaf", "cycle", "pure"])
def test_the_tree_keeps_the_contract(found: list[Violation], rule: str) -> None:
    """No violation of the rule in src/ambient: no allowlist, a wrong-way import fails here."""
    new = [v for v in found if v.rule == rule]
    assert new == [], _report(new)


def test_every_package_has_a_rank() -> None:
    """A new package gets its place in the layer table before it gets code; no module lives outside a package."""
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    assert packages == {*RANK, LEAF}
    assert {p.name for p in SRC.glob("*.py")} == {"__init__.py", "__main__.py"}


def test_the_pure_modules_exist(tree: dict[str, str]) -> None:
    """The list of pure modules names real modules (a rename would silently drop one from the rule)."""
    modules = {module_name(rel) for rel in tree}
    assert {f"{ROOT}.{m}" for m in PURE} - modules == set()


# ---------------------------------------------------------------------------------------------- rule (d)


def _plant(tree: dict[str, str], rel: str, code: str) -> tuple[dict[str, str], int]:
    """``tree`` with ``code`` appended to ``rel`` (created if absent); the line number of its first line."""
    before = tree.get(rel, "")
    if before and not before.endswith("\n"):
        before += "\n"
    return {**tree, rel: before + code}, before.count("\n") + 1


def _new(tree: dict[str, str], found: list[Violation], planted: dict[str, str]) -> list[Violation]:
    baseline = {(v.rule, v.file, v.text, v.why) for v in found}
    return [v for v in check(planted) if (v.rule, v.file, v.text, v.why) not in baseline]


class TestTheCheckerCatches:
    """Each form of a wrong-way import, planted in the real tree, is caught with its file, line and rule."""

    @pytest.mark.parametrize(
        ("rel", "code", "offset", "text", "rule", "says"),
        [
            (
                "kernel/matrix.py",
                "from ambient.service import daemon\n",
                0,
                "from ambient.service import daemon",
                "layer",
                "kernel (rank 2) imports service (rank 8)",
            ),
            (
                "kernel/matrix.py",
                "from ambient import service\n",
                0,
                "from ambient import service",
                "layer",
                "kernel (rank 2) imports service (rank 8)",
            ),
            (
                "kernel/matrix.py",
                "import ambient.service.daemon as d\n",
                0,
                "import ambient.service.daemon as d",
                "layer",
                "kernel (rank 2) imports service (rank 8)",
            ),
            (
                "kernel/matrix.py",
                "def _late() -> None:\n    import ambient.cli\n",
                1,
                "import ambient.cli",
                "layer",
                "kernel (rank 2) imports cli (rank 11): a lower layer never imports a higher one (in a function)",
            ),
            (
                "kernel/matrix.py",
                "from ..service import daemon\n",
                0,
                "from ..service import daemon",
                "layer",
                "kernel (rank 2) imports service (rank 8)",
            ),
            (
                "kernel/matrix.py",
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ambient.engine.runs import RunManager\n",
                2,
                "from ambient.engine.runs import RunManager",
                "layer",
                "kernel (rank 2) imports engine (rank 5): a lower layer never imports a higher one "
                "(under TYPE_CHECKING)",
            ),
            (
                "kernel/matrix.py",
                "import importlib\n_x = importlib.import_module('ambient.config.brain')\n",
                1,
                "import_module('ambient.config.brain')",
                "layer",
                "kernel (rank 2) imports config (rank 7)",
            ),
            (
                "claims/claim.py",
                "from ambient.human.escalations import Escalation\n",
                0,
                "from ambient.human.escalations import Escalation",
                "layer",
                "claims and human are both rank 3",
            ),
            (
                "service/daemon.py",
                "from ambient.testing import fakeapi\n",
                0,
                "from ambient.testing import fakeapi",
                "leaf",
                "`testing` is a leaf",
            ),
            (
                "engine/planner.py",
                "from ambient.engine import runs\n",
                0,
                "from ambient.engine import runs",
                "pure",
                "ambient.engine.runs is not a pure module",
            ),
            (
                "learning/rules.py",
                "def _now() -> float:\n    import time\n    return time.time()\n",
                1,
                "import time",
                "pure",
                "time does I/O (IO_MODULES): a pure module does none (in a function)",
            ),
            (
                "kernel/zones.py",
                "from os import path\n",
                0,
                "from os import path",
                "pure",
                "does I/O",
            ),
            (
                "core/terminal.py",
                "import structlog\n",
                0,
                "import structlog",
                "pure",
                "structlog is neither the stdlib nor pydantic/yaml",
            ),
        ],
    )
    def test_planted(
        self,
        tree: dict[str, str],
        found: list[Violation],
        rel: str,
        code: str,
        offset: int,
        text: str,
        rule: str,
        says: str,
    ) -> None:
        planted, line = _plant(tree, rel, code)
        # Only the rule under test: a wrong-way import may close cycles too, and in a pure module is impure as well.
        new = [v for v in _new(tree, found, planted) if v.rule == rule]
        assert [(v.file, v.line, v.text, v.rule) for v in new] == [(f"src/ambient/{rel}", line + offset, text, rule)]
        assert says in new[0].why
        assert str(new[0]).startswith(f"src/ambient/{rel}:{line + offset}: `{text}` breaks the {rule} rule: ")

    def test_a_two_module_cycle(self, tree: dict[str, str], found: list[Violation]) -> None:
        """Two modules that import each other, one of them inside a function, are one cycle, said with both ends."""
        planted, _ = _plant(tree, "core/_ping.py", "from ambient.core import _pong\n")
        planted, line = _plant(planted, "core/_pong.py", "def f() -> None:\n    from . import _ping\n")
        new = _new(tree, found, planted)
        assert [(v.rule, v.key) for v in new] == [("cycle", ("cycle", "ambient.core._ping", "ambient.core._pong"))]
        assert new[0].file == "src/ambient/core/_ping.py" and new[0].line == 1
        assert f"core/_pong.py:{line + 1} `from . import _ping`, in a function" in new[0].why

    def test_a_cycle_through_a_package_init(self, tree: dict[str, str], found: list[Violation]) -> None:
        """Importing ambient.x.y runs ambient/x/__init__.py first: an __init__ that imports back closes a cycle."""
        planted, _ = _plant(tree, "core/_early.py", "import ambient.kernel.zones\n")
        planted, _ = _plant(planted, "kernel/__init__.py", "from ambient.core import _early\n")
        new = _new(tree, found, planted)
        assert ("cycle", "ambient.core._early", "ambient.kernel") in {v.key for v in new}
        assert {v.rule for v in new} == {"cycle", "layer"}  # core (rank 0) imports kernel (rank 2) as well

    def test_each_cycle_of_a_tangle_is_said(self, tree: dict[str, str], found: list[Violation]) -> None:
        """a → b → a and a → c → a share a module: both are reported, so fixing one is not enough to pass."""
        planted, _ = _plant(tree, "core/_a.py", "from . import _b, _c\n")
        planted, _ = _plant(planted, "core/_b.py", "from . import _a\n")
        planted, _ = _plant(planted, "core/_c.py", "from . import _a\n")
        keys = {v.key for v in _new(tree, found, planted)}
        assert keys == {
            ("cycle", "ambient.core._a", "ambient.core._b"),
            ("cycle", "ambient.core._a", "ambient.core._c"),
        }

    def test_what_is_allowed_stays_allowed(self, tree: dict[str, str], found: list[Violation]) -> None:
        """Downward imports, imports within a package, the root's ``__version__`` and the entry point's CLI pass."""
        planted, _ = _plant(
            tree, "service/daemon.py", "from ambient.kernel import matrix\nimport ambient.core.errors\n"
        )
        planted, _ = _plant(planted, "engine/tick.py", "from . import planner\nfrom ambient import __version__\n")
        planted, _ = _plant(planted, "__main__.py", "from ambient.cli import main as _main\n")
        planted, _ = _plant(planted, "testing/fakeapi/server.py", "from ambient.service import daemon as _d\n")
        assert _new(tree, found, planted) == []

    def test_imports_are_resolved_to_modules(self) -> None:
        """``from pkg import name`` names the module ``pkg.name`` when there is one, else the package itself."""
        tree = {
            "__init__.py": "",
            "kernel/__init__.py": "",
            "kernel/matrix.py": "from . import zones\nfrom .zones import zone_of\nfrom ambient.kernel import X\n",
            "kernel/zones.py": "from ambient import kernel\nimport ambient.kernel.matrix as m\n",
        }
        got = [(i.importer, i.target) for i in imports_of(tree)]
        assert got == [
            ("ambient.kernel.matrix", "ambient.kernel.zones"),
            ("ambient.kernel.matrix", "ambient.kernel.zones"),
            ("ambient.kernel.matrix", "ambient.kernel"),
            ("ambient.kernel.zones", "ambient.kernel"),
            ("ambient.kernel.zones", "ambient.kernel.matrix"),
        ]
