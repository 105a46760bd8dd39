#!/usr/bin/env python3
"""Example `scribe` agent: "documents" its scope and answers with a summary.

`--partial` answers status "partial" (some docs left to write), which sends a chain step to its
`on_partial` trigger (the example chain asks the person there). Stdlib only.
"""

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partial", action="store_true", help="report the documentation as partial")
    args = parser.parse_args()
    packet = json.load(sys.stdin)
    scope = packet.get("scope", {}).get("files", [])
    result = {
        "status": "partial" if args.partial else "ok",
        "summary": f"documented {', '.join(scope) or 'the scope'}",
        "gaps": ["usage examples"] if args.partial else [],
    }
    print(json.dumps({"signal": "RETURN", "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
