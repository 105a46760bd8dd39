"""The console's pure security rules: Host names (DNS rebinding), loopback, same-site ``back`` targets, CSRF."""

from __future__ import annotations

from ambient.web.render import safe_back
from ambient.web.security import allowed_host_names, csrf_token, host_allowed, is_loopback


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


def test_csrf_is_tied_to_the_token() -> None:
    assert csrf_token("a" * 43) == csrf_token("a" * 43) != csrf_token("b" * 43)
