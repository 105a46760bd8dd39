"""The console's pure security rules: Host names (DNS rebinding), loopback, same-site ``back`` targets, the secret
path and the token URL's landing, the Origin of a POST, the sign-ins (random, kept server-side, tied to their token)
and the token file read again when it changes."""

from __future__ import annotations

import stat
from pathlib import Path

from ambient.web.render import safe_back
from ambient.web.security import (
    SignIns,
    TokenFile,
    allowed_host_names,
    console_prefix,
    cookie_values,
    host_allowed,
    in_prefix,
    is_loopback,
    landing,
    post_refusal,
    token_digest,
)

T = token_digest("t" * 43)  # the digest of the token the sign-ins below are made with


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

    def ok(origin: str | None, site: str | None, *, by_token: bool = False) -> bool:
        return post_refusal(origin, site, own, by_token=by_token) is None

    assert ok(own, "same-origin")
    assert ok("HTTP://127.0.0.1:8765", None)
    assert ok(None, "same-origin")  # a browser that sent no Origin says where the request comes from
    assert not ok(None, None)  # a cookie that names no origin: a replayed cookie, not the console's page
    assert "Origin" in (post_refusal(None, None, own, by_token=False) or "")
    assert ok(None, None, by_token=True)  # the token itself as a bearer: no browser sends it on its own
    assert not ok("http://evil.example", None, by_token=True)  # ... but an origin it names must be the console's
    assert not ok("http://127.0.0.1:9999", "same-site")  # another port of the same host
    assert not ok("http://127.0.0.1:9999", None)
    assert not ok("https://127.0.0.1:8765", None)  # another scheme
    assert not ok("null", None)
    assert not ok(None, "same-site") and not ok(None, "cross-site")
    assert not ok(own, "cross-site")  # Sec-Fetch-Site is the browser's word: it wins


def test_a_signin_is_random_kept_private_and_not_derived_from_its_cookie(tmp_path: Path) -> None:
    store = tmp_path / ".ambient" / "web" / "signins.json"
    signins = SignIns(store)
    cookie, made = signins.create(T)
    other, made_too = signins.create(T)
    assert cookie != other and made.csrf != made_too.csrf and made.csrf != cookie
    assert signins.lookup(cookie, T) == made and signins.lookup("nope", T) is None
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert cookie not in store.read_text() and other not in store.read_text()  # only their hashes are kept
    assert SignIns(store).lookup(cookie, T) == made  # a restart of the console logs nobody out
    late = SignIns(store)  # another console of the brain signs a browser in: this one learns it on a miss
    third, made_third = SignIns(store).create(T)
    assert late.lookup(third, T) == made_third and late.lookup(cookie, T) == made


def test_signins_are_capped_oldest_first(tmp_path: Path) -> None:
    signins = SignIns(tmp_path / "signins.json", cap=3)
    cookies = [signins.create(T)[0] for _ in range(4)]
    assert signins.lookup(cookies[0], T) is None
    assert all(signins.lookup(c, T) is not None for c in cookies[1:])


def test_a_damaged_signin_file_is_no_signin(tmp_path: Path) -> None:
    store = tmp_path / "signins.json"
    store.write_text("{torn")
    assert SignIns(store).lookup("anything", T) is None
    cookie, made = SignIns(store).create(T)
    assert SignIns(store).lookup(cookie, T) == made


def test_every_value_of_the_cookie_is_read_leniently() -> None:
    header = 'theme={"dark": true}; ambient_signin=tossed; other=1; ambient_signin="real"'
    assert cookie_values(header, "ambient_signin") == ["tossed", "real"]
    assert cookie_values(header, "ambient_console") == [] and cookie_values("", "x") == []
    assert cookie_values("ambient_signin", "ambient_signin") == []  # a name without a value is none


def test_a_signin_that_cannot_be_saved_is_kept_in_memory(tmp_path: Path) -> None:
    (tmp_path / "signins.json").mkdir()  # a folder where the file goes: no write of it can succeed
    signins = SignIns(tmp_path / "signins.json")
    cookie, made = signins.create(T)
    assert signins.lookup(cookie, T) == made


def test_a_signin_opens_only_with_the_token_it_was_made_with(tmp_path: Path) -> None:
    """After a new token, a sign-in of the old one opens nothing, even in a console that still holds it in memory;
    the first sign-in of the new token drops those of the old from the file."""
    store = tmp_path / "signins.json"
    old_console = SignIns(store)
    cookie, made = old_console.create(T)
    new = token_digest("n" * 43)
    assert old_console.lookup(cookie, T) == made
    assert old_console.lookup(cookie, new) is None and SignIns(store).lookup(cookie, new) is None
    fresh, made_fresh = SignIns(store).create(new)
    assert old_console.lookup(fresh, new) == made_fresh and old_console.lookup(fresh, T) is None
    assert SignIns(store).lookup(cookie, T) is None  # dropped from the file
    store.write_text('{"signins": {"x": {"csrf": "c", "at": 1.0}}}')  # an earlier version's: no token recorded
    assert SignIns(store).lookup("x", T) is None and SignIns(store).lookup("x", "") is None


def _replace(path: Path, text: str) -> None:
    """Write a whole new file in place of ``path``, as every write of the token does (atomic: a new inode)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("a" * 43 + "\n")
    tokens = TokenFile(path, "a" * 43)
    first = tokens.current()
    assert (first.token, first.prefix, first.digest) == ("a" * 43, console_prefix("a" * 43), token_digest("a" * 43))
    _replace(path, "b" * 43 + "\n")  # ambient web --new-token, from another process
    now = tokens.current()
    assert now.token == "b" * 43 and now.prefix != first.prefix and now.digest == token_digest("b" * 43)
    _replace(path, "short\n")  # not a token: the last one stays
    assert tokens.current().token == "b" * 43
    path.unlink()
    assert tokens.current().token == "b" * 43
    assert TokenFile(None, "c" * 43).current().token == "c" * 43
