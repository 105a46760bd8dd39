"""The runner basics every runner stands on (runners/base.py, and the dispatch of runners/__init__.py): per-agent
runner configs with file:line errors, argv templating (S-07, pure part), the agent protocol (pure part).

The command runner running real agents: test_runner_command.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.runners import (
    AgentResult,
    CommandRunnerConfig,
    RunnerConfigError,
    Runners,
    RunRequest,
    TemplateError,
    idempotency_key,
    interpret_output,
    parse_runner_config,
    render_argv,
)
from ambient.storage.yamlfile import parse_yaml

TOKEN = "chan-tok-7f3e9a1c55"


# ---------------------------------------------------------------------------------------------------------------
# Config


class TestConfig:
    """Parsing of per-agent runner configs."""

    def test_defaults(self) -> None:
        """A minimal command config gets the documented defaults."""
        cfg = parse_runner_config({"kind": "command", "argv": ["/bin/true"]})
        assert isinstance(cfg, CommandRunnerConfig)
        assert (cfg.timeout_s, cfg.max_output_bytes, cfg.stderr_tail_bytes, cfg.kill_grace_s) == (
            600.0,
            1024 * 1024,
            8 * 1024,
            5.0,
        )
        assert cfg.env == {} and cfg.cwd is None

    def test_other_kinds(self) -> None:
        """Callable and assisted configs parse by their kind."""
        assert parse_runner_config({"kind": "callable", "target": "pkg.mod:func"}).kind == "callable"
        assisted = parse_runner_config({"kind": "assisted", "poll_s": 5})
        assert assisted.kind == "assisted" and assisted.timeout_s > 0

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            ({}, "kind: missing; expected one of 'command', 'callable', 'assisted'"),
            ({"kind": "shell", "cmd": "ls"}, "kind: 'shell' is not a runner kind"),
            ({"kind": "command"}, "argv: Field required"),
            ({"kind": "command", "argv": []}, "argv: List should have at least 1 item"),
            ({"kind": "command", "argv": ["x"], "shell": True}, "shell: unknown key for a command runner"),
            ({"kind": "command", "argv": ["{{item}}"]}, "argv[0] (the program) may only be a fixed path"),
            ({"kind": "command", "argv": ["x", "a{{b"]}, "is not a placeholder"),
            ({"kind": "command", "argv": ["x", "a\x00b"]}, "argv[1] contains a NUL byte"),
            ({"kind": "command", "argv": ["x"], "env": {"NOTIFY_SOCKET": "/x"}}, "is reserved"),
            ({"kind": "command", "argv": ["x"], "env": {"AMBIENT_CHANNEL_TOKEN": "x"}}, "is reserved"),
            ({"kind": "command", "argv": ["x"], "env": {"LD_PRELOAD": "x.so"}}, "is reserved"),
            ({"kind": "command", "argv": ["x"], "env": {"A B": "x"}}, "not a valid variable name"),
            ({"kind": "command", "argv": ["x"], "cwd": "../out"}, "contains '..'"),
            ({"kind": "command", "argv": ["x"], "timeout_s": 0}, "timeout_s: Input should be greater than 0"),
            ({"kind": "callable", "target": "no_colon"}, 'must be in format "<module>:<attribute>"'),
        ],
    )
    def test_bad_configs(self, raw: dict[str, Any], expected: str) -> None:
        """Each bad config is refused with a message naming the field and what is expected."""
        with pytest.raises(RunnerConfigError) as info:
            parse_runner_config(raw, file="agents/deploy.md")
        assert expected in str(info.value)
        assert str(info.value).startswith("agents/deploy.md")

    def test_lines_from_frontmatter(self) -> None:
        """Problems carry the line of the bad field inside the agent's frontmatter."""
        text = "name: deploy\nambient:\n  runner:\n    kind: command\n    argv: [x]\n    timeout_s: -1\n    bogus: 1\n"
        data, lines = parse_yaml(text, source="agents/deploy.md", line_offset=1)
        with pytest.raises(RunnerConfigError) as info:
            parse_runner_config(
                data["ambient"]["runner"], file="agents/deploy.md", lines=lines, prefix=("ambient", "runner")
            )
        found = {(p.line, p.message.split(":")[0]) for p in info.value.problems}
        assert found == {(7, "timeout_s"), (8, "bogus")}

    def test_not_a_mapping(self) -> None:
        """A runner that is not a mapping is a clear error."""
        with pytest.raises(RunnerConfigError, match="expected a mapping"):
            parse_runner_config(["kind", "command"])  # type: ignore[arg-type]

    def test_runners_dispatch(self) -> None:
        """Runners picks the runner by kind and refuses assisted when none is configured."""
        runners = Runners()
        assert runners.get(parse_runner_config({"kind": "command", "argv": ["x"]})) is runners.command
        assert runners.get(parse_runner_config({"kind": "callable", "target": "a:b"})) is runners.callable
        with pytest.raises(Exception, match="no assisted runner"):
            runners.get(parse_runner_config({"kind": "assisted"}))


# ---------------------------------------------------------------------------------------------------------------
# argv templating (S-07, pure part)


class TestTemplating:
    """Plain {{name}} substitution, one value per argv element."""

    def test_render(self) -> None:
        """Each element is rendered on its own, values are never re-expanded."""
        out = render_argv(["prog", "--item={{item}}", "{{ a }}-{{b}}"], {"item": "{{b}}", "a": "x y", "b": "$(z)"})
        assert out == ["prog", "--item={{b}}", "x y-$(z)"]

    def test_unknown_name(self) -> None:
        """An unknown template name is an error naming the element and the known names."""
        with pytest.raises(TemplateError, match=r"argv\[1\]: unknown template name \{\{nope\}\}; known names: item"):
            render_argv(["prog", "{{nope}}"], {"item": "x"})

    def test_nul_refused(self) -> None:
        """A value with a NUL byte cannot become an argument."""
        with pytest.raises(TemplateError, match="NUL"):
            render_argv(["prog", "{{item}}"], {"item": "a\x00b"})

    @pytest.mark.parametrize("value", ["--output=/etc/x", "-rf", "-"])
    def test_leading_dash_needs_double_dash(self, value: str) -> None:
        """A value starting with '-' at the start of an element is refused unless '--' comes before it."""
        with pytest.raises(TemplateError, match="put a literal '--'"):
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


# ---------------------------------------------------------------------------------------------------------------
# The agent protocol (pure part)


class TestProtocol:
    """interpret_output: how an agent's JSON answer maps onto a result."""

    @pytest.mark.parametrize(
        ("answer", "status", "result_status", "reason"),
        [
            (None, "success", "ok", None),
            ({}, "success", "ok", None),
            ({"status": "ok", "n": 1}, "success", "ok", None),
            ({"status": "partial"}, "success", "partial", None),
            ({"status": "failed"}, "fail", "failed", "agent_failed"),
            ({"status": "error", "error": "boom"}, "error", None, "agent_error"),
            ({"signal": "RETURN", "result": {"status": "ok"}}, "success", "ok", None),
            ({"signal": "RETURN", "result": {"status": "failed"}}, "fail", "failed", "agent_failed"),
            ({"signal": "ESCALATE", "options": ["a", "b"], "question": "?"}, "escalate", None, None),
            ({"signal": "ERROR", "context": {"error": "x"}}, "error", None, "agent_error"),
            ({"signal": "BLOCKED_ON", "context": {"missing": "key"}}, "blocked", None, None),
            ({"signal": "RETURN", "from": "deploy", "result": {}}, "success", "ok", None),
            ({"status": "done"}, "error", None, "bad_output"),
            ({"signal": "SPAWN"}, "error", None, "bad_output"),
            ({"signal": "RETURN", "result": "text"}, "error", None, "bad_output"),
            ({"signal": "ESCALATE", "options": []}, "error", None, "bad_output"),
            ({"signal": "RETURN", "result": {}, "to": "human"}, "error", None, "bad_output"),
            ({"signal": "RETURN", "from": "human", "result": {}}, "error", None, "sender_mismatch"),
            ({"sender": "orchestrator", "status": "ok"}, "error", None, "sender_mismatch"),
            ([1, 2], "error", None, "bad_output"),
        ],
    )
    def test_mapping(self, answer: Any, status: str, result_status: str | None, reason: str | None) -> None:
        """Each documented answer shape maps to its status, result status and reason."""
        res = interpret_output(answer, agent="deploy")
        assert (res.status, res.result_status, res.reason) == (status, result_status, reason)

    def test_escalate_fields(self) -> None:
        """An ESCALATE carries its options and question."""
        res = interpret_output({"signal": "ESCALATE", "options": ["retry", "skip"], "question": "Q?"}, agent="a")
        assert (res.options, res.question, res.signal) == (["retry", "skip"], "Q?", "ESCALATE")

    def test_limits(self) -> None:
        """Huge strings and deep nesting in an answer are rejected with where they are."""
        huge = interpret_output({"status": "ok", "blob": "A" * 70_000}, agent="a")
        assert huge.reason == "bad_output" and "blob" in (huge.error or "")
        deep: Any = {}
        for _ in range(80):
            deep = {"d": deep}
        assert interpret_output({"status": "ok", "x": deep}, agent="a").reason == "bad_output"

    def test_record_has_no_output(self) -> None:
        """to_record is small and JSON-ready."""
        res = AgentResult(status="success", output={"big": "x" * 1000}, duration_ms=5, exit_code=0)
        assert json.loads(json.dumps(res.to_record())) == {
            "status": "success",
            "signal": "RETURN",
            "duration_ms": 5,
            "exit_code": 0,
        }

    def test_token_not_in_repr(self, tmp_path: Path) -> None:
        """The channel token never shows in a request's repr."""
        req = RunRequest(
            packet={"from": "orchestrator", "to": "deploy", "signal": "SPAWN"},
            agent="deploy",
            run_id="run-1",
            item="instance-01",
            attempt=1,
            key=idempotency_key("run-1", "instance-01", 1),
            channel_token=TOKEN,
            brain=tmp_path,
        )
        assert TOKEN not in repr(req)
