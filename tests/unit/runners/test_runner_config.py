"""Per-agent runner configs (runners/runner_config.py): defaults, each kind, and bad fields refused with file:line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ambient.core.errors import RunnerConfigError
from ambient.runners import CommandRunnerConfig, parse_runner_config
from ambient.storage.yamlfile import parse_yaml


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

    def test_a_typo_is_named_at_its_line_with_the_key_it_looks_like(self) -> None:
        """`argvs:` and `timout_s:`: each unknown key at its line with the key it looks like; the `argv` left missing
        at the typo's line, naming it; an unknown key like no other lists the keys there are."""
        text = "ambient:\n  runner:\n    kind: command\n    argvs: [x]\n    timout_s: 5\n    zzz: 1\n"
        data, lines = parse_yaml(text, source="agents/t.md", line_offset=1)
        with pytest.raises(RunnerConfigError) as info:
            parse_runner_config(
                data["ambient"]["runner"], file="agents/t.md", lines=lines, prefix=("ambient", "runner")
            )
        found = {(p.line, p.message) for p in info.value.problems}
        assert (5, "argvs: unknown key for a command runner; did you mean 'argv'?") in found
        assert (6, "timout_s: unknown key for a command runner; did you mean 'timeout_s'?") in found
        assert (5, "argv: Field required (is 'argvs' a misspelling of 'argv'?)") in found
        [other] = [m for line, m in found if line == 7]
        assert other.startswith("zzz: unknown key for a command runner; the keys here: ") and "argv" in other

    def test_not_a_mapping(self) -> None:
        """A runner that is not a mapping is a clear error."""
        with pytest.raises(RunnerConfigError, match="expected a mapping"):
            parse_runner_config(["kind", "command"])  # type: ignore[arg-type]


class TestNetwork:
    """``network:``: where a confined agent may connect by TCP (by port: Landlock knows no hosts)."""

    def test_none_by_default_and_ports_of_the_entries(self) -> None:
        from ambient.runners.runner_config import network_ports

        assert parse_runner_config({"kind": "command", "argv": ["x"]}).network == []  # type: ignore[union-attr]
        assert network_ports([]) == ()
        assert network_ports(["127.0.0.1:8080", "api.example.com:443", "[::1]:8080", "*:22"]) == (22, 443, 8080)
        assert network_ports("any") is None
        claude = parse_runner_config({"kind": "claude", "network": ["db.local:5432"]})
        assert claude.network == ["db.local:5432"]  # type: ignore[union-attr]

    @pytest.mark.parametrize(
        ("network", "expected"),
        [
            (["localhost"], "network entry 'localhost' is not host:port"),
            (["127.0.0.1:0"], "network entry '127.0.0.1:0' is not host:port"),
            (["127.0.0.1:70000"], "a port from 1 to 65535"),
            (["http://x:80"], "is not host:port"),
            ("all", "'all' is neither `any` nor a list of host:port"),
        ],
    )
    def test_bad_entries_are_named_with_their_line(self, network: Any, expected: str) -> None:
        text = "ambient:\n  runner:\n    kind: command\n    argv: [x]\n    network: " + json.dumps(network) + "\n"
        data, lines = parse_yaml(text, source="agents/net.md", line_offset=1)
        with pytest.raises(RunnerConfigError) as info:
            parse_runner_config(
                data["ambient"]["runner"], file="agents/net.md", lines=lines, prefix=("ambient", "runner")
            )
        [problem] = info.value.problems
        assert problem.line == 6 and problem.message.startswith("network"), problem
        assert expected in problem.message
