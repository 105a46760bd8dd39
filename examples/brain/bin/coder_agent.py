#!/usr/bin/env python3
"""Example `coder` agent: "implements" the feature of its scope and says which files it changed.

Reads the SPAWN packet on stdin, answers {"signal": "RETURN", "result": {...}} on stdout.
It changes nothing on disk: the example stays safe to run anywhere. Stdlib only.
"""

import json
import os
import sys


def main() -> int:
    packet = json.load(sys.stdin)
    scope = packet.get("scope", {}).get("files", [])
    story = packet.get("payload", {}).get("context", {}).get("story_angle", "the feature")
    result = {
        "status": "ok",
        "summary": f"implemented: {story}",
        "files_modified": scope,
        # A code step closes "validated" (spec/002 tier 2): it reports the tests it ran, green here.
        "tests": {"total": 4, "passed": 4, "failed": 0},
        "attempt": int(os.environ.get("AMBIENT_ATTEMPT", "1")),
    }
    print(json.dumps({"signal": "RETURN", "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
