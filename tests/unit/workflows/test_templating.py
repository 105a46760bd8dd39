"""Templating: plain {{name}} substitution, no evaluation, paths that never leave the brain (S-01)."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import InputError, UnsafePathError, WorkflowTemplateError
from ambient.workflows.templating import (
    RenderedPath,
    has_variables,
    render,
    render_argv,
    render_path,
    render_value,
    roots,
    variables,
)

VALUES = {
    "item": "instance-01",
    "index": 1,
    "total": 10,
    "success_count": 9,
    "workflow": "deploy-batch",
    "ok": True,
    "ratio": 0.5,
    "prior": {"result": {"status": "ok", "tests": {"failed": 0}, "files_modified": ["a.py", "b.py"]}},
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{item}}", "instance-01"),
        ("vps/configs/{{item}}.yml", "vps/configs/instance-01.yml"),
        ("{{ item }}", "instance-01"),
        ("{{success_count}}/{{total}} instances deployed", "9/10 instances deployed"),
        ("{{prior.result.status}}", "ok"),
        ("{{prior.result.tests.failed}} failed", "0 failed"),
        ("{{prior.result.files_modified.1}}", "b.py"),
        ("{{ok}}", "true"),
        ("{{ratio}}", "0.5"),
        ("no template at all", "no template at all"),
        ("a }} stray close", "a }} stray close"),
        ("{{workflow}}-{{index}}", "deploy-batch-1"),
    ],
)
def test_render_substitutes_from_the_mapping(template: str, expected: str) -> None:
    """Each {{name}} is replaced by its value from the mapping, dotted names walk plain data."""
    assert render(template, VALUES) == expected


def test_substituted_text_is_never_scanned_again() -> None:
    """A value that looks like a template stays literal: there is no second pass."""
    assert render("{{item}}", {"item": "{{total}}", "total": 3}) == "{{total}}"


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{{itm}}", "unknown template variable 'itm'"),
        ("{{prior.result.nope}}", "has no field 'nope'"),
        ("{{prior.result}}", "is a mapping"),
        ("{{prior.result.files_modified}}", "is a list"),
        ("{{prior.result.files_modified.7}}", "has no field '7'"),
        ("{{item", "unclosed '{{'"),
        ("{{ total - 1 }}", "never evaluate expressions"),
        ("{{ __import__('os') }}", "never evaluate expressions"),
        ("{{}}", "is not a variable name"),
    ],
)
def test_render_errors_are_clear(template: str, fragment: str) -> None:
    """Unknown names, missing fields, non-text values and expressions are errors that say why."""
    with pytest.raises(WorkflowTemplateError) as info:
        render(template, VALUES)
    assert fragment in str(info.value)


def test_unknown_variable_lists_the_known_ones() -> None:
    """The error for an unknown variable names the variables that exist."""
    with pytest.raises(WorkflowTemplateError, match="known variables: item, total"):
        render("{{itme}}", {"item": "a", "total": 1})


def test_null_value_is_an_error() -> None:
    """A null value is not silently rendered as an empty string."""
    with pytest.raises(WorkflowTemplateError, match="no value"):
        render("x/{{item}}", {"item": None})


def test_variables_and_roots() -> None:
    """variables() gives dotted names, roots() their first part, has_variables() spots templates."""
    t = "{{item}} {{prior.result.status}} {{ total }}"
    assert variables(t) == {"item", "prior.result.status", "total"}
    assert roots(t) == {"item", "prior", "total"}
    assert has_variables(t) and not has_variables("plain")


def test_render_value_renders_strings_inside_data() -> None:
    """Strings nested in mappings and lists are rendered; other values and keys are kept."""
    data = {"instance": "{{item}}", "n": 3, "list": ["{{total}}", None], "{{key}}": "k"}
    assert render_value(data, VALUES) == {"instance": "instance-01", "n": 3, "list": ["10", None], "{{key}}": "k"}


@pytest.mark.parametrize(
    ("template", "item", "expected"),
    [
        (
            "infrastructure/vps/configs/{{item}}.yml",
            "instance-01",
            ("infrastructure/vps/configs/instance-01.yml", "project"),
        ),
        ("profil/{{item}}", "capital.md", ("profil/capital.md", "personal")),
        ("agents/{{item}}.md", "coder", ("agents/coder.md", "kernel")),
        ("./projets//{{item}}/", "feature", ("projets/feature/", "project")),
        # Percent sequences are literal characters: nothing is URL-decoded.
        ("configs/{{item}}", "%2e%2e", ("configs/%2e%2e", "project")),
        ("configs/{{item}}.yml", "..x", ("configs/..x.yml", "project")),
    ],
)
def test_render_path_normalises_and_infers_the_zone(template: str, item: str, expected: tuple[str, str]) -> None:
    """A rendered path is normalised and comes with the zone its most specific rule gives."""
    assert render_path(template, {"item": item}) == RenderedPath(*expected)


S01_ITEMS = [
    "../../etc/passwd",
    "/etc/passwd",
    "a/../../b",
    "..\\x",
    "x\x00y",
    "a" * 300,
    "é" * 130,  # 260 bytes in UTF-8 although 130 characters
    "%2e%2e/",
    "..",
    ".",
    "",
    "line\nbreak",
]


@pytest.mark.parametrize("item", S01_ITEMS, ids=repr)
def test_render_path_refuses_s01_items(item: str) -> None:
    """RELIABILITY S-01: every hostile item is refused with an UnsafePathError, never rendered."""
    with pytest.raises(UnsafePathError):
        render_path("infrastructure/vps/configs/{{item}}.yml", {"item": item})


@pytest.mark.parametrize(
    "template",
    ["/etc/{{item}}", "../{{item}}", "a/../../{{item}}", "x\\{{item}}", "{{item}}/../..", "./"],
)
def test_render_path_refuses_escaping_templates(template: str) -> None:
    """A template that leaves the brain root (or names the root itself) is refused whatever the item."""
    with pytest.raises(UnsafePathError):
        render_path(template, {"item": "ok"})


def test_render_path_refuses_non_text() -> None:
    """A path template must be text."""
    with pytest.raises(WorkflowTemplateError):
        render_path(42, {})  # type: ignore[arg-type]


def test_render_argv_keeps_one_value_per_element() -> None:
    """S-07: a value with spaces or shell syntax stays one argv element, byte for byte."""
    hostile = "; touch PWN $(id) `id`"
    argv = render_argv(["deploy", "--target", "{{item}}", "--name={{item}}"], {"item": hostile})
    assert argv == ["deploy", "--target", hostile, f"--name={hostile}"]


def test_render_argv_refuses_nul() -> None:
    """S-07: a NUL byte cannot reach exec."""
    with pytest.raises(WorkflowTemplateError, match="NUL"):
        render_argv(["{{item}}"], {"item": "a\x00b"})


def test_render_argv_can_refuse_option_like_values() -> None:
    """With reject_option_values, '-rf' coming from a value is refused; a literal option is not."""
    assert render_argv(["-v", "{{item}}"], {"item": "x"}, reject_option_values=True) == ["-v", "x"]
    with pytest.raises(WorkflowTemplateError, match="option"):
        render_argv(["{{item}}"], {"item": "-rf"}, reject_option_values=True)
    assert render_argv(["{{item}}"], {"item": "-rf"}) == ["-rf"]


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(item=st.text(max_size=300))
def test_rendered_paths_never_escape_their_folder(item: str) -> None:
    """Property (S-01): for any item, the path is refused or stays inside infrastructure/vps/configs/."""
    folder = "infrastructure/vps/configs/"
    try:
        rendered = render_path(folder + "{{item}}.yml", {"item": item})
    except InputError:
        return
    path = rendered.path
    assert path.startswith(folder)
    assert not path.startswith("/")
    assert ".." not in path.split("/")
    assert "\x00" not in path
    assert posixpath.normpath("/brain/" + path).startswith("/brain/" + folder)
    assert rendered.zone == "project"


@settings(max_examples=300, deadline=None)
@given(
    item=st.text(alphabet=st.sampled_from("./\\%2e\x00a-_~ "), max_size=20), prefix=st.sampled_from(["", "x/", "a/b/"])
)
@pytest.mark.slow
def test_rendered_paths_stay_in_the_brain_for_path_alphabets(item: str, prefix: str) -> None:
    """Property: with an alphabet of path syntax, a rendered path never climbs above the brain root."""
    try:
        rendered = render_path(prefix + "{{item}}", {"item": item})
    except InputError:
        return
    assert posixpath.normpath("/brain/" + rendered.path).startswith("/brain/")
    assert ".." not in rendered.path.split("/")
