"""The stamp of the code that fills a derived file: it changes with the format and with an edit of a named module,
and naming a module does not import it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ambient.storage.codestamp import code_stamp


def _stamp_in_child(pkg_root: Path, fmt: int) -> tuple[str, bool]:
    """The stamp of ``rulesmod`` as a fresh process computes it, and whether computing it imported the module."""
    code = textwrap.dedent(
        f"""
        import sys
        from ambient.storage.codestamp import code_stamp
        print(code_stamp({fmt}, ("rulesmod",)), "rulesmod" in sys.modules)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg_root), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    stamp, imported = done.stdout.split()
    return stamp, imported == "True"


def test_an_edit_of_a_named_module_or_a_new_format_changes_the_stamp(tmp_path: Path) -> None:
    module = tmp_path / "rulesmod.py"
    module.write_text("RULE = 1\n")
    os.utime(module, ns=(1_000_000_000, 1_000_000_000))
    first, imported = _stamp_in_child(tmp_path, 1)
    assert not imported  # found by name and stat'ed: a reader that finds nothing changed imports nothing
    assert _stamp_in_child(tmp_path, 1)[0] == first  # the same code: the same stamp
    assert _stamp_in_child(tmp_path, 2)[0] != first  # another format
    module.write_text("RULE = 2\n")  # same size, another mtime
    os.utime(module, ns=(2_000_000_000, 2_000_000_000))
    assert _stamp_in_child(tmp_path, 1)[0] != first


def test_a_module_that_cannot_be_found_counts_as_absent() -> None:
    assert code_stamp(1, ("ambient_no_such_module_anywhere",)) == code_stamp(1, ())
    assert len(code_stamp(1, ("ambient.storage.fsutil",))) == 16
