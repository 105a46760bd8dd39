"""What ``ambient init`` writes: a small brain that validates and runs at once, as plain data.

Pure: the files (relative path, text, mode) and folders of a new brain; ``ambient.cli.init`` writes
them without ever overwriting. ``CONFIG_TEMPLATE`` lists every setting of :class:`ambient.config.settings.Settings`
commented out with its default (sshd_config style: ``#key: default`` is a setting, ``# text`` is prose),
so uncommenting a line changes one setting; ``tests/unit/cli/test_cli_service.py`` keeps it in step with the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ScaffoldFile:
    """One file of a new brain."""

    rel: str  # path relative to the brain root
    text: str
    mode: int = 0o644


#: Folders of a new brain (created if missing; existing ones are fine).
DIRECTORIES: Final[tuple[str, ...]] = ("agents", "bin", "claims", "locks", "profil", "workflows")

GITIGNORE: Final = """\
# ambient's own state: run journals, escalations, outbox, daemon lock (rebuilt or kept by ambient, never versioned)
.ambient/
"""

CONFIG_TEMPLATE: Final = """\
# profil/ambient.yml: ambient's configuration. Every setting is listed with its default, commented out:
# remove the leading '#' of a line to change it. A key ambient does not know is an error (file:line),
# so a typo never goes unnoticed. `ambient config show` prints the effective values and where each
# came from; `ambient doctor` checks the whole brain.
#
# Environment overrides win over this file (handy under systemd, Environment= lines):
#   AMBIENT_TICK_SECONDS, AMBIENT_CONCURRENCY, AMBIENT_LOG_LEVEL, AMBIENT_LOG_FORMAT,
#   AMBIENT_SHUTDOWN_GRACE, AMBIENT_NOTIFY_URLS (comma or space separated),
#   AMBIENT_BUDGET_PER_RUN_USD, AMBIENT_BUDGET_DAILY_USD (a number, or none), AMBIENT_AGENT_USER.
# The daemon re-reads this file on SIGHUP (systemctl reload ambient); a broken file keeps the old settings.

# Seconds between timed ticks (schedules, escalation deadlines, stale claims). File changes are
# seen at once whatever this is.
#tick_seconds: 30.0

# At most this many agents running at once, all runs together (a machine's or an API quota's limit).
# A for_each's own `concurrency:` caps its run further; one without it may use every free slot.
#concurrency: 4

# On SIGTERM, seconds running agents get to finish before their process groups are killed
# (they are recorded as interrupted and resume at the next start).
#shutdown_grace_s: 10.0

# Minutes a file lock taken for an agent lasts before others may take it over; renewed at a third of that
# while its agent runs, so a long agent keeps its scope.
#lock_ttl_min: 60

# Hours without activity after which an open claim (its TTL unset) is marked stale.
#stale_claim_hours: 24.0

# Consecutive failures on one scope before the circuit breaker stops sending agents there.
#breaker_threshold: 3

# Log level (debug, info, warning, error) and format: auto = readable on a terminal,
# JSON lines otherwise (journald); json; console.
#log_level: info
#log_format: auto

# Who ambient's own packets come from (a workflow's `supervisor:` receives STEP_DONE, DONE...).
#default_sender: ambient

# Run as root (a system unit without User=), ambient never runs an agent as root: a command agent whose runner
# names no `user:` runs as this user, made at the first start if missing. `root` keeps uid 0 but without any
# capability. Ignored when ambient is not root.
#agent_user: ambient-agent

# Notifications: where escalations (and results) are sent. Apprise URLs, e.g.
#   tgram://{telegram_token}/123456789   ({telegram_token} is read from $CREDENTIALS_DIRECTORY/telegram-token)
#   ntfy://ntfy.sh/my-topic   mailto://user:password@example.com
# URLs are secrets: `ambient config show` masks them. Try them with `ambient notify test`.
#notify:
#  urls: []
#  # results of finished runs: none, failures or all (escalations are always sent)
#  results: failures
#  # results and automatic decisions gathered into one summary every digest_hours, instead of
#  # a message each (escalations are always sent at once)
#  digest: false
#  digest_hours: 24.0
#  # a failed notification is retried after about retry_base_s, doubling each time up to
#  # retry_cap_s seconds apart; escalations are retried for as long as they wait
#  retry_base_s: 5.0
#  retry_cap_s: 900.0

# Answering escalations with Telegram buttons (opt-in). The bot token is never written here: give it
# through systemd's LoadCredential=telegram-token:/etc/ambient/telegram-token, or token_file.
#telegram:
#  answers: false
#  # the chat that receives escalations (a number, as text); only presses from it count
#  chat_id: null
#  # if not empty, only presses from these Telegram user ids count
#  user_ids: []
#  api_base: https://api.telegram.org
#  token_file: null
#  # seconds one getUpdates long poll waits (0 to 50)
#  poll_timeout_s: 25

# Runners of agents that do not declare `ambient.runner` in their frontmatter, by agent name, e.g.
#   runners:
#     coder: {kind: command, argv: ["/usr/local/bin/my-coder"], timeout_s: 600}
# `default` gives every other agent one: `default: {kind: claude}` runs each agent's prompt (its markdown
# body) on Claude Code (pip install 'ambient[claude]', ANTHROPIC_API_KEY in the daemon's environment);
# agents/_claude-agent.md is a commented example.
#runners: {}

# What AI agents may spend, in US dollars (null: no limit). When a run's spend reaches per_run_usd, or the
# spend of all runs today (the UTC day) reaches daily_usd, no new agent of that run starts, its agents' next
# model calls are refused, and you get one question: raise (allow more) | wait | abort.
#budget:
#  per_run_usd: null
#  daily_usd: null

# Model calls in flight at once to one model API, all agents together (null: no limit); the others wait their
# turn in ambient's model gateway (a provider's concurrency or rate limit).
#model_calls: null

# Learned rules that decide alone (`ambient rules optin`): when a rule's answer leads back to the same situation on
# the same item (a `retry` of a failure that always happens), it decides again at most auto_repeats times, the
# second after backoff_s seconds, doubled each time; then the item is yours and the rule goes back to shadow.
# Once you allowed an AI agent pattern_after commands of one shape (pytest -q tests/a, .../b, .../c), its next
# question about one also offers their pattern for good (allow-pattern); 0: never offered.
#learning:
#  auto_repeats: 3
#  backoff_s: 5.0
#  pattern_after: 3

# The web console, hosted by the daemon (null: not hosted; `ambient web` serves it on its own). Open the URL
# `ambient web --url` prints (it carries the token kept in .ambient/web/token). It runs in a thread of its own,
# so no browser slows the daemon. A host other than 127.0.0.1 needs tls_cert and tls_key (PEM files), or
# insecure_bind: true, which lets everyone on that network read every page and act as you. For example:
#   web:
#     host: 127.0.0.1     # the default
#     port: 8765          # the default; 0: any free port
#     tls_cert: null      # e.g. /etc/ambient/console.pem (with tls_key): HTTPS
#     tls_key: null
#     insecure_bind: false
#web: null

# Agents run on other hosts (docs/cluster.md; pip install 'ambient[cluster]'): the daemon publishes the SPAWNs of
# the agents dispatched to `workers` on NATS JetStream, and `ambient worker` processes run them and send the result
# back (kind: command only). This daemon stays the only decider. null: every agent runs here. For example:
#   cluster:
#     urls: [nats://127.0.0.1:4222]
#     namespace: default  # this brain's names on the server: another brain on the same server needs its own
#     creds: null         # the daemon's NATS credentials file (relative to the brain)
#     lease_s: 30         # a silent worker's item moves to another worker after this long
#     lost_after_s: 20    # status, doctor and the console call a worker lost when silent this long
#     dispatch:           # or `dispatch: workers` in the agent's own runner, which wins
#       coder: workers
#cluster: null

# The agent that runs a chain step without `agents:` (and a satellite started by `trigger → type:...`), by
# step type; a workflow's own `default_agents:` wins, and without either: code → coder, test → tester,
# brain-write → scribe, deploy → vps, search → scout, domain → orchestrator.
#default_agents: {}
"""

ROUTING_TEMPLATE: Final = """\
# profil/routing.yml: who actually talks to whom in this brain (ADR-026 "routing table").
# The access matrix comes from the kernel defaults and each agent's `brain.ipc` gate (agents/*.md);
# this table can only narrow it: a route that claims more than the matrix allows is reported as
# an error (file:line) and is not applied.
#   default: matrix  senders not named under `from:` keep their matrix rights
#   default: deny    senders not named send nothing
# `ambient matrix` prints the result; `ambient matrix explain FROM TO SIGNAL` says why.
version: 1
default: matrix
routes:
  # The example worker answers the daemon (or the person), never another agent, and only in project zones.
  - from: hello
    to: [ambient, orchestrator, human]
    signals: [RETURN, ERROR, ESCALATE, BLOCKED_ON]
    zones: [project]
"""

AGENT_TEMPLATE: Final = """\
---
name: hello
type: agent
status: active
description: "Example agent: greets one item and answers RETURN."
brain:
  version: 1
  type: metier
  scope: project
  ipc:
    receives_from: [orchestrator, human, ambient]   # who may SPAWN it
    sends_to:      [orchestrator, human, ambient]   # to whom it answers
    zone_access:   [project]
    signals:       [RETURN, ERROR, ESCALATE, BLOCKED_ON]
ambient:
  runner:
    kind: command
    argv: ["{{python}}", "bin/hello_agent.py"]   # {{python}}: the interpreter running ambient
    timeout_s: 60
---
# Agent: hello

An example agent: its runner is the small script `bin/hello_agent.py`. Point `ambient.runner.argv`
at a real program to make it do real work: it gets the SPAWN packet as JSON on stdin and answers
one JSON object on stdout (see the script).
"""

AGENT_SCRIPT: Final = '''\
#!/usr/bin/env python3
"""Example agent of a new brain: greets its item and answers RETURN. Stdlib only.

The ambient agent protocol, in short:
  stdin   the SPAWN packet as JSON: {"signal": "SPAWN", "scope": {"files": [...]}, "payload": {"context": {...}}}
  env     AMBIENT_ITEM, AMBIENT_ATTEMPT, AMBIENT_KEY (idempotency key), AMBIENT_RUN_ID, AMBIENT_BRAIN
  stdout  one JSON object: {"signal": "RETURN", "result": {"status": "ok" | "partial" | "failed", ...}}
  exit    0 when it answered on stdout (a failure is said in the result, not by the exit code)
"""

import json
import os
import sys


def main() -> int:
    packet = json.load(sys.stdin)
    context = packet.get("payload", {}).get("context", {})
    item = os.environ.get("AMBIENT_ITEM", "?")
    greeting = context.get("greeting") or f"hello {item}"
    print(json.dumps({"signal": "RETURN", "result": {"status": "ok", "summary": greeting}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

WORKFLOW_TEMPLATE: Final = """\
# workflows/hello.yml: an example fan-out (ADR-027 for_each): one `hello` agent per item, two at a time.
# The daemon starts one run when it first sees this file; `ambient start hello` starts another.
# `ambient validate` checks it; `ambient status hello` shows its items.
workflow: hello
description: "Greet three items"

for_each:
  items: [alpha, beta, gamma]
  spawn: hello
  concurrency: 2
  scope:
    zone: project
    files: ["workspace/hello/{{item}}.md"]   # quote templated paths inside [...] lists
  context:
    greeting: "hello {{item}}"
  on_return:
    success: → next_item
    fail:    → ESCALATE pilote
    error:   → ERROR + log + ESCALATE pilote

retry:
  attempts: 2        # one more try when the agent crashes or times out
  on: [error]
timeout: 1m          # per item

on_escalate:
  options: [retry, skip, abort]
"""


CLAUDE_AGENT_TEMPLATE: Final = """\
---
# agents/_claude-agent.md: an AI agent, commented. A file whose name starts with '_' is a template ambient
# skips; copy it to agents/<name>.md (and set `name:`) to make it an agent. Needs: pip install 'ambient[claude]'
# and ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) in the daemon's environment; `ambient doctor` checks both.
name: reviewer
type: agent
# Claude Code's subagent keys are honoured: the model (sonnet, opus, haiku or a full id) and the tools it has.
model: sonnet
tools: Read, Grep, Glob, Edit, Write, Bash
brain:
  version: 1
  ipc:
    receives_from: [ambient, human]
    sends_to: [ambient, human]
    zone_access: [project]
    signals: [RETURN, ESCALATE, ERROR, BLOCKED_ON]
ambient:
  runner:
    kind: claude
    # Bash runs without asking only what this lists (`Bash(pytest:*)`: commands starting with `pytest`);
    # any other command is a question to you: allow | allow always | deny. Writes outside the item's
    # scope and reads outside the brain are refused without asking. An allowed command runs project
    # code (pytest runs conftest.py): Claude Code and what it runs are confined (Landlock) to the scope,
    # the agent's session folder and a temp dir, and reach only the model API's TCP port; list more
    # with `network: ["host:port"]`.
    allowed_tools: ["Bash(pytest:*)", "Bash(git status)"]
    max_turns: 30
    max_budget_usd: 1.0       # this agent's own cap per item; budget: in profil/ambient.yml caps runs and days
    timeout_s: 1800
---
You review the change named in your task and leave your notes in the scope file you are given.

Read the files you need, run the tests if there are some, and say what you found. End with the JSON
answer ambient describes (RETURN with your verdict; ESCALATE if a decision is the person's to take).
"""


def brain_files(*, example: bool = True) -> list[ScaffoldFile]:
    """The files of a new brain; without ``example``, only the configuration and ``.gitignore``."""
    files = [
        ScaffoldFile(".gitignore", GITIGNORE),
        ScaffoldFile("profil/ambient.yml", CONFIG_TEMPLATE),
    ]
    if example:
        files += [
            ScaffoldFile("profil/routing.yml", ROUTING_TEMPLATE),
            ScaffoldFile("agents/hello.md", AGENT_TEMPLATE),
            ScaffoldFile("bin/hello_agent.py", AGENT_SCRIPT, 0o755),
            ScaffoldFile("workflows/hello.yml", WORKFLOW_TEMPLATE),
            ScaffoldFile("agents/_claude-agent.md", CLAUDE_AGENT_TEMPLATE),
        ]
    return files
