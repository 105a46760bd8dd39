#!/usr/bin/env python3
"""Example `vps` agent: "deploys" to the VPS (simulated) once a person approved the step.

Shows the other answers an agent can give besides a RETURN:
  --blocked   {"signal": "BLOCKED_ON", "context": {...}}   technically blocked (e.g. a missing credential)
  --ask       {"signal": "ESCALATE", "question": ..., "options": [...]}   a decision for the person
Stdlib only.
"""

import argparse
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocked", action="store_true", help="answer BLOCKED_ON (missing SSH key)")
    parser.add_argument("--ask", action="store_true", help="answer ESCALATE (which slot to deploy to)")
    args = parser.parse_args()
    packet = json.load(sys.stdin)
    scope = packet.get("scope", {}).get("files", [])
    if args.blocked:
        answer = {"signal": "BLOCKED_ON", "context": {"missing": "SSH key for deploy@vps-1", "scope": scope}}
    elif args.ask:
        answer = {
            "signal": "ESCALATE",
            "question": "Deploy to the blue or the green slot?",
            "options": ["blue", "green", "abort"],
        }
    else:
        result = {
            "status": "ok",
            "host": "vps-1 (simulated)",
            "deployed": scope,
            "key": os.environ.get("AMBIENT_KEY", ""),
        }
        answer = {"signal": "RETURN", "result": result}
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
