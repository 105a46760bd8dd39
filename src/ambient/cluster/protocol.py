"""What the daemon and its workers say to each other through NATS JetStream, and the rules of an attempt's lease.
Pure: names, encodings and decisions; no connection, no clock of its own.

Every name on the server belongs to one brain's namespace (``cluster.namespace``, :class:`Names`): two brains on
one server with different namespaces share no stream, subject, consumer or bucket. One SPAWN dispatched to the
workers is a :class:`Work` message on ``ambient.<namespace>.work.<agent>`` of the namespace's work-queue stream,
published with ``Nats-Msg-Id`` = the attempt key (``run/item/attempt``), so a second publish of the same attempt (a
daemon that restarts and reattaches) is dropped by the server. Each attempt has one entry in the namespace's KV
bucket of attempts (key: :func:`kv_key` of the attempt key) holding a :class:`Lease` while a worker runs it and the
:class:`Done` result once one has: the entry's revision is the fencing token, and every write of a worker
is ``update(last=revision)``, so a worker that lost its lease (it stalled past ``until``, another worker took over)
is refused by the server. The result is written by the same single compare-and-set that ends the lease: there is
no moment where a lease is released and its result not yet written.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ambient.runners.result import AgentResult, Resumed, Usage
from ambient.runners.runner_config import AnyRunnerConfig

#: The namespace of a brain whose ``cluster:`` names none.
DEFAULT_NAMESPACE: Final = "default"
#: What a namespace may be: one token of a subject, and part of a stream's and a bucket's name.
NAMESPACE_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,31}$"
#: How long the server remembers a ``Nats-Msg-Id`` (s): a SPAWN published again within it is a duplicate.
DUPLICATE_WINDOW_S: Final = 3600.0
#: The largest result a worker may commit (bytes of JSON); bigger ones become an error result.
MAX_RESULT_BYTES: Final = 900 * 1024

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def name_token(name: str) -> str:
    """An agent's name as one subject token and a consumer name: ``.`` and other characters NATS gives a meaning
    are written ``=XX`` (their code point in hex), so ``a.b`` and ``a=2Eb`` stay distinct."""
    return _UNSAFE.sub(lambda m: f"={ord(m.group()):02X}", name)


@dataclass(frozen=True, slots=True)
class Names:
    """Every name one brain's cluster uses on the server, derived from its namespace: the one home of them all, so
    the daemon, its workers, their permissions and ``ambient cluster workers`` cannot disagree. A fixed prefix
    and suffix around the namespace keep two namespaces' names distinct, and their subjects never overlap (the
    server refuses two streams whose subjects do)."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not re.match(NAMESPACE_PATTERN, self.namespace):
            raise ValueError(
                f"{self.namespace!r} is not a cluster namespace; expected a-z, 0-9, _ and -, starting with a letter or "
                "a digit, 32 at most"
            )

    @property
    def stream(self) -> str:
        """The work-queue stream of SPAWNs."""
        return f"AMBIENT_WORK_{self.namespace}"

    @property
    def work_prefix(self) -> str:
        """The subjects of the stream are this prefix and one token per agent."""
        return f"ambient.{self.namespace}.work"

    @property
    def attempts(self) -> str:
        """The KV bucket of attempts: a lease while one runs, the result once done."""
        return f"ambient_{self.namespace}_attempts"

    @property
    def workers(self) -> str:
        """The KV bucket where each worker says it is alive (its host, agents, slots, last heartbeat)."""
        return f"ambient_{self.namespace}_workers"

    def work_subject(self, agent: str) -> str:
        """The subject a SPAWN for ``agent`` is published on."""
        return f"{self.work_prefix}.{name_token(agent)}"

    def consumer(self, agent: str) -> str:
        """The durable pull consumer every worker of ``agent`` shares (in the namespace's stream)."""
        return f"work_{name_token(agent)}"


def kv_key(attempt_key: str) -> str:
    """The attempt's key in the attempts bucket (:attr:`Names.attempts`): the attempt key in URL-safe base64 (an
    item may hold any character, a KV key only ``[-/_=.A-Za-z0-9]``)."""
    return base64.urlsafe_b64encode(attempt_key.encode()).decode().rstrip("=") or "_"


@dataclass(frozen=True, slots=True)
class Work:
    """One dispatched SPAWN: the attempt, the agent, its runner config and the request rendered by the daemon."""

    key: str
    run_id: str
    item: str
    attempt: int
    agent: str
    namespace: str  # the brain's cluster namespace: a worker of another refuses the message
    runner: Mapping[str, Any]  # the agent's runner config (a command runner's, as validated by the daemon)
    packet: Mapping[str, Any]  # the SPAWN the agent reads on stdin
    vars: Mapping[str, str] = field(default_factory=dict)
    handoff: str | None = None
    resumed: Mapping[str, Any] | None = None
    lease_s: float = 30.0

    def to_bytes(self) -> bytes:
        data = {
            "v": 1,
            "key": self.key,
            "run_id": self.run_id,
            "item": self.item,
            "attempt": self.attempt,
            "agent": self.agent,
            "namespace": self.namespace,
            "runner": dict(self.runner),
            "packet": dict(self.packet),
            "vars": dict(self.vars),
            "handoff": self.handoff,
            "resumed": dict(self.resumed) if self.resumed is not None else None,
            "lease_s": self.lease_s,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Work:
        """Raises ValueError on anything but a well-formed message of version 1."""
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError("not a work message of version 1")
        try:
            work = cls(
                key=_str(data, "key"),
                run_id=_str(data, "run_id"),
                item=_str(data, "item"),
                attempt=int(data["attempt"]),
                agent=_str(data, "agent"),
                namespace=_str(data, "namespace"),
                runner=_map(data, "runner"),
                packet=_map(data, "packet"),
                vars={str(k): str(v) for k, v in _map(data, "vars").items()},
                handoff=data["handoff"] if isinstance(data.get("handoff"), str) else None,
                resumed=data["resumed"] if isinstance(data.get("resumed"), dict) else None,
                lease_s=float(data.get("lease_s", 30.0)),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"work message: {exc}") from exc
        if work.lease_s <= 0:
            raise ValueError("work message: lease_s must be positive")
        return work

    def resumed_as(self) -> Resumed | None:
        """Why the attempt runs again, as the runner tells the agent."""
        if self.resumed is None:
            return None
        r = self.resumed
        why = r.get("why")
        if why not in ("answered", "retry", "restart"):
            return None
        return Resumed(
            why,
            question=r.get("question"),
            answer=r.get("answer"),
            error=r.get("error"),
            crash=bool(r.get("crash")),
        )


def resumed_record(resumed: Resumed | None) -> dict[str, Any] | None:
    """A :class:`Resumed` as JSON for a :class:`Work` message."""
    if resumed is None:
        return None
    return {
        "why": resumed.why,
        "question": resumed.question,
        "answer": resumed.answer,
        "error": resumed.error,
        "crash": resumed.crash,
    }


def _str(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty string")
    return value


def _map(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a mapping")
    return value


# ---------------------------------------------------------------- the attempt's entry: a lease, then the result


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker holds the attempt until ``until`` (epoch seconds of its clock), renewing it as the agent runs."""

    worker: str
    host: str
    until: float


@dataclass(frozen=True, slots=True)
class Done:
    """The attempt's result, written once, by the holder of the lease (same compare-and-set)."""

    worker: str
    host: str
    result: AgentResult


Entry = Lease | Done


def entry_bytes(entry: Entry) -> bytes:
    if isinstance(entry, Lease):
        data: dict[str, Any] = {"state": "running", "worker": entry.worker, "host": entry.host, "until": entry.until}
    else:
        data = {"state": "done", "worker": entry.worker, "host": entry.host, "result": result_record(entry.result)}
    return json.dumps(data, separators=(",", ":")).encode()


def entry_from(raw: bytes | None) -> Entry | None:
    """The entry a KV value holds; None for an empty or unreadable value (treated as no lease)."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
        if data.get("state") == "done":
            return Done(str(data["worker"]), str(data["host"]), result_from(data["result"]))
        if data.get("state") == "running":
            return Lease(str(data["worker"]), str(data["host"]), float(data["until"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


# ---------------------------------------------------------------- the namespace's daemon

#: The key of the attempts bucket where the daemon of the namespace's brain says it is there (an attempt's key is
#: URL-safe base64 and holds no ".", so the two never meet).
HOLDER_KEY: Final = "daemon.holder"
#: A holder not heard from for this long (s, its clock against the reader's) may be replaced: its daemon stopped
#: without saying so, or the brain moved to another host. The holding daemon says it is there every 10 s.
HOLDER_STALE_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Holder:
    """The daemon that uses a namespace: its host, its brain's folder, its pid and when it last said so (epoch
    seconds of its clock). A daemon started again on the same brain is the same holder; another brain is not."""

    host: str
    brain: str
    pid: int
    beat: float

    def same_brain(self, other: Holder) -> bool:
        return (self.host, self.brain) == (other.host, other.brain)

    def to_bytes(self) -> bytes:
        data = {"host": self.host, "brain": self.brain, "pid": self.pid, "beat": self.beat}
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> Holder | None:
        """The holder a value names; None for an empty or unreadable one (nobody holds the namespace)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(str(data["host"]), str(data["brain"]), int(data["pid"]), float(data["beat"]))
        except (ValueError, KeyError, TypeError):
            return None


def holder_blocks(found: Holder | None, me: Holder) -> bool:
    """Whether another brain's daemon uses the namespace: two brains on one namespace share one work queue, and each
    one's workers run the other's items in their own brain's folder (docs/cluster.md)."""
    return found is not None and not found.same_brain(me) and me.beat - found.beat < HOLDER_STALE_S


def worker_foreign(found: Holder | None, host: str, brain: str) -> bool:
    """Whether a worker started in the folder ``brain`` on ``host`` serves another brain: the namespace's daemon runs
    on this host, on another folder. (On another host the two folders cannot be compared: there the namespace
    itself keeps brains apart.)"""
    return found is not None and found.host == host and found.brain != brain


def namespace_taken_message(names: Names, found: Holder, now: float) -> str:
    """What the person reads when this brain's namespace is another brain's."""
    return (
        f"the cluster namespace {names.namespace!r} on this NATS server is used by the brain {found.brain} on "
        f"{found.host} (its daemon, pid {found.pid}, was heard {max(0.0, now - found.beat):.0f} s ago): two brains "
        f"on one namespace run each other's items. Give this brain its own cluster.namespace in profil/ambient.yml "
        f"(docs/cluster.md); agents are not dispatched until then"
    )


Verdict = Literal["done", "free", "held", "expired"]


def lease_verdict(entry: Entry | None, now: float) -> Verdict:
    """What a worker given the attempt may do: ``done`` (ack, nothing to run), ``free`` (create the lease),
    ``expired`` (take it over by compare-and-set on its revision), ``held`` (another worker runs it: come back
    after ``until``)."""
    if entry is None:
        return "free"
    if isinstance(entry, Done):
        return "done"
    return "expired" if now >= entry.until else "held"


def unreachable(entry: Entry | None, silent_s: float, deadline_s: float | None) -> bool:
    """Whether the daemon gives up on the attempt's holder: its lease has not changed (no renewal, no takeover by
    another worker) for ``deadline_s`` of the daemon's own time. An attempt no worker took yet is not one: the
    item waits for a worker (docs/cluster.md)."""
    return deadline_s is not None and isinstance(entry, Lease) and silent_s >= deadline_s


def unreachable_message(lease: Lease, agent: str, silent_s: float) -> str:
    """What the person reads in the escalation of an attempt whose worker went silent."""
    return (
        f"worker {lease.worker!r} on {lease.host} running agent {agent!r} has not been heard from for "
        f"{silent_s:.0f} s (cluster.unreachable_after_s): it is stopped, or cut off from the NATS server. The "
        f"attempt is closed: a result it sends later is refused. retry runs the item again on any worker"
    )


def renew_every(lease_s: float) -> float:
    """How often a holder renews its lease and tells the server the work is in progress: a third of the lease,
    so two renewals may be lost before it lapses."""
    return max(0.05, lease_s / 3)


# ---------------------------------------------------------------- results as JSON

_RESULT_FIELDS = (
    "status",
    "output",
    "result",
    "result_status",
    "options",
    "question",
    "context",
    "exit_code",
    "duration_ms",
    "stderr_tail",
    "error",
    "killed",
    "reason",
    "pid",
    "permission",
)


def result_record(res: AgentResult) -> dict[str, Any]:
    """An :class:`AgentResult` as JSON, whole (the daemon rebuilds it with :func:`result_from`)."""
    out: dict[str, Any] = {name: getattr(res, name) for name in _RESULT_FIELDS}
    if res.usage is not None:
        out["usage"] = res.usage.to_record()
    return out


def result_from(data: Mapping[str, Any]) -> AgentResult:
    """Raises ValueError, KeyError or TypeError on a record that is not one."""
    if data.get("status") not in ("success", "fail", "error", "escalate", "blocked"):
        raise ValueError(f"not a result status: {data.get('status')!r}")
    kwargs = {name: data[name] for name in _RESULT_FIELDS if name in data}
    usage = data.get("usage")
    if isinstance(usage, dict):
        kwargs["usage"] = Usage(**usage)
    return AgentResult(**kwargs)


def worker_permissions(names: Names, worker: str, agents: list[str]) -> dict[str, list[str]]:
    """The subjects a worker serving ``agents`` of the namespace ``names`` may publish and subscribe to, and nothing
    else: its agents' consumers (their info, the next message, acks), the attempts bucket (read by direct get,
    written by compare-and-set), its own record in the workers bucket, the streams' info, and replies to its inbox.
    Another agent's SPAWNs, and everything of another namespace, are out of its reach at the server."""
    stream = names.stream
    publish = [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.INFO.KV_{names.attempts}",
        f"$JS.API.STREAM.INFO.KV_{names.workers}",
        f"$KV.{names.attempts}.>",
        f"$JS.API.DIRECT.GET.KV_{names.attempts}.>",
        f"$KV.{names.workers}.{name_token(worker)}",
    ]
    for agent in agents:
        consumer = names.consumer(agent)
        publish += [
            f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
            f"$JS.ACK.{stream}.{consumer}.>",
        ]
    return {"publish": publish, "subscribe": ["_INBOX.>"]}


# ---------------------------------------------------------------- which agents run on the workers

#: Why an AI agent is not run by a worker (``validate`` and the attempt say it): its model calls go through the
#: daemon's model gateway, which holds the model key, meters each call into the run's journal before its answer is
#: handed on and refuses calls past a budget; a worker has neither the journal nor the budget.
AI_ON_WORKERS: Final = (
    "kind: {kind} runs on the daemon's host only: its model calls go through the daemon's model gateway (the key, "
    "the metering, the budget); workers run kind: command"
)


def dispatch_map(listed: Mapping[str, str], runners: Mapping[str, AnyRunnerConfig]) -> dict[str, str]:
    """Where each agent runs: ``cluster.dispatch``, then each agent's own ``runner: dispatch:``, which wins (as its
    own runner wins over ``runners:``). Only ``workers`` entries matter to the dispatcher."""
    out = dict(listed)
    for name, cfg in runners.items():
        if cfg.dispatch is not None:
            out[name] = cfg.dispatch
    return out
