"""A Landlock ruleset built ahead (as the spawner builds each agent's before its fork) and applied in a forked child:
it grants what its paths name when it is built, even though their descriptors are kept from one ruleset to the
next."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ambient.runners import landlock
from ambient.runners.confinement import landlock_abi

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="needs Landlock")

_CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import landlock
base = sys.argv[2]
a, b = os.path.join(base, "a"), os.path.join(base, "b")
os.close(landlock.ruleset([a.encode()], [], landlock.abi()))  # a's folder opened and kept
os.rename(a, b)  # what was a is b now; a new a is made
os.mkdir(a)
with open(os.path.join(a, "f"), "w") as f:
    f.write("new a")
rules = landlock.ruleset([a.encode()], [os.path.join(base, "gone").encode()], landlock.abi())
pid = os.fork()
if pid == 0:
    landlock.restrict(rules)
    said = {}
    for name in ("a", "b"):
        try:
            with open(os.path.join(base, name, "f")) as f:
                said[name] = f.read()
        except OSError as exc:
            said[name] = exc.strerror
    os.write(1, json.dumps(said).encode())
    os._exit(0)
os.close(rules)
os.waitpid(pid, 0)
"""


def test_a_ruleset_grants_what_its_paths_name_now_not_what_they_named_before(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("old a")
    where = str(Path(landlock.__file__).parent)
    argv = [sys.executable, "-I", "-c", _CHILD, where, str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == {"a": "new a", "b": "Permission denied"}
