"""The messages and the lease rules of agents run on workers (pure: no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.cluster.protocol import (
    HOLDER_KEY,
    HOLDER_STALE_S,
    Done,
    Holder,
    Lease,
    Names,
    Work,
    entry_bytes,
    entry_from,
    holder_blocks,
    kv_key,
    lease_verdict,
    name_token,
    namespace_taken_message,
    renew_every,
    result_from,
    result_record,
    resumed_record,
    worker_foreign,
)
from ambient.config.settings import ClusterSettings, Settings
from ambient.runners.result import AgentResult, Resumed, Usage

_KV_KEY = r"^[-/_=.A-Za-z0-9]+$"


@given(st.text(min_size=1, max_size=200), st.text(min_size=1, max_size=200))
def test_attempt_keys_map_to_distinct_valid_kv_keys(a: str, b: str) -> None:
    """Any item name gives a KV key the server accepts, and two attempts never share one."""
    import re

    assert re.match(_KV_KEY, kv_key(a))
    assert (kv_key(a) == kv_key(b)) == (a == b)
    assert kv_key(a) != HOLDER_KEY  # the namespace's holder record never meets an attempt


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True))
def test_agent_names_become_one_subject_token(name: str) -> None:
    token = name_token(name)
    assert "." not in token and "*" not in token and ">" not in token
    names = Names("n1")
    assert names.work_subject(name) == f"ambient.n1.work.{token}" and names.consumer(name) == f"work_{token}"


@given(
    st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True),
    st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True),
)
def test_two_namespaces_share_no_name_and_no_subject(a: str, b: str) -> None:
    """Two brains on one server with different namespaces: no stream, bucket or subject in common, and the two
    streams' subject filters do not overlap (the server would refuse the second stream)."""
    x, y = Names(a), Names(b)
    mine = {x.stream, x.attempts, x.workers, f"KV_{x.attempts}", f"KV_{x.workers}"}
    theirs = {y.stream, y.attempts, y.workers, f"KV_{y.attempts}", f"KV_{y.workers}"}
    assert (mine == theirs) == (a == b)
    assert a == b or not mine & theirs
    assert (x.work_prefix.split(".")[:2] == y.work_prefix.split(".")[:2]) == (a == b)  # ambient.<ns>: no overlap
    assert len(mine) == 5  # a namespace's own buckets and stream are distinct names too


@pytest.mark.parametrize("bad", ["", "A", "a.b", "a b", "-a", "_a", "a>", "a*", "x" * 33, "é"])
def test_a_namespace_is_a_short_lowercase_token(bad: str) -> None:
    with pytest.raises(ValueError, match="not a cluster namespace"):
        Names(bad)
    with pytest.raises(ValueError, match="not a cluster namespace"):
        ClusterSettings.model_validate({"urls": ["nats://x:1"], "namespace": bad})
    assert ClusterSettings.model_validate({"urls": ["nats://x:1"]}).names() == Names("default")
    assert ClusterSettings.model_validate({"urls": ["nats://x:1"], "namespace": "team-b_2"}).names().stream == (
        "AMBIENT_WORK_team-b_2"
    )


def test_dotted_and_escaped_names_stay_apart() -> None:
    assert name_token("a.b") != name_token("a_b") != name_token("a-b")
    assert name_token("a.b") == "a=2Eb"


def test_a_work_message_round_trips_and_bad_ones_are_refused() -> None:
    work = Work(
        key="run/it em/2",
        run_id="run",
        item="it em",
        attempt=2,
        agent="coder",
        namespace="team-a",
        runner={"kind": "command", "argv": ["x"]},
        packet={"signal": "SPAWN"},
        vars={"item": "it em"},
        handoff="so far",
        resumed=resumed_record(Resumed("restart", crash=True)),
        lease_s=2.0,
    )
    again = Work.from_bytes(work.to_bytes())
    assert again == work
    assert again.resumed_as() == Resumed("restart", crash=True)
    assert again.namespace == "team-a"
    without = {k: v for k, v in json.loads(work.to_bytes()).items() if k != "namespace"}
    for raw in (b"[]", b'{"v": 2}', b'{"v": 1, "key": ""}', b"not json", json.dumps(without).encode()):
        with pytest.raises(ValueError):
            Work.from_bytes(raw)


def test_a_result_travels_whole() -> None:
    res = AgentResult(
        status="escalate",
        output={"a": 1},
        question="which?",
        options=["x", "y"],
        exit_code=0,
        duration_ms=12,
        reason=None,
        usage=Usage(model="m", input_tokens=3, cost_usd=0.5),
    )
    assert result_from(result_record(res)) == res
    with pytest.raises(ValueError):
        result_from({"status": "maybe"})


def test_entries_round_trip_and_garbage_is_no_entry() -> None:
    lease = Lease("w1", "host", 10.5)
    done = Done("w1", "host", AgentResult(status="success"))
    assert entry_from(entry_bytes(lease)) == lease
    assert entry_from(entry_bytes(done)) == done
    assert entry_from(b"") is None and entry_from(b"{") is None and entry_from(b'{"state": "odd"}') is None


@pytest.mark.parametrize(
    ("entry", "now", "verdict"),
    [
        (None, 5.0, "free"),
        (Lease("w", "h", 10.0), 5.0, "held"),
        (Lease("w", "h", 10.0), 10.0, "expired"),
        (Lease("w", "h", 10.0), 99.0, "expired"),
        (Done("w", "h", AgentResult(status="fail")), 99.0, "done"),
    ],
)
def test_what_a_worker_given_an_attempt_may_do(entry: Lease | Done | None, now: float, verdict: str) -> None:
    assert lease_verdict(entry, now) == verdict


def test_a_lease_is_renewed_three_times_per_term() -> None:
    assert renew_every(30.0) == 10.0 and renew_every(0.01) == 0.05


def test_cluster_settings_are_checked() -> None:
    ok = ClusterSettings.model_validate({"urls": "nats://10.0.0.2:4222", "dispatch": {"coder": "workers"}})
    assert ok.urls == ["nats://10.0.0.2:4222"] and ok.lease_s == 30.0
    assert Settings().cluster is None
    for bad in (
        {"urls": ["http://x:1"]},
        {"urls": []},
        {"urls": ["nats://x:1"], "dispatch": {"coder": "cloud"}},
        {"urls": ["nats://x:1"], "dispatch": {"../x": "workers"}},
        {"urls": ["nats://x:1"], "lease_s": 0.1},
        {"urls": ["nats://x:1"], "extra": 1},
    ):
        with pytest.raises(ValueError):
            ClusterSettings.model_validate(bad)


def test_a_workers_permissions_name_its_agents_only() -> None:
    from ambient.cluster.protocol import worker_permissions

    perms = worker_permissions(Names("ns1"), "w.1", ["coder", "a.b"])
    publish = perms["publish"]
    assert "$JS.API.CONSUMER.MSG.NEXT.AMBIENT_WORK_ns1.work_coder" in publish
    assert "$JS.API.CONSUMER.MSG.NEXT.AMBIENT_WORK_ns1.work_a=2Eb" in publish
    assert "$KV.ambient_ns1_workers.w=2E1" in publish
    assert "$KV.ambient_ns1_attempts.>" in publish
    assert not any(">" == s or s.endswith("AMBIENT_WORK_ns1.>") or "work_tester" in s for s in publish)
    assert perms["subscribe"] == ["_INBOX.>"]
    # Nothing of another namespace: the same worker and agents there are other subjects altogether.
    other = worker_permissions(Names("ns2"), "w.1", ["coder", "a.b"])["publish"]
    assert not set(publish) & set(other)
    assert all("ns1" in s for s in publish)


def test_a_credentials_file_is_a_nats_creds_file_or_user_password(tmp_path: Path) -> None:
    from ambient.cluster.link import credentials

    plain = tmp_path / "w.creds"
    plain.write_text("w1:s3cret:with-colon\n")
    assert credentials(str(plain)) == {"user": "w1", "password": "s3cret:with-colon"}
    jwt = tmp_path / "nats.creds"
    jwt.write_text("-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n")
    assert credentials(str(jwt)) == {"user_credentials": str(jwt)}
    bad = tmp_path / "bad"
    bad.write_text("nothing here\n")
    with pytest.raises(ValueError):
        credentials(str(bad))
    assert credentials(None) == {}


def test_a_worker_is_unreachable_once_its_lease_stays_unchanged_past_the_deadline() -> None:
    from ambient.cluster.protocol import Done, Lease, unreachable, unreachable_message
    from ambient.runners.result import AgentResult

    lease = Lease("w1", "h1", until=100.0)
    assert not unreachable(lease, 9.9, 10.0)
    assert unreachable(lease, 10.0, 10.0)
    assert not unreachable(lease, 1e9, None)  # null: wait for ever
    assert not unreachable(None, 1e9, 10.0)  # no worker took it yet: the item waits for one
    assert not unreachable(Done("w1", "h1", AgentResult(status="success")), 1e9, 10.0)
    text = unreachable_message(lease, "coder", 12.4)
    assert "'w1'" in text and "h1" in text and "'coder'" in text and "12 s" in text


def test_the_unreachable_deadline_must_outlast_the_lease() -> None:
    from ambient.config.settings import ClusterSettings

    base = {"urls": ["nats://127.0.0.1:4222"], "lease_s": 30}
    assert ClusterSettings.model_validate(base).unreachable_after_s == 600
    assert ClusterSettings.model_validate({**base, "unreachable_after_s": None}).unreachable_after_s is None
    assert ClusterSettings.model_validate({**base, "unreachable_after_s": 60}).unreachable_after_s == 60
    with pytest.raises(ValueError, match="at least twice lease_s"):
        ClusterSettings.model_validate({**base, "unreachable_after_s": 59})


class TestTheNamespacesHolder:
    """One brain's daemon per namespace: another brain is refused while its holder is fresh."""

    me = Holder("vm", "/srv/brain-b", 200, 1_000.0)

    def test_nobody_or_the_same_brain_restarted_does_not_block(self) -> None:
        assert not holder_blocks(None, self.me)
        assert not holder_blocks(Holder("vm", "/srv/brain-b", 100, 999.0), self.me)  # an earlier daemon of it

    def test_another_brain_heard_lately_blocks_and_is_named(self) -> None:
        other = Holder("vm", "/srv/brain-a", 100, 1_000.0 - HOLDER_STALE_S + 1)
        assert holder_blocks(other, self.me)
        said = namespace_taken_message(Names(), other, self.me.beat)
        assert "/srv/brain-a" in said and "'default'" in said and "cluster.namespace" in said
        assert holder_blocks(Holder("other-host", "/srv/brain-b", 100, 999.0), self.me)  # same folder, other host

    def test_a_holder_silent_past_the_stale_bound_is_replaced(self) -> None:
        assert not holder_blocks(Holder("vm", "/srv/brain-a", 100, 1_000.0 - HOLDER_STALE_S), self.me)

    def test_the_record_reads_back_and_garbage_is_nobody(self) -> None:
        assert Holder.from_bytes(self.me.to_bytes()) == self.me
        for raw in (None, b"", b"{", b'{"host": "vm"}', b"[]"):
            assert Holder.from_bytes(raw) is None

    def test_a_worker_refuses_the_namespace_of_another_folder_on_its_own_host(self) -> None:
        holder = Holder("vm", "/srv/brain-a", 100, 1_000.0)
        assert worker_foreign(holder, "vm", "/srv/brain-b")
        assert not worker_foreign(holder, "vm", "/srv/brain-a")  # its own brain
        assert not worker_foreign(holder, "other-host", "/srv/brain-b")  # another host: folders cannot be compared
        assert not worker_foreign(None, "vm", "/srv/brain-b")


def test_a_unit_says_what_the_host_lacks_for_it() -> None:
    from ambient.cluster.unit import unit_problems

    assert unit_problems("/srv/brain", "ambient", True, []) == []
    said = unit_problems("/tmp/brain", "ambient", False, ["/root"])
    assert len(said) == 3 and "useradd" in said[0] and "PrivateTmp" in said[1] and "/root" in said[2]
    assert unit_problems("/tmpbrain", "ambient", True, []) == []  # only the folders PrivateTmp= replaces
