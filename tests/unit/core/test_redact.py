"""Secret redaction: registered values, Telegram tokens, secrets inside apprise URLs (S-06)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.redact import (
    MASK,
    RedactProcessor,
    SecretRegistry,
    redact,
    redact_text,
    redact_url,
    secrets_in_url,
)

TOKEN = "123456789:AAHcanaryCANARYcanary0123456789_-xyz"


class TestRegistry:
    def test_registered_value_is_masked(self) -> None:
        """A registered secret is replaced wherever it appears in a string."""
        reg = SecretRegistry(["s3cr3t-value-42"])
        assert redact_text("a s3cr3t-value-42 b s3cr3t-value-42", reg) == f"a {MASK} b {MASK}"

    def test_short_values_are_refused(self) -> None:
        """Registering a value too short to redact safely is an error."""
        with pytest.raises(ValueError, match="at least 8"):
            SecretRegistry().add("abc")

    def test_url_encoded_form_is_masked(self) -> None:
        """The percent-encoded form of a registered secret is masked too."""
        reg = SecretRegistry(["p@ss word/with:stuff"])
        assert "p%40ss" not in redact_text("x=p%40ss%20word%2Fwith%3Astuff", reg)

    def test_longest_secret_wins(self) -> None:
        """A secret containing another one is masked whole, not leaving its tail."""
        reg = SecretRegistry(["abcdefgh", "abcdefgh-and-more"])
        assert redact_text("[abcdefgh-and-more]", reg) == f"[{MASK}]"

    def test_add_url_registers_its_secrets(self) -> None:
        """add_url registers the token of a tgram URL and the password of a userinfo URL."""
        reg = SecretRegistry()
        reg.add_url(f"tgram://{TOKEN}/4242")
        reg.add_url("mailtos://alice:Very-Secret-Pw1@example.com")
        assert TOKEN in reg and "Very-Secret-Pw1" in reg


class TestPatterns:
    def test_telegram_token_masked_without_registry(self) -> None:
        """A bot token is masked by its shape, also as bot<token> in a Bot API path."""
        text = f"POST https://api.telegram.org/bot{TOKEN}/sendMessage and {TOKEN}"
        out = redact_text(text)
        assert TOKEN not in out and "AAHcanary" not in out
        assert "/sendMessage" in out

    def test_short_colon_numbers_are_left_alone(self) -> None:
        """Times, ports and ratios do not look like tokens."""
        text = "at 12:30 on 127.0.0.1:8080, ratio 3:4"
        assert redact_text(text) == text

    @pytest.mark.parametrize(
        ("url", "hidden", "kept"),
        [
            (f"tgram://{TOKEN}/4242", TOKEN, "4242"),
            ("tgram://bot12345:shorttoken/-100123", "shorttoken", "-100123"),
            ("mailtos://alice:Very-Secret-Pw1@example.com", "Very-Secret-Pw1", "example.com"),
            ("pover://userkey1234567890abcdef@apptoken1234567890abcdef", "userkey1234567890abcdef", "pover://"),
            ("json://127.0.0.1:8080/hook?token=abc12345secret", "abc12345secret", "127.0.0.1:8080/hook"),
            ("discord://123456789/Zk3jR9wQpX7vN2mL5tH8bY4cF6dG1sA0", "Zk3jR9wQpX7vN2mL5tH8bY4cF6dG1sA0", "123456789"),
        ],
    )
    def test_redact_url(self, url: str, hidden: str, kept: str) -> None:
        """redact_url hides the secret part of an apprise URL and keeps what identifies the target."""
        shown = redact_url(url)
        assert hidden not in shown
        assert kept in shown

    def test_plain_url_unchanged(self) -> None:
        """A URL without secrets is displayed as is."""
        assert redact_url("json://127.0.0.1:8080/hook") == "json://127.0.0.1:8080/hook"

    def test_urls_inside_text_are_masked(self) -> None:
        """A URL embedded in a log message has its secret masked."""
        out = redact_text("failed to load mailto://bob:Hunter2Hunter2@mail.example.org, giving up")
        assert "Hunter2Hunter2" not in out and "mail.example.org" in out

    def test_secrets_in_url(self) -> None:
        """secrets_in_url returns the token of a tgram URL and nothing for a plain json URL."""
        assert TOKEN in secrets_in_url(f"tgram://{TOKEN}/4242")
        assert secrets_in_url("json://127.0.0.1:8080/hook") == []


class TestStructures:
    def test_nested_structures(self) -> None:
        """Mappings, lists and tuples are walked; numbers and None pass through."""
        reg = SecretRegistry(["the-secret-value"])
        data = {"a": ["x the-secret-value", ("the-secret-value", 3)], "n": None, "f": 1.5, "the-secret-value": True}
        out = redact(data, reg)
        assert "the-secret-value" not in repr(out)
        assert out["n"] is None and out["f"] == 1.5 and out["a"][1][1] == 3

    def test_other_objects_with_secrets_become_strings(self) -> None:
        """An object whose str() carries a secret is replaced by its redacted string."""

        class Leaky:
            def __str__(self) -> str:
                return f"Leaky({TOKEN})"

        out = redact({"obj": Leaky()})
        assert isinstance(out["obj"], str) and TOKEN not in out["obj"]

    def test_processor_masks_every_value(self) -> None:
        """RedactProcessor masks secrets in the event and in every field, in place."""
        reg = SecretRegistry(["registered-secret"])
        ed = {"event": f"sending with {TOKEN}", "url": "x registered-secret", "exception": f"Traceback ... {TOKEN}"}
        out = RedactProcessor(reg)(None, "info", ed)
        assert TOKEN not in str(out) and "registered-secret" not in str(out)


# Secrets of at least 8 characters, from any alphabet (including '*' and the mask itself).
_secret = st.text(min_size=8, max_size=40).filter(lambda s: s.strip() == s)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(secret=_secret, before=st.text(max_size=60), after=st.text(max_size=60))
def test_registered_secret_never_survives(secret: str, before: str, after: str) -> None:
    """A registered secret embedded anywhere in a string never survives redaction."""
    reg = SecretRegistry([secret])
    out = redact_text(before + secret + after, reg)
    assert secret not in out


@settings(max_examples=200, deadline=None)
@given(secret=_secret, parts=st.lists(st.text(max_size=20), min_size=1, max_size=5))
def test_registered_secret_never_survives_repeated(secret: str, parts: list[str]) -> None:
    """Several copies of a secret, glued by arbitrary text, all disappear."""
    reg = SecretRegistry([secret])
    assert secret not in redact_text(secret.join(parts) + secret, reg)


@settings(max_examples=200, deadline=None)
@given(
    token_tail=st.text(
        alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-", min_size=35, max_size=40
    ),
    bot_id=st.integers(min_value=1, max_value=10**10),
    noise=st.text(max_size=30),
)
def test_token_shape_never_survives(token_tail: str, bot_id: int, noise: str) -> None:
    """Any string shaped like a bot token is masked, even without a registry."""
    token = f"{bot_id}:{token_tail}"
    assert token not in redact_text(f"{noise}bot{token}/{noise}")
