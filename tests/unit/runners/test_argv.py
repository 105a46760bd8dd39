"""A command agent's argv templating (runners/argv.py; S-07, the pure part): plain {{name}} substitution, one value
per argv element. The command runner starting real programs with it: test_runner_command.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import SpawnTemplateError
from ambient.runners import render_argv


class TestTemplating:
    """Plain {{name}} substitution, one value per argv element."""

    def test_render(self) -> None:
        """Each element is rendered on its own, values are never re-expanded."""
        out = render_argv(["prog", "--item={{item}}", "{{ a }}-{{b}}"], {"item": "{{b}}", "a": "x y", "b": "$(z)"})
        assert out == ["prog", "--item={{b}}", "x y-$(z)"]

    def test_unknown_name(self) -> None:
        """An unknown template name is an error naming the element and the known names."""
        with pytest.raises(
            SpawnTemplateError, match=r"argv\[1\]: unknown template name \{\{nope\}\}; known names: item"
        ):
            render_argv(["prog", "{{nope}}"], {"item": "x"})

    def test_nul_refused(self) -> None:
        """A value with a NUL byte cannot become an argument."""
        with pytest.raises(SpawnTemplateError, match="NUL"):
            render_argv(["prog", "{{item}}"], {"item": "a\x00b"})

    @pytest.mark.parametrize("value", ["--output=/etc/x", "-rf", "-"])
    def test_leading_dash_needs_double_dash(self, value: str) -> None:
        """A value starting with '-' at the start of an element is refused unless '--' comes before it."""
        with pytest.raises(SpawnTemplateError, match="put a literal '--'"):
            render_argv(["prog", "{{item}}"], {"item": value})
        assert render_argv(["prog", "--", "{{item}}"], {"item": value}) == ["prog", "--", value]
        assert render_argv(["prog", "--name={{item}}"], {"item": value}) == ["prog", f"--name={value}"]

    @pytest.mark.slow
    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\x00")), max_size=5))
    def test_values_are_exact_single_elements(self, values: list[str]) -> None:
        """Whatever the values, each templated element renders to exactly that value."""
        names = {f"v{i}": v for i, v in enumerate(values)}
        argv = ["prog", "--", *[f"{{{{v{i}}}}}" for i in range(len(values))]]
        assert render_argv(argv, names) == ["prog", "--", *values]
