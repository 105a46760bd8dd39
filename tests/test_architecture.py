"""The layer contract of ``src/ambient``: the layer table as data, checked over every import of every module.

Rules (an import is every ``import``/``from ... import`` statement, wherever it stands: at module level, inside a
function, under ``if TYPE_CHECKING:`` (a type dependency is a dependency), in a ``try``; absolute or relative; a
module named by a string, or by a name bound to one, given to ``importlib.import_module``, ``__import__``,
``importlib.util.find_spec`` or ``pkgutil.resolve_name`` under any alias, called or handed on
(``asyncio.to_thread(importlib.import_module, "x")``); ``sys.modules[...]`` and ``sys.modules.get(...)``; and
``-m ambient.x`` in a string or after ``"-m"`` in an argv list, since a process started on a module depends on it):

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
    Nor do they use, under any name, called or handed on, the clock (``datetime.now``, ``date.today``,
    ``time.time``...), the OS's randomness (``random``'s functions, an unseeded ``random.Random()``, ``secrets``,
    ``os.urandom``, ``uuid4``) or ``open`` (:data:`IMPURE_NAMES`): they are given ``now`` and a random source. The
    one exception, :data:`FRESH_IDS`, is a fresh unguessable id drawn in one named function.
(d) the checker is itself tested on planted imports of each form (:class:`TestTheCheckerCatches`), so this file
    cannot pass by seeing nothing.
(e) **files are written through storage**: outside ``storage`` only the modules of :data:`WRITERS` (each with its
    reason, as ARCHITECTURE.md says) create, write, cut, link or rename a file themselves; proven on a package tree
    written to disk with each form of write (:class:`TestTheWriteRule`).
(f) **one tree of errors**: every exception class (one whose base is a builtin exception or, in turn, another
    exception class of the tree; in a function too) is defined in ``core/errors.py``; the only others are the
    private control-flow signals of :data:`SIGNALS`, raised and caught inside their own module.
(g) **the daemon is wired in dependency order** (:data:`WIRING`): its build function holds no lambda and no nested
    function that reads ``self``, the late binding that hid its object cycles (``lambda: self.engine.wake()``): each
    part is built after what it uses and handed it; a cycle that remains is a bound method, said in a comment.
    Proven on planted closures in the real file (:class:`TestTheWiringRule`).

A dynamic import whose name is computed (``cli/__init__.py`` loads its own command modules by file name) is out
of reach; it stays inside its package.
"""

from __future__ import annotations

import ast
import builtins
import functools
import itertools
import re
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
    "storage": 1,  # how files are written (rule (e): the other writers are WRITERS)
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
        "workflows.exit_actions",
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
        "runners.runner_config",
        "runners.result",
        "runners.answer",
        "runners.pricing",
        "runners.patterns",
        "cluster.protocol",
        "cluster.roster",
        "cluster.unit",
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


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Each name an import binds, wherever it stands, → the dotted name it stands for (``im`` →
    ``importlib.import_module``, ``dt`` → ``datetime.datetime``, ``os`` → ``os``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def _strings(tree: ast.AST) -> dict[str, str]:
    """Names bound to a string constant anywhere in the module (``NAME = "ambient.cli"``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update((t.id, value.value) for t in targets if isinstance(t, ast.Name))
    return out


def _qualify(node: ast.expr, aliases: Mapping[str, str]) -> str:
    """The dotted name an expression spells, its first name read through the imports (``""`` for anything else)."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _qualify(node.value, aliases)
        return f"{base}.{node.attr}" if base else ""
    return ""


#: The functions that import a module named by a string: their first argument is a module name.
IMPORTERS: Final = frozenset(
    {
        "importlib.import_module",
        "importlib.__import__",
        "__import__",
        "importlib.util.find_spec",
        "pkgutil.resolve_name",
    }
)
_DASH_M: Final = re.compile(r"(?:^|\s)-m\s+(ambient(?:\.\w+)*)")


class _Collector(ast.NodeVisitor):
    """Every import of one module as written, with where it stands (module level, function, TYPE_CHECKING); an
    import of ambient is kept as the full dotted name it spells (``ambient.kernel.zone_of``), resolved later.

    Beyond the statements: a module named by a string (a constant, or a name bound to one) given to an importer
    (:data:`IMPORTERS`, under any alias, called or handed to another function such as ``asyncio.to_thread``),
    ``sys.modules[...]`` and ``sys.modules.get(...)``, and ``-m ambient.x`` in a string or next to ``"-m"`` in an
    argv list: a process started on a module depends on it as an import does."""

    def __init__(self, rel: str, tree: ast.Module) -> None:
        me = module_name(rel)
        self.package = me if rel.endswith("__init__.py") else me.rpartition(".")[0]
        self.aliases = _aliases(tree)
        self.strings = _strings(tree)
        self.where: list[str] = []
        self.out: list[tuple[int, str, str, str]] = []  # line, text, dotted name, where

    def _add(self, node: ast.stmt | ast.expr, text: str, name: str) -> None:
        self.out.append((node.lineno, text, name, self.where[-1] if self.where else ""))

    def _string(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return self.strings.get(node.id) if isinstance(node, ast.Name) else None

    def _importer(self, node: ast.expr) -> str | None:
        """The importer an expression names (``im`` for ``from importlib import import_module as im``)."""
        qual = _qualify(node, self.aliases)
        if qual in IMPORTERS:
            return qual
        if isinstance(node, ast.Attribute) and node.attr in ("import_module", "__import__"):
            return node.attr  # an importlib reached some other way
        return None

    def _dynamic(self, node: ast.expr, func: ast.expr, arg: ast.expr) -> None:
        importer, name = self._importer(func), self._string(arg)
        if importer is not None and name is not None:
            name = name.partition(":")[0] if importer == "pkgutil.resolve_name" else name
            self._add(node, f"{ast.unparse(func)}({name!r})", name)

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
        if node.args:
            self._dynamic(node, node.func, node.args[0])
        for handed, after in itertools.pairwise(node.args):  # asyncio.to_thread(importlib.import_module, "x")
            self._dynamic(node, handed, after)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("get", "pop", "setdefault")
            and _qualify(func.value, self.aliases) == "sys.modules"
            and node.args
            and (name := self._string(node.args[0])) is not None
        ):
            self._add(node, f"sys.modules.{func.attr}({name!r})", name)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _qualify(node.value, self.aliases) == "sys.modules" and (name := self._string(node.slice)) is not None:
            self._add(node, f"sys.modules[{name!r}]", name)
        self.generic_visit(node)

    def _argv(self, node: ast.List | ast.Tuple) -> None:
        for flag, arg in itertools.pairwise(node.elts):
            name = self._string(arg)
            if self._string(flag) == "-m" and name is not None and _is_ambient(name):
                self._add(node, f"-m {name}", name)
        self.generic_visit(node)

    def visit_List(self, node: ast.List) -> None:
        self._argv(node)

    def visit_Tuple(self, node: ast.Tuple) -> None:
        self._argv(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            for found in _DASH_M.finditer(node.value):
                self._add(node, f"-m {found.group(1)}", found.group(1))

    def visit_Expr(self, node: ast.Expr) -> None:
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            self.generic_visit(node)  # a docstring or a bare string only says a command line, it starts nothing

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
    tree = ast.parse(text, filename=rel)
    collector = _Collector(rel, tree)
    collector.visit(tree)
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


#: Names a pure module never uses, called or handed on: the clock, the OS's randomness, files. A random source is
#: given to a pure rule (``rng: random.Random``) or seeded there (``random.Random(0)``), never drawn from the OS.
IMPURE_NAMES: Final = frozenset(
    {
        "open",
        "input",
        "io.open",
        "builtins.open",
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
        "time.time",
        "time.time_ns",
        "time.monotonic",
        "time.monotonic_ns",
        "time.perf_counter",
        "time.perf_counter_ns",
        "os.urandom",
        "os.getrandom",
        "uuid.uuid1",
        "uuid.uuid4",
    }
)
#: Whole modules a pure module never draws from (``random.Random`` itself, the type and the seeded generator,
#: is allowed).
IMPURE_MODULES: Final = frozenset({"random", "secrets"})
#: The one kind of randomness a pure module keeps: a fresh unguessable id, drawn from ``secrets`` in one named
#: function (module → functions); a caller that needs a known id gives it (``packet_id=``, ``with_id``).
FRESH_IDS: Final[Mapping[str, frozenset[str]]] = {
    "kernel.packet": frozenset({"new_packet_id"}),
    "human.escalations": frozenset({"new_id", "new_nonce"}),
}

#: File-writing calls by their dotted name: they create, write, cut, link or rename files.
WRITE_CALLS: Final = frozenset(
    {
        "os.write",
        "os.writev",
        "os.pwrite",
        "os.pwritev",
        "os.ftruncate",
        "os.truncate",
        "os.posix_fallocate",
        "os.copy_file_range",
        "os.rename",
        "os.renames",
        "os.replace",
        "os.link",
        "os.symlink",
        "os.mkfifo",
        "os.mknod",
        "shutil.copy",
        "shutil.copy2",
        "shutil.copyfile",
        "shutil.copytree",
        "shutil.move",
        "tempfile.mkstemp",
        "tempfile.NamedTemporaryFile",
        "tempfile.TemporaryFile",
        "tempfile.SpooledTemporaryFile",
        "sqlite3.connect",
    }
)
#: Methods that write whatever object they are called on (pathlib's).
WRITE_METHODS: Final = frozenset({"write_text", "write_bytes", "touch", "hardlink_to", "symlink_to"})
#: ``os.open`` flags that open a file for writing or create it.
WRITE_FLAGS: Final = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC", "O_TMPFILE"})
#: The modules outside ``storage`` that write, link or rename files themselves (module → why), as ARCHITECTURE.md
#: says; every other module writes through ``storage`` (``fsutil``, ``journal``, ``guard``, ``yamlfile``, ``spares``).
#: A pool of spare files (made, filled, linked: writes) therefore lives in ``storage.spares`` or in one of these.
WRITERS: Final[Mapping[str, str]] = {
    "claims.lockstate": "the lock protocol: a stale lock taken over by rename and re-check",
    "query.store": "the query store is SQLite's file: SQLite writes it",
    "runners.spawner_helper": "the spawner process, standard library only: writes its pipes and stderr",
    "testing.stub_agent": "a stand-in agent: writes where its test tells it, as a real agent does",
}

#: The one home of ambient's exceptions (rule (f)): the tree a caller reads to know what it may have to catch.
ERRORS_HOME: Final = "core.errors"
#: The exceptions kept beside their code (``module.Class`` → why): private control-flow signals, raised and caught
#: inside their own module, that no caller ever sees; each is named by a leading underscore.
SIGNALS: Final[Mapping[str, str]] = {
    "runners.llm._Refused": "a configuration that cannot make a model call: caught in the same module, it becomes "
    "the call's result",
    "runners.spawner_helper._DaemonGone": "the daemon died with starts queued: the spawner process (standard "
    "library only) stops starting them and exits",
    "storage.yamltext._NotPlain": "a document outside the one-pass reader's subset: caught in the same module, the "
    "safe loader reads it",
}


def _mode_writes(mode: ast.expr | None) -> bool:
    """An ``open`` mode that writes: one with ``w``, ``a``, ``x`` or ``+``, or one not written as a constant."""
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) & set("wax+"))
    return True


def _arg(node: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if len(node.args) > index:
        return node.args[index]
    return next((k.value for k in node.keywords if k.arg == keyword), None)


class _Effects(ast.NodeVisitor):
    """What one module does beyond computing: its file-writing calls, and the clock, randomness and files it
    reaches for (any use of a name, called or handed on), each as ``(line, text)``."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases = _aliases(tree)
        self.functions: list[str] = []
        self.writes: list[tuple[int, str]] = []
        self.impure: list[tuple[int, str, str]] = []  # line, text, the function it stands in ("" at module level)

    def _writes(self, node: ast.Call) -> bool:
        func, qual = node.func, _qualify(node.func, self.aliases)
        if qual in ("open", "io.open", "builtins.open", "codecs.open", "os.fdopen"):
            return _mode_writes(_arg(node, 1, "mode"))
        if qual == "os.open":
            flags = _arg(node, 1, "flags")
            path = _arg(node, 0, "path")
            if path is not None and _qualify(path, self.aliases) == "os.devnull":
                return False  # the null device: nothing reaches a disk
            names = {n.id for n in ast.walk(flags) if isinstance(n, ast.Name)} if flags else set()
            names |= {n.attr for n in ast.walk(flags) if isinstance(n, ast.Attribute)} if flags else set()
            return bool(names & WRITE_FLAGS)
        if qual == "sqlite3.connect":
            db = _arg(node, 0, "database")
            return not (isinstance(db, ast.Constant) and db.value == ":memory:")
        if qual in WRITE_CALLS:
            return True
        if not isinstance(func, ast.Attribute) or qual.partition(".")[0] in self.aliases.values():
            return False  # a function of a module, not a method
        if func.attr in WRITE_METHODS:
            return True
        if func.attr in ("rename", "replace"):  # Path's take one argument; str.replace two, datetime's keywords
            return len(node.args) == 1 and not node.keywords
        mode = _arg(node, 0, "mode")  # Path.open("w"); a store's open(claim) is no file mode
        return func.attr == "open" and isinstance(mode, ast.Constant) and _mode_writes(mode)

    def visit_Call(self, node: ast.Call) -> None:
        if self._writes(node):
            self.writes.append((node.lineno, ast.unparse(node)[:100]))
        if _qualify(node.func, self.aliases) == "random.Random" and not node.args and not node.keywords:
            self._impure(node, "random.Random()")  # seeded from the OS
        self.generic_visit(node)

    def _impure(self, node: ast.expr, qual: str) -> None:
        self.impure.append((node.lineno, qual, self.functions[-1] if self.functions else ""))

    def _use(self, node: ast.Name | ast.Attribute) -> bool:
        qual = _qualify(node, self.aliases)
        top = qual.partition(".")[0]
        if qual in IMPURE_NAMES or (top in IMPURE_MODULES and "." in qual and qual != "random.Random"):
            self._impure(node, qual)
            return True
        return False

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._use(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not self._use(node):
            self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)


@functools.cache
def _effects(rel: str, text: str) -> _Effects:
    tree = ast.parse(text, filename=rel)
    effects = _Effects(tree)
    effects.visit(tree)
    return effects


def write_violations(sources: Mapping[str, str], writers: Mapping[str, str] = WRITERS) -> list[Violation]:
    """Rule (e): outside ``storage`` and :data:`WRITERS`, no module creates, writes, cuts, links or renames a file
    itself (:data:`WRITE_CALLS`, :data:`WRITE_METHODS`, ``open`` for writing, ``os.open`` with :data:`WRITE_FLAGS`
    as written); it calls ``storage``. Deleting a file and making a folder are not writes here."""
    out: list[Violation] = []
    for rel, text in sorted(sources.items()):
        me = module_name(rel)
        if package_of(me) == "storage" or me.removeprefix(ROOT + ".") in writers:
            continue
        for line, said in _effects(rel, text).writes:
            why = "only storage (and the modules ARCHITECTURE.md names, WRITERS) writes files: call storage.fsutil"
            out.append(Violation("writes", f"src/ambient/{rel}", line, said, why, ("writes", me, said)))
    return out


def impure_uses(sources: Mapping[str, str], pure: frozenset[str] = PURE) -> list[Violation]:
    """Rule (c), the uses: a pure module reads no clock, draws no randomness from the OS and opens no file, under
    any name (``from datetime import datetime as dt; dt.now``), called or handed on (``default_factory=...``)."""
    out: list[Violation] = []
    for rel, text in sorted(sources.items()):
        me = module_name(rel)
        short = me.removeprefix(ROOT + ".")
        if short not in pure:
            continue
        for line, qual, function in _effects(rel, text).impure:
            if qual.startswith("secrets.") and function in FRESH_IDS.get(short, ()):
                continue
            why = f"{qual} reads the clock, the OS's randomness or a file: a pure module is given them"
            out.append(Violation("pure", f"src/ambient/{rel}", line, qual, why, ("pure", me, qual)))
    return out


def _base_name(base: ast.expr) -> str:
    """The class a base expression names, by its last part: ``errors.InputError`` and ``Generic[T]``'s origin too."""
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


@functools.cache
def _classes(rel: str, text: str) -> tuple[tuple[int, str, frozenset[str]], ...]:
    """The classes of one module, as (line, name, base names) (cached, as :func:`_written`)."""
    return tuple(
        (node.lineno, node.name, frozenset(_base_name(b) for b in node.bases))
        for node in ast.walk(ast.parse(text, filename=rel))
        if isinstance(node, ast.ClassDef)
    )


def _exception_classes(sources: Mapping[str, str]) -> list[tuple[str, int, str]]:
    """Every class of the tree that is an exception, as (path, line, name), wherever it stands (in a function too):
    one whose base is a builtin exception, or, to a fixed point, another exception class of the tree."""
    classes = [
        (rel, line, name, bases) for rel, text in sorted(sources.items()) for line, name, bases in _classes(rel, text)
    ]
    known = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
    }
    found: dict[tuple[str, int, str], None] = {}
    grew = True
    while grew:
        grew = False
        for rel, line, name, bases in classes:
            if (rel, line, name) not in found and bases & known:
                found[(rel, line, name)] = None
                known.add(name)
                grew = True
    return list(found)


def error_violations(sources: Mapping[str, str], signals: Mapping[str, str] = SIGNALS) -> list[Violation]:
    """Rule (f): every exception class is defined in :data:`ERRORS_HOME`, but for the private signals of
    :data:`SIGNALS`, each raised and caught inside its own module."""
    out: list[Violation] = []
    for rel, line, name in _exception_classes(sources):
        me = module_name(rel)
        short = me.removeprefix(ROOT + ".")
        if short == ERRORS_HOME or f"{short}.{name}" in signals:
            continue
        if name.startswith("_"):
            why = f"a private signal is listed in SIGNALS with why it stays in {short}; else it goes to core/errors.py"
        else:
            why = "every public exception class is defined in core/errors.py, the one tree of ambient's errors"
        out.append(Violation("errors", f"src/ambient/{rel}", line, f"class {name}", why, ("errors", me, name)))
    return out


#: Rule (g): the functions that wire the daemon's parts, by file: (class, function).
WIRING: Final[Mapping[str, tuple[str, str]]] = {"service/daemon.py": ("Daemon", "_build")}


def _function(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                    return item
    return None


def wiring_violations(sources: Mapping[str, str], wiring: Mapping[str, tuple[str, str]] = WIRING) -> list[Violation]:
    """Rule (g): a lambda or a nested function inside a wiring function that reads ``self`` (a part reaching back
    through the daemon, bound late); a wiring function gone from its file is said too, so the rule never looks at
    nothing (a file gone from the tree: :func:`test_the_wiring_functions_exist`)."""
    out: list[Violation] = []
    for rel, (cls, name) in wiring.items():
        if rel not in sources:
            continue
        file = f"src/ambient/{rel}"
        fn = _function(ast.parse(sources[rel], filename=rel), cls, name)
        if fn is None:
            why = "the wiring function is gone: WIRING names where the daemon is built"
            out.append(Violation("wiring", file, 1, f"{cls}.{name}", why, ("wiring", rel, "gone")))
            continue
        for node in ast.walk(fn):
            if node is fn or not isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(node)):
                text = ast.unparse(node) if isinstance(node, ast.Lambda) else f"def {node.name}"
                why = "a closure over self binds a part late: build what it uses first and hand it over"
                out.append(Violation("wiring", file, node.lineno, text, why, ("wiring", rel, text)))
    return out


def check(sources: Mapping[str, str]) -> list[Violation]:
    """Every violation of rules (a), (b), (c), (e), (f) and (g) in a tree of sources (path under src/ambient → text)."""
    imports = imports_of(sources)
    return [
        *layer_violations(imports),
        *cycle_violations(imports),
        *pure_violations(imports),
        *impure_uses(sources),
        *write_violations(sources),
        *error_violations(sources),
        *wiring_violations(sources),
    ]


# ---------------------------------------------------------------------------------------------- the tree


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return read_tree()


@pytest.fixture(scope="module")
def found(tree: dict[str, str]) -> list[Violation]:
    return check(tree)


def _report(violations: list[Violation]) -> str:
    return "\n".join(["", *(str(v) for v in violations)])


@pytest.mark.parametrize("rule", ["layer", "leaf", "cycle", "pure", "writes", "errors", "wiring"])
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


def test_the_wiring_functions_exist(tree: dict[str, str]) -> None:
    """WIRING names real files (a move would silently drop the daemon's build from rule (g))."""
    assert set(WIRING) - set(tree) == set()


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
                "importlib.import_module('ambient.config.brain')",
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
                "def _now() -> None:\n    import time\n",
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
                "kernel/router.py",
                "from importlib import import_module as im\n_x = im('ambient.cli')\n",
                1,
                "im('ambient.cli')",
                "layer",
                "kernel (rank 2) imports cli (rank 11)",
            ),
            (
                "kernel/router.py",
                "import importlib\n_NAME = 'ambient.service.daemon'\n_x = importlib.import_module(_NAME)\n",
                2,
                "importlib.import_module('ambient.service.daemon')",
                "layer",
                "kernel (rank 2) imports service (rank 8)",
            ),
            (
                "kernel/router.py",
                "import asyncio\nimport importlib\nasync def _late() -> None:\n"
                "    await asyncio.to_thread(importlib.import_module, 'ambient.engine.runs')\n",
                3,
                "importlib.import_module('ambient.engine.runs')",
                "layer",
                "kernel (rank 2) imports engine (rank 5): a lower layer never imports a higher one (in a function)",
            ),
            (
                "kernel/router.py",
                "import pkgutil\n_main = pkgutil.resolve_name('ambient.cli:main')\n",
                1,
                "pkgutil.resolve_name('ambient.cli')",
                "layer",
                "kernel (rank 2) imports cli (rank 11)",
            ),
            (
                "kernel/router.py",
                "import sys\n_d = sys.modules['ambient.service.daemon']\n",
                1,
                "sys.modules['ambient.service.daemon']",
                "layer",
                "kernel (rank 2) imports service (rank 8)",
            ),
            (
                "kernel/router.py",
                "from sys import modules\n_d = modules.get('ambient.web.app')\n",
                1,
                "sys.modules.get('ambient.web.app')",
                "layer",
                "kernel (rank 2) imports web (rank 10)",
            ),
            (
                "runners/command.py",
                "import sys\n_ARGV = [sys.executable, '-m', 'ambient.cli', 'status']\n",
                1,
                "-m ambient.cli",
                "layer",
                "runners (rank 4) imports cli (rank 11)",
            ),
            (
                "claims/locks.py",
                "_CMD = 'python3 -m ambient.service.daemon --brain .'\n",
                0,
                "-m ambient.service.daemon",
                "layer",
                "claims (rank 3) imports service (rank 8)",
            ),
            (
                "service/daemon.py",
                "import subprocess\n_P = subprocess.Popen(['python3', '-m', 'ambient.testing.stub_agent'])\n",
                1,
                "-m ambient.testing.stub_agent",
                "leaf",
                "`testing` is a leaf",
            ),
            (
                "engine/planner.py",
                "from datetime import datetime as dt\n_T = dt.now()\n",
                1,
                "datetime.datetime.now",
                "pure",
                "reads the clock, the OS's randomness or a file",
            ),
            (
                "engine/records.py",
                "from datetime import date\nfrom dataclasses import field\n_F = field(default_factory=date.today)\n",
                2,
                "datetime.date.today",
                "pure",
                "reads the clock",
            ),
            (
                "learning/stats.py",
                "def _read() -> str:\n    with open('runs.jsonl') as f:\n        return f.read()\n",
                1,
                "open",
                "pure",
                "a pure module is given them",
            ),
            (
                "learning/rules.py",
                "import random\n_X = random.random()\n",
                1,
                "random.random",
                "pure",
                "the OS's randomness",
            ),
            (
                "learning/replay.py",
                "_RNG = random.Random()\n",
                0,
                "random.Random()",
                "pure",
                "the OS's randomness",
            ),
            (
                "engine/planner.py",
                "from secrets import token_hex\n_K = token_hex(8)\n",
                1,
                "secrets.token_hex",
                "pure",
                "the OS's randomness",
            ),
            (
                "kernel/packet.py",
                "def _other_id() -> str:\n    return secrets.token_hex(4)\n",
                1,
                "secrets.token_hex",
                "pure",
                "the OS's randomness",
            ),
            (
                "workflows/spec.py",
                "import uuid\n_U = uuid.uuid4()\n",
                1,
                "uuid.uuid4",
                "pure",
                "the OS's randomness",
            ),
            (
                "core/terminal.py",
                "import structlog\n",
                0,
                "import structlog",
                "pure",
                "structlog is neither the stdlib nor pydantic/yaml",
            ),
            (
                "workflows/spec.py",
                "class SpecError(ValueError):\n    pass\n",
                0,
                "class SpecError",
                "errors",
                "core/errors.py",
            ),
            (
                "human/notify.py",
                "class RetryLater(NotifyError):\n    pass\n",
                0,
                "class RetryLater",
                "errors",
                "core/errors.py",
            ),
            (
                "engine/planner.py",
                "from ambient.core import errors\n\n\nclass PlanError(errors.StateError):\n    pass\n",
                3,
                "class PlanError",
                "errors",
                "core/errors.py",
            ),
            (
                "runners/command.py",
                "class Overloaded(SpawnerLost):\n    pass\n",
                0,
                "class Overloaded",
                "errors",
                "core/errors.py",
            ),
            (
                "service/starts.py",
                "def _start() -> None:\n    class Gone(OSError):\n        pass\n",
                1,
                "class Gone",
                "errors",
                "core/errors.py",
            ),
            (
                "kernel/router.py",
                "class _Again(Exception):\n    pass\n",
                0,
                "class _Again",
                "errors",
                "a private signal is listed in SIGNALS",
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

    def test_what_is_not_an_exception_stays_allowed(self, tree: dict[str, str], found: list[Violation]) -> None:
        """A class named like an error that is not an exception passes, and so does core/errors.py's own tree."""
        planted, _ = _plant(tree, "web/pages/overview.py", "class ErrorPanel:\n    pass\n")
        planted, _ = _plant(planted, "engine/planner.py", "class PlanError(ValueObject):\n    pass\n")
        planted, _ = _plant(planted, "core/errors.py", "class PlanError(StateError):\n    pass\n")
        assert _new(tree, found, planted) == []

    def test_every_signal_is_a_private_exception_of_its_module(self, tree: dict[str, str]) -> None:
        """SIGNALS names real exception classes, each private (a rename or a move would leave a stale entry)."""
        exceptions = {
            f"{module_name(rel).removeprefix(ROOT + '.')}.{name}" for rel, _, name in _exception_classes(tree)
        }
        assert set(SIGNALS) <= exceptions
        assert all(name.rpartition(".")[2].startswith("_") for name in SIGNALS)

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


# ---------------------------------------------------------------------------------------------- rule (e)


def _package(root: Path, modules: Mapping[str, str]) -> Path:
    """A package tree ``ambient/`` under ``root`` holding ``modules`` (path under it → source), every folder a
    package; returns the package's folder, for :func:`read_tree`."""
    pkg = root / ROOT
    for rel, code in {"__init__.py": "", **modules}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [path.parent, *path.parent.parents]:
            if folder == root:
                break
            (folder / "__init__.py").touch()
        path.write_text(code)
    return pkg


class TestTheWriteRule:
    """A module outside storage and WRITERS that writes a file, in any of the ways Python offers, fails; the same
    calls in storage, in a module WRITERS names, and what only reads or removes, pass."""

    @pytest.mark.parametrize(
        ("code", "said"),
        [
            ("open(p, 'w')", "open(p, 'w')"),
            ("open(p, mode='a')", "open(p, mode='a')"),
            ("open(p, 'r+b')", "open(p, 'r+b')"),
            ("p.open('ab')", "p.open('ab')"),
            ("p.write_text('x')", "p.write_text('x')"),
            ("p.write_bytes(b'')", "p.write_bytes(b'')"),
            ("p.touch()", "p.touch()"),
            ("p.rename(q)", "p.rename(q)"),
            ("p.replace(q)", "p.replace(q)"),
            ("os.replace(p, q)", "os.replace(p, q)"),
            ("os.rename(p, q)", "os.rename(p, q)"),
            ("os.link(p, q)", "os.link(p, q)"),
            ("os.symlink(p, q)", "os.symlink(p, q)"),
            ("os.write(fd, b'x')", "os.write(fd, b'x')"),
            ("os.pwrite(fd, b'x', 0)", "os.pwrite(fd, b'x', 0)"),
            ("os.ftruncate(fd, 0)", "os.ftruncate(fd, 0)"),
            ("os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)", "os.open(p, os.O_WRONLY | os.O_CREAT, 384)"),
            ("os.open(p, O_RDWR)", "os.open(p, O_RDWR)"),
            ("mv(p, q)", "mv(p, q)"),
            ("tempfile.mkstemp()", "tempfile.mkstemp()"),
            ("tempfile.NamedTemporaryFile()", "tempfile.NamedTemporaryFile()"),
            ("shutil.copytree(p, q)", "shutil.copytree(p, q)"),
            ("shutil.move(p, q)", "shutil.move(p, q)"),
            ("sqlite3.connect(p)", "sqlite3.connect(p)"),
        ],
    )
    def test_a_write_outside_storage_fails(self, tmp_path: Path, code: str, said: str) -> None:
        head = "import os\nimport shutil\nimport sqlite3\nimport tempfile\nfrom os import O_RDWR\n"
        head += "from os import replace as mv\n\n\ndef act(p, q, fd):\n"
        pkg = _package(tmp_path, {"kernel/__init__.py": "", "kernel/courier.py": f"{head}    {code}\n"})
        found = write_violations(read_tree(pkg))
        assert [(v.rule, v.file, v.line, v.text) for v in found] == [
            ("writes", "src/ambient/kernel/courier.py", 10, said)
        ]
        assert "only storage" in found[0].why
        assert check(read_tree(pkg)) == found  # check() runs the rule too

    def test_what_is_not_a_write_passes(self, tmp_path: Path) -> None:
        """Reads, removals, folders, the null device, str/datetime ``replace``, a store's ``open``, and the same
        writes inside storage and in a module WRITERS names."""
        reads = (
            "import os\nimport sqlite3\nfrom datetime import datetime\n\n\ndef look(p, store, claim):\n"
            "    open(p).close()\n    open(p, 'rb').close()\n    p.open().close()\n"
            "    os.close(os.open(p, os.O_RDONLY | os.O_CLOEXEC))\n    os.close(os.open(os.devnull, os.O_WRONLY))\n"
            "    'a-b'.replace('-', '+')\n    datetime.now().replace(tzinfo=None)\n    store.open(claim)\n"
            "    sqlite3.connect(':memory:')\n    p.unlink()\n    p.mkdir()\n    os.unlink(p)\n"
        )
        writes = "import os\n\n\ndef put(p, q):\n    os.replace(p, q)\n    p.write_text('x')\n"
        tree = read_tree(
            _package(
                tmp_path,
                {
                    "kernel/courier.py": reads,
                    "claims/__init__.py": "",
                    "claims/lockstate.py": writes,
                    "storage/__init__.py": "",
                    "storage/fsutil.py": writes,
                },
            )
        )
        assert write_violations(tree) == []
        assert [v.file for v in write_violations(tree, writers={})] == ["src/ambient/claims/lockstate.py"] * 2

    def test_every_writer_is_a_module_and_writes(self, tree: dict[str, str]) -> None:
        """WRITERS names real modules that write today: a module that stopped writing leaves the list."""
        modules = {module_name(rel).removeprefix(ROOT + "."): rel for rel in tree}
        for writer in WRITERS:
            assert writer in modules, writer
            assert _effects(modules[writer], tree[modules[writer]]).writes, f"{writer} writes nothing any more"


class TestTheWiringRule:
    """A closure over ``self`` planted in the daemon's real build function fails, at its line; what only looks like
    one (a lambda over its own arguments, a bound method handed over) passes; a build function renamed away is said."""

    ANCHOR = "        p = self.paths\n"

    def _planted(self, tree: dict[str, str], code: str) -> tuple[dict[str, str], int]:
        """The real daemon.py with ``code`` (lines at the build's indentation) put before the build's first line; the
        line number of the first planted line."""
        text = tree["service/daemon.py"]
        assert text.count(self.ANCHOR) == 1, "the planting place moved: update ANCHOR"
        at = text.index(self.ANCHOR)
        return {**tree, "service/daemon.py": text[:at] + code + text[at:]}, text[:at].count("\n") + 1

    @pytest.mark.parametrize(
        ("code", "offset", "text"),
        [
            ("        wake = lambda: self.w.engine.wake()\n", 0, "lambda: self.w.engine.wake()"),
            (
                "        spawned = lambda req, pid: self.w.manager.record_spawn(req.run_id, pid)\n",
                0,
                "lambda req, pid: self.w.manager.record_spawn(req.run_id, pid)",
            ),
            (
                "        hooks = [(lambda path: self.w.engine.wake([path]))]\n",
                0,
                "lambda path: self.w.engine.wake([path])",
            ),
            ("        x = 1\n\n        def later() -> None:\n            self.w.engine.wake()\n", 2, "def later"),
            ("        async def later() -> None:\n            await self.reload()\n", 0, "def later"),
        ],
    )
    def test_a_closure_over_self_fails(
        self, tree: dict[str, str], found: list[Violation], code: str, offset: int, text: str
    ) -> None:
        planted, line = self._planted(tree, code)
        new = [v for v in _new(tree, found, planted) if v.rule == "wiring"]
        assert [(v.file, v.line, v.text) for v in new] == [("src/ambient/service/daemon.py", line + offset, text)]
        assert "binds a part late" in new[0].why

    def test_what_is_not_a_closure_over_self_passes(self, tree: dict[str, str], found: list[Violation]) -> None:
        code = (
            "        ordered = sorted([3, 1], key=lambda n: -n)\n"
            "        executor = self._executor\n"
            "        reload = self.reload\n"
        )
        planted, _ = self._planted(tree, code)
        assert [v for v in _new(tree, found, planted) if v.rule == "wiring"] == []

    def test_a_build_renamed_away_is_said(self, tree: dict[str, str]) -> None:
        renamed = {**tree, "service/daemon.py": tree["service/daemon.py"].replace("def _build(", "def _assemble(")}
        assert [(v.text, v.rule) for v in wiring_violations(renamed)] == [("Daemon._build", "wiring")]
        assert "gone" in wiring_violations(renamed)[0].why
