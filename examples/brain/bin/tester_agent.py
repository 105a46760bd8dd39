#!/usr/bin/env python3
"""Example `tester` agent: "runs" the tests of its scope and reports the counts a `0-failures` gate reads.

Answers a plain result mapping (no "signal" key means RETURN):
  {"status": "ok", "tests": {"total": N, "passed": N, "failed": 0}}
`--failed K` simulates K failing tests (status "failed"), to see the chain's gate stop. Stdlib only.
"""

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--total", type=int, default=12, help="number of tests (default 12)")
    parser.add_argument("--failed", type=int, default=0, help="how many of them fail (default 0)")
    args = parser.parse_args()
    packet = json.load(sys.stdin)
    scope = packet.get("scope", {}).get("files", [])
    failed = max(0, min(args.failed, args.total))
    print(
        json.dumps(
            {
                "status": "ok" if failed == 0 else "failed",
                "tests": {"total": args.total, "passed": args.total - failed, "failed": failed},
                "scope": scope,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
