"""The console's pure security rules: Host names (DNS rebinding), loopback, same-site ``back`` targets, the secret
path and the token URL's landing, the Origin of a POST, and the sign-ins (random, kept server-side)."""

from __future__ import annotations

import stat
from pathlib import Path

from ambient.web.render import safe_back
from ambient.web.security import (
    SignIns,
    allowed_host_names,
    console_prefix,
    cookie_values,
    host_allowed,
    in_prefix,
    is_loopback,
    landing,
    origin_allowed,
)


def test_host_header_names_the_console_or_an_address() -> None:
    names = allowed_host_names("127.0.0.1")
    assert host_allowed("127.0.0.1:8765", names)
    assert host_allowed("localhost:8765", names)
    assert host_allowed("[::1]:8765", names)
    assert host_allowed("10.0.0.5:8765", names)  # an IP literal: rebinding needs a name
    assert not host_allowed("evil.example:8765", names)
    assert not host_allowed("", names)
    assert host_allowed("console.lan", allowed_host_names("console.lan"))


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.1.2.3")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.org")


def test_back_is_a_path_of_this_site_only() -> None:
    assert safe_back("/escalations?workflow=a") == "/escalations?workflow=a"
    for hostile in ("//evil.example/", "https://evil.example/", "javascript:alert(1)", "/\\evil.example", "", None):
        assert safe_back(hostile, "/x") == "/x"


def test_the_secret_path_comes_from_the_token_only() -> None:
    prefix = console_prefix("a" * 43)
    assert prefix == console_prefix("a" * 43) != console_prefix("b" * 43)
    assert prefix.startswith("/c/") and len(prefix) == 3 + 32 and "a" * 8 not in prefix
    assert in_prefix(prefix, prefix) and in_prefix(prefix + "/runs/x", prefix)
    assert not in_prefix(prefix + "x/runs", prefix) and not in_prefix("/", prefix) and not in_prefix("/c/", prefix)


def test_the_token_url_lands_on_a_page_of_the_console_only() -> None:
    p = console_prefix("a" * 43)
    assert landing("/", p) == p + "/"
    assert landing("/escalations", p) == p + "/escalations"
    assert landing(p + "/runs/r-1", p) == p + "/runs/r-1"
    assert landing("/runs/a b", p) == p + "/runs/a%20b"
    for hostile in (
        "//evil.example/x",
        "/\\evil.example",
        "\\evil.example",
        "///x",
        "/a//b",
        "/%2F%2Fevil",
        "",
        "/x\r\n",
    ):
        assert landing(hostile, p) == p + "/", hostile
        assert landing(p + hostile, p) == p + "/", hostile


def test_a_post_must_come_from_the_console_origin_exactly() -> None:
    own = "http://127.0.0.1:8765"
    assert origin_allowed(own, "same-origin", own)
    assert origin_allowed("HTTP://127.0.0.1:8765", None, own)
    assert origin_allowed(None, None, own)  # not a browser: the sign-in or the token is checked besides
    assert origin_allowed(None, "same-origin", own)
    assert not origin_allowed("http://127.0.0.1:9999", "same-site", own)  # another port of the same host
    assert not origin_allowed("http://127.0.0.1:9999", None, own)
    assert not origin_allowed("https://127.0.0.1:8765", None, own)  # another scheme
    assert not origin_allowed("null", None, own)
    assert not origin_allowed(None, "same-site", own) and not origin_allowed(None, "cross-site", own)
    assert not origin_allowed(own, "cross-site", own)  # Sec-Fetch-Site is the browser's word: it wins


def test_a_signin_is_random_kept_private_and_not_derived_from_its_cookie(tmp_path: Path) -> None:
    store = tmp_path / ".ambient" / "web" / "signins.json"
    signins = SignIns(store)
    cookie, made = signins.create()
    other, made_too = signins.create()
    assert cookie != other and made.csrf != made_too.csrf and made.csrf != cookie
    assert signins.lookup(cookie) == made and signins.lookup("nope") is None
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert cookie not in store.read_text() and other not in store.read_text()  # only their hashes are kept
    assert SignIns(store).lookup(cookie) == made  # a restart of the console logs nobody out
    late = SignIns(store)  # another console of the brain signs a browser in: this one learns it on a miss
    third, made_third = SignIns(store).create()
    assert late.lookup(third) == made_third and late.lookup(cookie) == made


def test_signins_are_capped_oldest_first(tmp_path: Path) -> None:
    signins = SignIns(tmp_path / "signins.json", cap=3)
    cookies = [signins.create()[0] for _ in range(4)]
    assert signins.lookup(cookies[0]) is None
    assert all(signins.lookup(c) is not None for c in cookies[1:])


def test_a_damaged_signin_file_is_no_signin(tmp_path: Path) -> None:
    store = tmp_path / "signins.json"
    store.write_text("{torn")
    assert SignIns(store).lookup("anything") is None
    cookie, made = SignIns(store).create()
    assert SignIns(store).lookup(cookie) == made


def test_every_value_of_the_cookie_is_read_leniently() -> None:
    header = 'theme={"dark": true}; ambient_signin=tossed; other=1; ambient_signin="real"'
    assert cookie_values(header, "ambient_signin") == ["tossed", "real"]
    assert cookie_values(header, "ambient_console") == [] and cookie_values("", "x") == []
    assert cookie_values("ambient_signin", "ambient_signin") == []  # a name without a value is none


def test_a_signin_that_cannot_be_saved_is_kept_in_memory(tmp_path: Path) -> None:
    (tmp_path / "signins.json").mkdir()  # a folder where the file goes: no write of it can succeed
    signins = SignIns(tmp_path / "signins.json")
    cookie, made = signins.create()
    assert signins.lookup(cookie) == made
