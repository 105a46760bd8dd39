#!/usr/bin/env python3
"""Example `deploy` agent: deploys one instance (simulated) and answers with a RETURN.

The ambient agent protocol, in short:
  stdin   the SPAWN packet as JSON: {"signal": "SPAWN", "scope": {"files": [...]}, "payload": {"context": {...}}}
  env     AMBIENT_ITEM, AMBIENT_ATTEMPT, AMBIENT_KEY (idempotency key), AMBIENT_RUN_ID, AMBIENT_BRAIN
  stdout  one JSON object: {"signal": "RETURN", "result": {"status": "ok" | "failed", ...}}
  exit    0 when it answered on stdout (a failure is said in the result, not by the exit code)

instance-07 fails its health check on its first attempt (a flaky service), so the example brain
shows an escalation; answering it with `retry` deploys it.
Stdlib only.
"""

import json
import os
import sys
from pathlib import Path

BROKEN = {"instance-07"}  # the instance whose (simulated) health check fails the first time


def main() -> int:
    packet = json.load(sys.stdin)
    context = packet.get("payload", {}).get("context", {})
    instance = os.environ.get("AMBIENT_ITEM") or context.get("instance", "unknown")
    # A real deploy would remember AMBIENT_KEY and do nothing the second time it sees it: ambient runs an
    # agent at least once, so a retried or resumed item must not deploy twice.
    key = os.environ.get("AMBIENT_KEY", "")
    files = packet.get("scope", {}).get("files", [])
    brain = Path(os.environ.get("AMBIENT_BRAIN", "."))
    config = files[0] if files else f"infrastructure/vps/configs/{instance}.yml"
    found = (brain / config).is_file()

    attempt = int(os.environ.get("AMBIENT_ATTEMPT", "1"))
    if instance in BROKEN and attempt == 1:
        result = {
            "status": "failed",
            "instance": instance,
            "error": f"health check failed on {instance}: https://{instance}.example/health answered 502",
            "config": config,
        }
    else:
        result = {"status": "ok", "instance": instance, "config": config, "config_found": found, "key": key}
    print(json.dumps({"signal": "RETURN", "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
