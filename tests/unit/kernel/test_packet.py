"""The context packet: strict models, the signal → payload rule, bounds, JSON/YAML round trip (DESIGN 2.1-2.2, S-04)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from ambient.core.errors import PacketError
from ambient.kernel.packet import (
    BROADCAST,
    CLAIMS_STORE,
    KERNEL_SIGNALS,
    MAX_FILES,
    MAX_OPTIONS,
    MAX_PACKET_BYTES,
    MAX_RESULT_DEPTH,
    MAX_STR,
    ORCHESTRATION_SIGNALS,
    SIGNAL_RULES,
    Packet,
    Signal,
    adapt_changes,
    adapt_changes_problem,
    make_packet,
    new_packet_id,
    parse_packet,
    validation_message,
)

NOW = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)


def raw(**kw: Any) -> dict[str, Any]:
    """A packet mapping with sensible defaults; keyword ``from_`` sets ``from``."""
    data: dict[str, Any] = {
        "id": "pkt_0123456789abcdef",
        "ts": "2026-03-18T10:00:00Z",
        "from": "orchestrator",
        "to": "debug",
        "signal": "SPAWN",
    }
    if "from_" in kw:
        data["from"] = kw.pop("from_")
    data.update(kw)
    return data


def errors_of(data: Any) -> str:
    """The PacketError text of an invalid packet."""
    with pytest.raises(PacketError) as info:
        parse_packet(data)
    return str(info.value)


def types_of(data: dict[str, Any]) -> set[str]:
    """The pydantic error types of an invalid packet."""
    with pytest.raises(ValidationError) as info:
        Packet.model_validate(data)
    return {e["type"] for e in info.value.errors()}


# One valid packet per signal: the minimum each signal needs.
VALID: dict[Signal, dict[str, Any]] = {
    Signal.SPAWN: raw(scope={"files": ["projets/app/"], "zone": "project"}, payload={"context": {"task": "fix"}}),
    Signal.RETURN: raw(from_="debug", to="orchestrator", signal="RETURN", payload={"result": {"status": "ok"}}),
    Signal.BLOCKED_ON: raw(
        from_="debug", to="orchestrator", signal="BLOCKED_ON", payload={"context": {"missing": "x"}}
    ),
    Signal.ESCALATE: raw(from_="coach", to="human", signal="ESCALATE", payload={"options": ["a", "b"]}),
    Signal.ERROR: raw(from_="debug", to="orchestrator", signal="ERROR", payload={"context": {"error": "boom"}}),
    Signal.CHECKPOINT: raw(from_="coach", to=CLAIMS_STORE, signal="CHECKPOINT", payload={"context": {"s": 1}}),
    Signal.HANDOFF: raw(
        from_="scribe",
        to="scribe",
        signal="HANDOFF",
        session_id="sess-1",
        payload={"context": {"a": 1}, "decision": "go"},
    ),
    Signal.ORCHESTRATE: raw(to="kernel-orchestrator", signal="ORCHESTRATE", payload={"context": {"workflow": "w"}}),
    Signal.ADAPT: raw(to="kernel-orchestrator", signal="ADAPT", payload={"context": {"workflow": "w", "changes": {}}}),
    Signal.ABORT: raw(to="kernel-orchestrator", signal="ABORT", payload={"context": {"workflow": "w", "reason": "r"}}),
    Signal.STEP_DONE: raw(to="orchestrator", signal="STEP_DONE", payload={"context": {"step": 2, "result": "ok"}}),
    Signal.GATE_PENDING: raw(to="human", signal="GATE_PENDING", payload={"context": {"step": "2", "message": "ok?"}}),
    Signal.BLOCKED: raw(to="human", signal="BLOCKED", payload={"context": {"step": 1, "reason": "lock"}}),
    Signal.DONE: raw(to="human", signal="DONE", payload={"context": {"workflow": "w", "summary": "3/3"}}),
    Signal.CIRCUIT_BREAK: raw(to="human", signal="CIRCUIT_BREAK", payload={"context": {"step": 1, "fails": 3}}),
    Signal.NOTIFY: raw(to=BROADCAST, signal="NOTIFY", payload={"context": {"message": "deployed"}}),
}


class TestSignals:
    def test_vocabulary(self) -> None:
        """The 7 kernel signals of ADR-026 plus the 9 orchestration signals, each with a payload rule."""
        assert {s.value for s in KERNEL_SIGNALS} == {
            "SPAWN", "RETURN", "BLOCKED_ON", "CHECKPOINT", "HANDOFF", "ESCALATE", "ERROR",
        }  # fmt: skip
        assert {s.value for s in ORCHESTRATION_SIGNALS} == {
            "ORCHESTRATE", "ADAPT", "ABORT", "STEP_DONE", "GATE_PENDING", "BLOCKED", "DONE", "CIRCUIT_BREAK", "NOTIFY",
        }  # fmt: skip
        assert set(SIGNAL_RULES) == set(Signal)
        assert set(VALID) == set(Signal)

    @pytest.mark.parametrize("signal", list(Signal))
    def test_valid_packet_round_trips(self, signal: Signal) -> None:
        """A valid packet of every signal validates and round-trips through JSON and YAML unchanged."""
        pkt = parse_packet(VALID[signal])
        assert pkt.signal is signal
        assert parse_packet(pkt.to_json()) == pkt
        assert parse_packet(pkt.to_yaml()) == pkt
        assert parse_packet(pkt.to_json().encode()) == pkt
        assert json.loads(pkt.to_json())["from"] == pkt.from_

    @pytest.mark.parametrize("signal", list(Signal))
    def test_wire_view_is_the_json_form_without_copies(self, signal: Signal) -> None:
        """wire_view (what the live threads read) holds the same routing fields and payload as to_dict."""
        pkt = parse_packet(VALID[signal])
        full = pkt.to_dict()
        view = pkt.wire_view()
        assert view == {k: v for k, v in full.items() if k in view}
        assert set(full) - set(view) == {"id", "ts", "scope"}
        assert json.loads(json.dumps(view)) == view  # plain JSON, as the wire form
        assert view["payload"]["context"] is pkt.payload.context  # shared, not copied

    def test_unknown_signal(self) -> None:
        """An unknown signal (kind mismatch) is rejected as an enum error listing the signals."""
        assert types_of(raw(signal="REQUEST")) == {"enum"}
        assert "SPAWN" in errors_of(raw(signal="REQUEST"))


# Every payload field each kernel signal must refuse (DESIGN 2.2: "rejected, with an error that names the field").
_D, _O, _R, _C = (
    {"payload.decision": {"decision": "x"}},
    {"payload.options": {"options": ["a"]}},
    {"payload.result": {"result": 1}},
    {"payload.context": {"context": {"leak": "source"}}},
)
FORBIDDEN: dict[Signal, dict[str, dict[str, Any]]] = {
    Signal.SPAWN: _D | _O | _R,
    Signal.RETURN: _C | _D | _O,
    Signal.BLOCKED_ON: _D | _O | _R,
    Signal.ESCALATE: _D | _R,
    Signal.ERROR: _D | _O | _R,
    Signal.CHECKPOINT: _D | _O | _R,
    Signal.HANDOFF: _O | _R,
}


class TestPayloadRule:
    @pytest.mark.parametrize(
        ("signal", "field", "extra"),
        [(s, f, e) for s, fields in FORBIDDEN.items() for f, e in fields.items()],
        ids=lambda v: str(v),
    )
    def test_forbidden_payload_field(self, signal: Signal, field: str, extra: dict[str, Any]) -> None:
        """A payload field the signal does not allow is rejected with the signal, the field and what is allowed."""
        data = json.loads(json.dumps(VALID[signal]))
        data.setdefault("payload", {}).update(extra)
        msg = errors_of(data)
        assert f"signal {signal} does not allow {field}" in msg
        assert f"{signal} carries only" in msg

    @pytest.mark.parametrize("signal", [s for s in Signal if s is not Signal.SPAWN])
    def test_files_only_on_spawn(self, signal: Signal) -> None:
        """scope.files is task input: only SPAWN carries it."""
        data = json.loads(json.dumps(VALID[signal]))
        data["scope"] = {"files": ["projets/a.py"]}
        assert f"signal {signal} does not allow scope.files" in errors_of(data)

    @pytest.mark.parametrize("signal", list(Signal))
    def test_zone_allowed_on_every_signal(self, signal: Signal) -> None:
        """scope.zone is an address (checked by the matrix), so every signal may carry it."""
        data = json.loads(json.dumps(VALID[signal]))
        data["scope"] = {**data.get("scope", {}), "zone": "project"}
        assert parse_packet(data).scope.zone == "project"

    def test_empty_forms_count_as_absent(self) -> None:
        """The ADR's empty forms (context {}, decision null, options [], result null) are not 'carried'."""
        data = raw(
            from_="debug", to="orchestrator", signal="RETURN",
            payload={"context": {}, "decision": None, "options": [], "result": "done"},
        )  # fmt: skip
        assert parse_packet(data).payload.result == "done"

    def test_return_without_result_is_allowed(self) -> None:
        """A RETURN may carry no result (a bare 'done')."""
        assert parse_packet(raw(from_="debug", to="orchestrator", signal="RETURN")).payload.result is None

    def test_escalate_needs_options(self) -> None:
        """ESCALATE without options (or with an empty list) is rejected."""
        assert "requires payload.options" in errors_of(raw(signal="ESCALATE", payload={"options": []}))
        assert "requires payload.options" in errors_of(raw(signal="ESCALATE"))

    def test_escalate_question_only(self) -> None:
        """ESCALATE's context may hold only the question, never a full context."""
        ok = raw(signal="ESCALATE", payload={"options": ["a"], "context": {"question": "which?"}})
        assert parse_packet(ok).payload.context == {"question": "which?"}
        bad = raw(signal="ESCALATE", payload={"options": ["a"], "context": {"question": "q", "secrets": "x"}})
        assert "does not allow payload.context.secrets" in errors_of(bad)
        wrong = raw(signal="ESCALATE", payload={"options": ["a"], "context": {"question": 3}})
        assert "payload.context.question must be str" in errors_of(wrong)
        long = raw(signal="ESCALATE", payload={"options": ["a"], "context": {"question": "x" * 5000}})
        assert "longer than" in errors_of(long)

    @pytest.mark.parametrize("signal", [Signal.BLOCKED_ON, Signal.ERROR])
    def test_blocker_and_error_need_context(self, signal: Signal) -> None:
        """BLOCKED_ON and ERROR must describe the blocker or the error."""
        assert f"signal {signal} requires payload.context" in errors_of(raw(signal=signal.value))

    def test_checkpoint_only_to_claims_store(self) -> None:
        """CHECKPOINT goes to bsi only, and bsi receives nothing else."""
        assert "claims store only" in errors_of(raw(signal="CHECKPOINT", to="human", payload={"context": {"a": 1}}))
        msg = errors_of(raw(signal="RETURN", to=CLAIMS_STORE, payload={"result": 1}))
        assert "receives CHECKPOINT only" in msg

    def test_handoff_only_to_next_session(self) -> None:
        """HANDOFF goes to the sender itself (its next session) and names the session handing off."""
        other = raw(from_="scribe", to="debug", signal="HANDOFF", session_id="s1", payload={"context": {"a": 1}})
        assert "next session only" in errors_of(other)
        no_session = raw(from_="scribe", to="scribe", signal="HANDOFF", payload={"context": {"a": 1}})
        assert "requires session_id" in errors_of(no_session)

    def test_broadcast_only_for_notify(self) -> None:
        """Only NOTIFY may be broadcast; broadcast and bsi are never senders."""
        assert "only for NOTIFY" in errors_of(raw(to=BROADCAST, signal="SPAWN"))
        assert "is a destination, not a sender" in errors_of(VALID[Signal.NOTIFY] | {"from": "broadcast"})

    @pytest.mark.parametrize(
        ("signal", "context", "expected"),
        [
            ("ORCHESTRATE", {}, "requires payload.context"),
            ("ORCHESTRATE", {"step": 1}, "requires payload.context.workflow"),
            ("ADAPT", {"workflow": "w"}, "requires payload.context.changes"),
            ("ABORT", {"workflow": "w", "reason": "r", "extra": 1}, "does not allow payload.context.extra"),
            ("STEP_DONE", {"step": 1.5, "result": 1}, "payload.context.step must be int or str"),
            ("GATE_PENDING", {"step": 1, "message": ["x"]}, "payload.context.message must be str"),
            ("BLOCKED", {"step": 1}, "requires payload.context.reason"),
            ("DONE", {"summary": "x"}, "requires payload.context.workflow"),
            ("CIRCUIT_BREAK", {"step": 1, "fails": "3"}, "payload.context.fails must be int"),
            ("CIRCUIT_BREAK", {"step": 1, "fails": True}, "payload.context.fails must be int"),
            ("NOTIFY", {"message": "m", "who": "x"}, "does not allow payload.context.who"),
        ],
    )
    def test_orchestration_payloads(self, signal: str, context: dict[str, Any], expected: str) -> None:
        """Orchestration signals carry exactly their spec/004 fields in payload.context."""
        to = BROADCAST if signal == "NOTIFY" else "human"
        assert expected in errors_of(raw(signal=signal, to=to, payload={"context": context}))

    @pytest.mark.parametrize(
        ("changes", "expected"),
        [
            ({"skip": ["a", "b"]}, ("a", "b")),
            ({"skip": []}, None),
            ({"skip": "a"}, None),
            ({"skip": ["a", 1]}, None),
            ({"skip": [""]}, None),
            ({"skip": ["a"], "add": ["b"]}, None),
            ({}, None),
            (["a"], None),
            (None, None),
        ],
    )
    def test_adapt_changes_ambient_carries_out(self, changes: Any, expected: tuple[str, ...] | None) -> None:
        """ambient carries out one change, ``skip`` of named items; anything else has a problem that says what it
        accepts."""
        assert adapt_changes(changes) == expected
        problem = adapt_changes_problem(changes)
        assert (problem is None) == (expected is not None)
        if problem is not None:
            assert "ambient accepts changes: {skip: [item, ...]}" in problem

    def test_an_adapt_to_ambient_is_refused_unless_ambient_can_carry_it_out(self) -> None:
        """To ambient, an ADAPT's changes must be one ambient makes; to another principal they are its business."""
        odd = {"workflow": "w", "changes": {"reorder": [2, 1]}}
        assert "changes.reorder is not a change ambient makes" in errors_of(
            raw(signal="ADAPT", to="ambient", payload={"context": odd})
        )
        Packet.model_validate(raw(signal="ADAPT", to="kernel-orchestrator", payload={"context": odd}))
        fine = {"workflow": "w", "changes": {"skip": ["one"]}}
        Packet.model_validate(raw(signal="ADAPT", to="ambient", payload={"context": fine}))

    @pytest.mark.parametrize("signal", sorted(ORCHESTRATION_SIGNALS))
    def test_orchestration_refuses_other_fields(self, signal: Signal) -> None:
        """Orchestration signals refuse decision, options and result."""
        data = json.loads(json.dumps(VALID[signal]))
        data["payload"]["result"] = "x"
        assert f"signal {signal} does not allow payload.result" in errors_of(data)


class TestStrictness:
    def test_extra_keys(self) -> None:
        """Unknown keys anywhere are refused (extra_forbidden), not stripped."""
        assert types_of(raw(kind="RETURN")) == {"extra_forbidden"}
        assert types_of(raw(payload={"source_context": {}})) == {"extra_forbidden"}
        assert types_of(raw(scope={"files": [], "owner": "x"})) == {"extra_forbidden"}

    def test_bytes_where_string_expected(self) -> None:
        """Bytes are not strings (strict): string_type."""
        assert types_of(raw(to=b"debug")) == {"string_type"}
        assert types_of(raw(payload={"options": [b"a"]}, signal="ESCALATE")) == {"string_type"}

    def test_bytes_inside_payload(self) -> None:
        """Non-JSON values inside the payload (bytes, sets, objects) are refused."""
        assert types_of(raw(payload={"context": {"x": b"raw"}})) == {"json_type"}
        assert types_of(raw(payload={"context": {"x": {1, 2}}})) == {"json_type"}
        assert types_of(raw(payload={"context": {"x": float("nan")}})) == {"json_type"}

    def test_no_coercion(self) -> None:
        """Numbers are not names and strings are not lists (no coercion)."""
        assert "string_type" in types_of(raw(to=5))
        assert "list_type" in types_of(raw(scope={"files": "projets/a"}))

    def test_names_are_checked(self) -> None:
        """from, to and return_to must be principal names."""
        assert "string_pattern_mismatch" in types_of(raw(to="../etc"))
        assert "string_pattern_mismatch" in types_of(raw(return_to="a b"))

    def test_frozen(self) -> None:
        """A validated packet cannot be changed on its way."""
        pkt = parse_packet(VALID[Signal.SPAWN])
        with pytest.raises(ValidationError):
            pkt.to = "human"  # type: ignore[misc]

    def test_ts_must_be_aware_and_becomes_utc(self) -> None:
        """ts carries a timezone and is kept in UTC."""
        assert "naive_datetime" in types_of(raw(ts="2026-03-18T10:00:00"))
        pkt = parse_packet(raw(ts="2026-03-18T12:00:00+02:00"))
        assert pkt.ts == NOW and pkt.ts.tzinfo is UTC
        local = datetime(2026, 3, 18, 12, tzinfo=timezone(timedelta(hours=2)))
        assert make_packet("orchestrator", "debug", "SPAWN", now=local).ts == NOW

    def test_id_format(self) -> None:
        """ids are ambient's own pkt_<hex>."""
        assert "string_pattern_mismatch" in types_of(raw(id="x/../y"))
        assert new_packet_id().startswith("pkt_")

    def test_idempotency_key(self) -> None:
        """key is run/item/attempt."""
        assert parse_packet(raw(key="run-1/instance-01/2")).key == "run-1/instance-01/2"
        assert "string_pattern_mismatch" in types_of(raw(key="run-1/2"))


class TestBounds:
    def test_raw_size_checked_before_parsing(self) -> None:
        """Raw text over MAX_PACKET_BYTES is refused before any parsing (even if not JSON at all)."""
        blob = b"{" + b" " * MAX_PACKET_BYTES
        assert "limit is" in errors_of(blob)
        assert "over the limit" in errors_of("x" * (MAX_PACKET_BYTES + 1))

    def test_ten_megabyte_string(self) -> None:
        """A 10 MB string in a mapping packet is string_too_long (S-04)."""
        huge = "x" * (10 * 1024 * 1024)
        assert types_of(raw(from_="debug", to="orchestrator", signal="RETURN", payload={"result": huge})) == {
            "string_too_long"
        }
        assert types_of(raw(session_id=huge)) == {"string_too_long"}
        assert "string_too_long" in types_of(raw(return_to="a" * (MAX_STR + 1)))

    def test_deep_result_refused(self) -> None:
        """Nested objects in a RETURN's result are bounded (no smuggled deep context, S-04)."""
        ok: Any = "leaf"
        for _ in range(MAX_RESULT_DEPTH):
            ok = {"k": ok}
        assert parse_packet(raw(from_="debug", to="orchestrator", signal="RETURN", payload={"result": ok}))
        deep = {"k": ok}
        assert types_of(raw(from_="debug", to="orchestrator", signal="RETURN", payload={"result": deep})) == {
            "too_deep"
        }

    def test_deep_context_refused(self) -> None:
        """Context nesting is bounded too, without recursion errors."""
        deep: Any = 1
        for _ in range(5000):
            deep = [deep]
        assert types_of(raw(payload={"context": {"x": deep}})) == {"too_deep"}

    def test_payload_node_and_char_budget(self) -> None:
        """Many small values or many medium strings add up to a refusal."""
        assert types_of(raw(payload={"context": {str(i): i for i in range(20_000)}})) == {"payload_too_large"}
        chunk = "x" * 60_000
        assert types_of(raw(payload={"context": {str(i): chunk for i in range(10)}})) == {"payload_too_large"}

    def test_list_bounds(self) -> None:
        """At most MAX_FILES files and MAX_OPTIONS options."""
        files = [f"projets/{i}" for i in range(MAX_FILES + 1)]
        assert types_of(raw(scope={"files": files})) == {"too_long"}
        options = [str(i) for i in range(MAX_OPTIONS + 1)]
        assert types_of(raw(signal="ESCALATE", payload={"options": options})) == {"too_long"}


class TestPaths:
    @pytest.mark.parametrize(
        "path",
        ["../../etc/passwd", "/etc/passwd", "a/../../b", "..\\x", "x\x00y", "a/" + "n" * 300, "", ".", "./"],
    )
    def test_traversal_refused(self, path: str) -> None:
        """Paths that could leave the brain root are refused at validation (S-01), never given a zone."""
        assert types_of(raw(scope={"files": [path]})) <= {"unsafe_path", "string_too_short"}

    def test_error_does_not_echo_path(self) -> None:
        """The rejection names what is wrong, not the path (rejected packets are logged by hash only)."""
        msg = errors_of(raw(scope={"files": ["../SECRET-PATH"]}))
        assert "SECRET-PATH" not in msg and "'..'" in msg

    def test_paths_are_normalised(self) -> None:
        """'./a//b' becomes 'a/b'; a trailing slash (folder scope) is kept; '%2e%2e' is just a name."""
        pkt = parse_packet(raw(scope={"files": ["./projets//app/", "todo/./x.md", "%2e%2e/x"]}))
        assert pkt.scope.files == ["projets/app/", "todo/x.md", "%2e%2e/x"]


class TestParsing:
    def test_yaml_with_packet_wrapper(self) -> None:
        """The ADR's `packet:` wrapper is accepted in YAML and JSON."""
        text = "packet:\n  id: pkt_0123456789abcdef\n  ts: '2026-03-18T10:00:00Z'\n  from: debug\n  to: orchestrator\n"
        text += "  signal: RETURN\n  payload:\n    result: ok\n"
        assert parse_packet(text).payload.result == "ok"
        assert parse_packet(json.dumps({"packet": VALID[Signal.RETURN]})).signal is Signal.RETURN

    def test_yaml_timestamp_stays_valid(self) -> None:
        """An unquoted YAML timestamp is read as text and parsed as an aware datetime."""
        text = "id: pkt_0123456789abcdef\nts: 2026-03-18T10:00:00Z\nfrom: debug\nto: orchestrator\nsignal: RETURN\n"
        assert parse_packet(text).ts == NOW

    def test_malformed_inputs(self) -> None:
        """Malformed JSON, malformed YAML, non-UTF-8, lists and empty documents give clear errors."""
        assert "not valid JSON at line 1" in errors_of('{"from": ')
        assert "expected valid YAML" in errors_of("from: [a\nto: b")
        assert "not valid UTF-8" in errors_of(b"\xff\xfe{}")
        assert "must be a mapping" in errors_of("- a\n- b\n")
        assert "got empty" in errors_of("")
        with pytest.raises(PacketError):
            parse_packet(12)  # type: ignore[arg-type]

    def test_duplicate_keys_refused(self) -> None:
        """A duplicate key cannot smuggle a second signal (JSON and YAML)."""
        assert "duplicate key 'signal'" in errors_of('{"signal": "RETURN", "signal": "SPAWN"}')
        assert "duplicate key 'signal'" in errors_of("signal: RETURN\nsignal: SPAWN\n")

    def test_yaml_alias_refused(self) -> None:
        """YAML aliases (alias bombs) are refused in packets too."""
        assert "aliases" in errors_of("a: &x [1]\nb: *x\n")

    def test_stamping_replaces_sender_values(self) -> None:
        """When the shell stamps id and ts, the sender's values are replaced."""
        pkt = parse_packet(
            raw(id="pkt_ffffffffffffffff"), now=NOW + timedelta(hours=1), packet_id="pkt_aaaaaaaaaaaaaaaa"
        )
        assert pkt.id == "pkt_aaaaaaaaaaaaaaaa" and pkt.ts == NOW + timedelta(hours=1)
        unstamped = {k: v for k, v in raw().items() if k not in ("id", "ts")}
        assert parse_packet(unstamped, now=NOW, packet_id=new_packet_id()).ts == NOW

    def test_validation_message_never_echoes_input(self) -> None:
        """Error text names fields and rules, never the values (S-04: log by size and hash only)."""
        secret = "CANARY-SECRET-" + "x" * 70_000
        msg = errors_of(raw(session_id=secret, payload={"context": {"k": secret}}, extra=secret))
        assert "CANARY" not in msg
        with pytest.raises(ValidationError) as info:
            Packet.model_validate(raw(to=secret))
        assert "CANARY" not in validation_message(info.value)

    def test_make_packet(self) -> None:
        """make_packet builds and validates, raising PacketError on a rule breach."""
        pkt = make_packet(
            "ambient", "deploy", Signal.SPAWN, now=NOW, files=["infrastructure/vps/a.yml"], zone="project",
            context={"item": "a"}, key="run-1/a/1", correlation_id="run-1", return_to="ambient", session_id="s",
        )  # fmt: skip
        assert pkt.from_ == "ambient" and pkt.scope.files == ["infrastructure/vps/a.yml"] and pkt.key == "run-1/a/1"
        with pytest.raises(PacketError, match=r"RETURN does not allow payload\.context"):
            make_packet("deploy", "ambient", "RETURN", now=NOW, context={"x": 1})
