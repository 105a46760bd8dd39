"""Checks of a workflow spec beyond its schema (pure): :class:`Issue` findings at key paths.

Step ids, trigger targets, template variables (against :mod:`ambient.workflows.variables`), scope paths rendered
for every item (S-01), zones, and likely typos. The shell (:mod:`ambient.config.workflows`) adds the agents, the
access matrix and the lines; the routes between a chain's steps are :func:`ambient.engine.compile.route_issues`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel

from ambient.core.errors import InputError, WorkflowTemplateError
from ambient.core.problems import Severity
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, normalize
from ambient.workflows import templating
from ambient.workflows.exit_actions import Action, GotoAction, NextAction, SpawnAction, format_action
from ambient.workflows.spec import MISPLACED_KEYS, ChainStep, ChainWorkflow, ForEach, ForEachWorkflow, WorkflowSpec
from ambient.workflows.variables import COMPLETE_VARS, ITEM_VARS, STEP_VARS, spec_item_values


class Issue(NamedTuple):
    """A finding about a spec beyond its schema, at a key path (the shell maps it to file:line)."""

    loc: tuple[str | int, ...]
    message: str
    severity: Severity = "error"


def _known_keys(model: type[BaseModel], aliases: Iterable[str] = ()) -> list[str]:
    return [*model.model_fields, *aliases]


def _typo_issues(
    extra: Mapping[str, Any] | None, known: Sequence[str], loc: tuple[str | int, ...], *, strict: str | None = None
) -> list[Issue]:
    """Unknown keys: warnings for those that look like a known key or belong in another block (the top level keeps
    free keys such as ``note:``); with ``strict`` (the block's name), every unknown key is an error, since each key
    of that block changes how the work runs: ``gaet: human`` would run a deploy without its human gate."""
    candidates = {k: k for k in known}
    if not loc:  # top level: keys of the blocks below, written one level too high
        candidates.update({k: dest for k, dest in MISPLACED_KEYS.items() if dest.split(".")[0] in known})
    out: list[Issue] = []
    for key in extra or {}:
        if key in candidates:
            hint: str | None = candidates[key]
        else:
            close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.75)
            hint = candidates[close[0]] if close else None
        if strict is not None:
            guess = f"did you mean {hint!r}? " if hint else ""
            out.append(
                Issue(
                    (*loc, key),
                    f"unknown key {key!r} in {strict}: {guess}every key of {strict} changes "
                    f"how it runs, so an unknown one is refused; its keys: {', '.join(known)}",
                )
            )
        elif hint is not None:
            out.append(
                Issue((*loc, key), f"unknown key {key!r} is kept but not used; did you mean {hint!r}?", "warning")
            )
    return out


def raw_key_issues(data: Mapping[str, Any]) -> list[Issue]:
    """The unknown keys of ``for_each:`` and of each chain step, read from the document itself: a file whose schema
    fails elsewhere (``type: tset``) has its misspelt keys (``gaet: human``) named at once, not after the first fix.
    """
    out: list[Issue] = []
    fe = data.get("for_each")
    if isinstance(fe, Mapping):
        extra = {k: v for k, v in fe.items() if k not in ForEach.model_fields}
        out += _typo_issues(extra, _known_keys(ForEach), ("for_each",), strict="for_each")
    chain = data.get("chain")
    for i, step in enumerate(chain if isinstance(chain, list) else ()):
        if isinstance(step, Mapping):
            extra = {k: v for k, v in step.items() if k not in ChainStep.model_fields}
            out += _typo_issues(extra, _known_keys(ChainStep), ("chain", i), strict=f"step {step.get('step', i + 1)}")
    return out


def _check_vars(text: str, allowed: frozenset[str], loc: tuple[str | int, ...], where: str) -> list[Issue]:
    try:
        unknown = sorted(templating.roots(text) - allowed)
    except WorkflowTemplateError as exc:
        return [Issue(loc, exc.message)]
    if unknown:
        names = ", ".join("{{" + n + "}}" for n in sorted(allowed))
        return [Issue(loc, f"unknown template variable {{{{{unknown[0]}}}}} in {where}; available here: {names}")]
    return []


def _vars_in(value: Any, allowed: frozenset[str], loc: tuple[str | int, ...], where: str) -> list[Issue]:
    if isinstance(value, str):
        return _check_vars(value, allowed, loc, where) if templating.has_variables(value) else []
    if isinstance(value, Mapping):
        return [i for k, v in value.items() for i in _vars_in(v, allowed, (*loc, k), where)]
    if isinstance(value, list):
        return [i for n, v in enumerate(value) for i in _vars_in(v, allowed, (*loc, n), where)]
    return []


def _for_each_issues(spec: ForEachWorkflow, rules: tuple[ZoneRule, ...]) -> list[Issue]:
    fe = spec.for_each
    out: list[Issue] = []
    out += _typo_issues(fe.model_extra, _known_keys(ForEach), ("for_each",), strict="for_each")
    seen: dict[str, int] = {}
    for i, item in enumerate(fe.items):
        if item in seen:
            out.append(
                Issue(("for_each", "items", i), f"item {item!r} is listed twice (first at position {seen[item] + 1})")
            )
        seen.setdefault(item, i)
        if item.strip(".") == "" and len(item) >= 3:
            out.append(
                Issue(("for_each", "items", i), f"item {item!r} looks like an elision; list every item", "warning")
            )
    template_ok = True
    for n, f in enumerate(fe.scope.files):
        loc = ("for_each", "scope", "files", n)
        bad = _check_vars(f, ITEM_VARS, loc, "a scope file")
        if not bad:
            # The template's own text first (every value a harmless name): `../{{item}}` is one fault, not N.
            try:
                normalize(templating.render(f, dict.fromkeys(ITEM_VARS, "x")))
            except InputError as exc:
                bad = [Issue(loc, f"scope file {f!r} leaves the brain root whatever the item: {exc.message}")]
        out += bad
        template_ok = template_ok and not bad
    if template_ok:
        out += _render_items(spec, rules)
    out += _vars_in(fe.context, ITEM_VARS, ("for_each", "context"), "for_each.context")
    for outcome in ("success", "fail", "error", "escalate", "blocked"):
        for action in getattr(fe.on_return, outcome) or ():
            rloc = ("for_each", "on_return", outcome)
            if isinstance(action, GotoAction) and action.workflow in (None, spec.name):
                out.append(Issue(rloc, f"{format_action(action)}: a for_each workflow has no steps; use → next_item"))
            elif isinstance(action, SpawnAction):
                out.append(Issue(rloc, f"{format_action(action)}: starting a satellite is a chain step action"))
    return out


_MAX_ITEM_REPORTS = 5


def _render_items(spec: ForEachWorkflow, rules: tuple[ZoneRule, ...]) -> list[Issue]:
    """Render the scope with every item: an item that escapes the brain root is refused at load (S-01)."""
    fe = spec.for_each
    out: list[Issue] = []
    bad = 0
    for i in range(len(fe.items)):
        values = spec_item_values(spec, i)
        zones: set[str] = set()
        for n, template in enumerate(fe.scope.files):
            try:
                zones.add(templating.render_path(template, values, rules).zone)
            except InputError as exc:
                bad += 1
                if bad <= _MAX_ITEM_REPORTS:
                    out.append(
                        Issue(("for_each", "items", i), f"item {fe.items[i]!r} in scope file {n + 1}: {exc.message}")
                    )
        if fe.scope.zone is not None and zones and zones != {fe.scope.zone}:
            bad += 1
            if bad <= _MAX_ITEM_REPORTS:
                out.append(
                    Issue(
                        ("for_each", "scope", "zone"),
                        f"scope.zone is {fe.scope.zone!r} but item {fe.items[i]!r} touches zone(s) "
                        f"{', '.join(sorted(zones))}; expected the zone of the files",
                    )
                )
    if bad > _MAX_ITEM_REPORTS:
        out.append(Issue(("for_each", "items"), f"and {bad - _MAX_ITEM_REPORTS} more bad item paths"))
    return out


def _chain_issues(spec: ChainWorkflow) -> list[Issue]:
    out: list[Issue] = []
    seen: dict[str, int] = {}
    for i, step in enumerate(spec.chain):
        out += _typo_issues(step.model_extra, _known_keys(ChainStep), ("chain", i), strict=f"step {step.key}")
        if step.key in seen:
            out.append(
                Issue(("chain", i, "step"), f"step {step.key!r} is declared twice (first at chain[{seen[step.key]}])")
            )
        seen.setdefault(step.key, i)
        for field in ("scope", "story_angle", "input_contract"):
            value = getattr(step, field)
            if value:
                out += _check_vars(value, STEP_VARS, ("chain", i, field), field)
        if step.gate == "0-failures" and step.type != "test":
            out.append(
                Issue(
                    ("chain", i, "gate"),
                    f"gate 0-failures reads test results; step {step.key} is type {step.type}",
                    "warning",
                )
            )
        if spec.swarm_ready and i > 0 and not step.input_contract:
            out.append(
                Issue(
                    ("chain", i),
                    f"step {step.key} has no input_contract; contracts are required before swarm_ready: true",
                )
            )
        for field in ("on_done", "on_partial", "on_fail"):
            for action in getattr(step, field) or ():
                if isinstance(action, GotoAction) and action.workflow in (None, spec.name):
                    try:
                        spec.index_of(action.step)
                    except KeyError:
                        known = ", ".join(s.key for s in spec.chain)
                        out.append(
                            Issue(
                                ("chain", i, field),
                                f"trigger:{action.step} names no step of this chain (steps: {known})",
                            )
                        )
                elif isinstance(action, SpawnAction) and action.scope:
                    out += _check_vars(action.scope, STEP_VARS, ("chain", i, field), "a trigger scope")
        if step.gate == "never" and step.on_done and any(isinstance(a, NextAction | GotoAction) for a in step.on_done):
            out.append(
                Issue(
                    ("chain", i, "on_done"),
                    f"step {step.key} has gate: never (terminal) but on_done goes on",
                    "warning",
                )
            )
    return out


def spec_issues(spec: WorkflowSpec, zone_rules: Iterable[ZoneRule] = DEFAULT_RULES) -> list[Issue]:
    """Checks beyond the schema that need no agents: step ids, trigger targets, template variables, scope paths
    rendered for every item (S-01), zones, and likely typos (warnings). The routes between a chain's steps (loops,
    steps never reached) are checked by :func:`ambient.engine.compile.workflow_issues`, with the executor's own rule."""
    rules = tuple(zone_rules)
    aliases = ("workflow", "theme_branch")
    out: list[Issue] = []
    if isinstance(spec, ForEachWorkflow):
        out += _typo_issues(spec.model_extra, _known_keys(ForEachWorkflow, aliases), ())
        out += _for_each_issues(spec, rules)
    else:
        out += _typo_issues(spec.model_extra, _known_keys(ChainWorkflow, aliases), ())
        out += _chain_issues(spec)
        if spec.mode == "swarm" and not spec.swarm_ready:
            out.append(Issue(("mode",), "mode: swarm on a workflow not marked swarm_ready: true", "warning"))
    if spec.on_complete is not None:
        out += _vars_in(spec.on_complete.payload, COMPLETE_VARS, ("on_complete", "payload"), "on_complete")
    return out


def cross_targets(spec: WorkflowSpec) -> list[tuple[tuple[str | int, ...], GotoAction]]:
    """Every ``trigger:<workflow>/<step>`` naming another workflow, with where it is written."""
    out: list[tuple[tuple[str | int, ...], GotoAction]] = []
    places: list[tuple[tuple[str | int, ...], tuple[Action, ...] | None]] = []
    if isinstance(spec, ForEachWorkflow):
        r = spec.for_each.on_return
        places = [
            (("for_each", "on_return", o), getattr(r, o)) for o in ("success", "fail", "error", "escalate", "blocked")
        ]
    else:
        places = [
            (("chain", i, f), getattr(s, f))
            for i, s in enumerate(spec.chain)
            for f in ("on_done", "on_partial", "on_fail")
        ]
    for loc, actions in places:
        for a in actions or ():
            if isinstance(a, GotoAction) and a.workflow not in (None, spec.name):
                out.append((loc, a))
    return out
