"""A claim's status from its text alone: only what is certain answers "not open"; anything else is parsed."""

from __future__ import annotations

import pytest

from ambient.claims.statusline import surely_not_open
from ambient.storage.yamltext import MAX_CLAIM_BYTES


@pytest.mark.parametrize(
    ("text", "closed"),
    [
        (b"sess_id: a\nstatus: closed\n", True),
        (b"status: 'stale' # by hand\r\n", True),
        (b"status: failed\nnotes: |\n  status: open\n", True),  # an indented line is not the claim's status
        (b"status: open\n", False),
        (b'status: "open"\n', False),
        (b"status: closed\nstatus: open\n", False),  # two: a duplicate key, the parser decides
        (b"{status: closed}\n", False),  # flow style: parsed
        (b"status:\n  closed\n", False),  # the value on the next line: parsed
        (b"status:closed\n", False),  # not a key in YAML: parsed (and refused)
        (b"  status: closed\n", False),  # indented: not a top-level key
        (b"sess_id: a\n", False),  # no status line at all
        (b"", False),
    ],
)
def test_only_one_top_level_status_line_not_open_is_certain(text: bytes, closed: bool) -> None:
    assert surely_not_open(text) is closed


def test_a_text_over_the_size_cap_is_never_certain() -> None:
    pad = b"x" * (MAX_CLAIM_BYTES - len(b"\nstatus: closed\n"))
    assert surely_not_open(pad + b"\nstatus: closed\n") is True  # at the cap
    assert surely_not_open(b"x" + pad + b"\nstatus: closed\n") is False  # one byte over
