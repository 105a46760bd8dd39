"""``hosted.json``: every console serving a brain has its entry, removes its own only, and ``ambient web --url``
reads the live ones (a console killed with -9 leaves an entry that names a dead process: not served)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ambient.core.process import own_start_time
from ambient.storage.paths import BrainPaths
from ambient.web.server import forget_serving, hosted_path, record_serving, serving_url, serving_urls


def test_each_console_forgets_only_its_own_entry(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    record_serving(paths, "http://127.0.0.1:1111/")
    record_serving(paths, "http://127.0.0.1:2222/")
    assert serving_urls(paths) == ["http://127.0.0.1:2222/", "http://127.0.0.1:1111/"]  # the newest first
    forget_serving(paths, "http://127.0.0.1:2222/")
    assert serving_url(paths) == "http://127.0.0.1:1111/"
    forget_serving(paths, "http://127.0.0.1:2222/")  # twice: nothing else goes
    assert serving_url(paths) == "http://127.0.0.1:1111/"
    forget_serving(paths, "http://127.0.0.1:1111/")
    assert serving_url(paths) is None and not hosted_path(paths).exists()


def test_dead_consoles_are_not_served_and_an_earlier_record_still_reads(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    hosted_path(paths).parent.mkdir(parents=True)
    dead = {"url": "http://127.0.0.1:3333/", "pid": os.getpid(), "start_time": 1.0}  # a recycled pid: not this one
    hosted_path(paths).write_text(json.dumps({"consoles": [dead]}))
    assert serving_url(paths) is None
    record_serving(paths, "http://127.0.0.1:4444/")
    assert [e["url"] for e in json.loads(hosted_path(paths).read_text())["consoles"]] == ["http://127.0.0.1:4444/"]
    one = {"url": "http://127.0.0.1:5555/", "pid": os.getpid(), "start_time": own_start_time()}
    hosted_path(paths).write_text(json.dumps(one))  # an earlier version's record of one console
    assert serving_urls(paths) == ["http://127.0.0.1:5555/"]
