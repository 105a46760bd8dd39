"""Secret redaction: known secret values plus token patterns, over strings, mappings and lists.

The last line of defence (RELIABILITY S-06, §2.2): the first is never putting a token into a log event,
record or error at all. Core module: pure functions over values, no I/O.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any
from urllib.parse import quote

MASK = "***"

# Registered values shorter than this are refused: redacting "a" would shred every line, and a real
# token is far longer. It is also what makes the fixpoint loop below terminate (each pass shrinks the text).
MIN_SECRET_LENGTH = 8

# Telegram bot token: "<bot id>:<35 chars>" (also inside "bot<token>" of Bot API paths).
_TELEGRAM_TOKEN = re.compile(r"\d+:[A-Za-z0-9_-]{30,}")

# A URL as it appears in free text: scheme://... up to whitespace or a quote/bracket.
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{1,31})://([^\s'\"<>`]+)")

# Schemes whose first component (the "host") is a secret rather than a host name (apprise URL formats).
_SECRET_HOST_SCHEMES = frozenset({"tgram", "tgrams", "telegram", "pbul", "pushbullet", "join", "pover", "ifttt"})

# Query keys whose value is a secret (apprise and common web APIs).
_SECRET_QUERY_KEY = re.compile(
    r"(?i)^(?:token|key|apikey|api_key|secret|password|pass|pwd|auth|access_token|bot_token|webhook|sig|signature)$"
)

# A path segment that looks like a random token: long, and mixing letters with digits.
_TOKENISH = re.compile(r"^[A-Za-z0-9_\-+=.~]{20,}$")

# Each pass is idempotent once it has masked what it found; a text that has not settled after this
# many passes is pathological and is masked whole.
_MAX_PASSES = 16


def _looks_like_token(segment: str) -> bool:
    return bool(_TOKENISH.match(segment)) and any(c.isdigit() for c in segment) and any(c.isalpha() for c in segment)


def _secret_authority(scheme: str, authority: str) -> bool:
    """Whether the host part of a URL is a secret (tgram://TOKEN/...) rather than a host name."""
    if not authority:
        return False
    if scheme.lower() in _SECRET_HOST_SCHEMES:
        return True
    host = authority.split(":", 1)[0]
    return "." not in host and _looks_like_token(host)


def _mask_url_rest(scheme: str, rest: str) -> str:
    """Mask the secret parts of ``rest`` (everything after ``scheme://``)."""
    path_part, sep_q, query = rest.partition("?")
    query, sep_f, fragment = query.partition("#")
    # userinfo: scheme://user:password@host or scheme://token@host -> mask it whole.
    authority, slash, path = path_part.partition("/")
    if "@" in authority:
        authority = MASK + "@" + authority.rsplit("@", 1)[1]
    elif _secret_authority(scheme, authority):
        authority = MASK
    segments = [MASK if _looks_like_token(seg) else seg for seg in path.split("/")] if slash else []
    out = authority + (slash + "/".join(segments) if slash else "")
    if sep_q:
        pairs = []
        for pair in query.split("&"):
            k, eq, v = pair.partition("=")
            if eq and (_SECRET_QUERY_KEY.match(k) or _looks_like_token(v)):
                v = MASK
            pairs.append(k + eq + v)
        out += "?" + "&".join(pairs)
    if sep_f:
        out += "#" + fragment
    return out


def is_url(text: str) -> bool:
    """Whether ``text`` is one URL as a notification URL must be: ``scheme://rest``, no whitespace."""
    return _URL.fullmatch(text.strip()) is not None


def redact_url(url: str, registry: SecretRegistry | None = None) -> str:
    """A notification URL safe to display: userinfo, tokens and secret query values masked.

    ``tgram://123:ABC.../4242`` becomes ``tgram://***/4242``; ``json://127.0.0.1:8080/hook`` is unchanged.
    Values in ``registry`` are masked too. A value that is not a URL (``tgram//TOKEN/CHAT``, a ``:`` forgotten) is
    masked whole: where its secret is cannot be told.
    """
    if not is_url(url):
        return MASK
    text = registry.redact_text(url) if registry is not None else url
    return _URL.sub(lambda m: m.group(1) + "://" + _mask_url_rest(m.group(1), m.group(2)), text)


def secrets_in_url(url: str) -> list[str]:
    """The secret parts of a notification URL (userinfo, token host, token-like segments), for a registry."""
    found: list[str] = []
    m = _URL.search(url)
    if m is None or not is_url(url):
        return [url.strip()]  # not a URL: all of it may be the secret (a library may quote it in an error)
    scheme, rest = m.group(1).lower(), m.group(2)
    path_part, _, query = rest.partition("?")
    authority, _, path = path_part.partition("/")
    if "@" in authority:
        userinfo = authority.rsplit("@", 1)[0]
        found.append(userinfo)
        found.extend(part for part in userinfo.split(":") if part)
    elif scheme in _SECRET_HOST_SCHEMES and authority:
        found.append(authority)
    found.extend(seg for seg in path.split("/") if _looks_like_token(seg))
    for pair in query.split("&"):
        k, eq, v = pair.partition("=")
        if eq and v and _SECRET_QUERY_KEY.match(k):
            found.append(v)
    found.extend(t.group(0) for t in _TELEGRAM_TOKEN.finditer(url))
    return [s for s in dict.fromkeys(found) if len(s) >= MIN_SECRET_LENGTH]


class SecretRegistry:
    """Known secret values (bot tokens, URL passwords) that must never leave the process unmasked.

    Thread-safe: values are added at start-up by the shell and read by logging threads.
    """

    __slots__ = ("_lock", "_pattern", "_values")

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None
        for v in values:
            self.add(v)

    def add(self, value: str) -> None:
        """Register a secret (and its URL-encoded form). Values under 8 characters are refused."""
        value = value.strip()
        if len(value) < MIN_SECRET_LENGTH:
            raise ValueError(f"a secret must be at least {MIN_SECRET_LENGTH} characters long to be redacted safely")
        variants = {value, quote(value, safe=""), quote(value, safe=":/@")}
        with self._lock:
            values = self._values | {v for v in variants if len(v) >= MIN_SECRET_LENGTH}
            # Longest first, so a secret that contains another is masked whole.
            alternation = "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))
            self._pattern = re.compile(alternation)
            self._values = values

    def add_url(self, url: str) -> None:
        """Register the secret parts of a notification URL (see :func:`secrets_in_url`); parts too short to be
        masked safely are left (they are masked in the URL's own display all the same)."""
        for s in secrets_in_url(url):
            if len(s.strip()) >= MIN_SECRET_LENGTH:
                self.add(s)

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._values)

    def redact_text(self, text: str) -> str:
        """``text`` with every registered value replaced by ``***`` (registered values only)."""
        pattern = self._pattern
        if pattern is None:
            return text
        # Masking can join the text around a secret into a new occurrence (e.g. "ab" + MASK + ...):
        # repeat until nothing matches. Each pass shrinks the text, so this ends.
        while True:
            new = pattern.sub(MASK, text)
            if new == text:
                return text
            text = new


def redact_text(text: str, registry: SecretRegistry | None = None) -> str:
    """``text`` with registered secrets, Telegram tokens and URL secrets masked."""
    for _ in range(_MAX_PASSES):
        new = registry.redact_text(text) if registry is not None else text
        new = _TELEGRAM_TOKEN.sub(MASK, new)
        new = _URL.sub(lambda m: m.group(1) + "://" + _mask_url_rest(m.group(1), m.group(2)), new)
        if new == text:
            return text
        text = new
    return MASK  # did not settle: give up on the text rather than risk a leak


def redact(obj: Any, registry: SecretRegistry | None = None) -> Any:
    """A copy of ``obj`` with every string in it redacted (mappings, lists, tuples and sets are walked).

    Numbers, booleans and None pass through; any other object whose ``str()`` carries a secret is
    replaced by its redacted string.
    """
    if isinstance(obj, str):
        return redact_text(obj, registry)
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, Mapping):
        return {redact(k, registry): redact(v, registry) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        items = [redact(v, registry) for v in obj]
        return items if isinstance(obj, list) else type(obj)(items)
    if isinstance(obj, bytes | bytearray):
        text = obj.decode("utf-8", "replace")
        cleaned = redact_text(text, registry)
        return obj if cleaned == text else cleaned
    try:
        text = str(obj)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break logging
        return obj
    cleaned = redact_text(text, registry)
    return obj if cleaned == text else cleaned


class RedactProcessor:
    """structlog processor masking secrets in every value of the event dict; configure it last.

    It runs after exceptions are rendered to strings, so tracebacks are redacted too (§2.2).
    """

    __slots__ = ("registry",)

    def __init__(self, registry: SecretRegistry | None = None) -> None:
        self.registry = registry

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key in list(event_dict):
            value = event_dict[key]
            cleaned = redact(value, self.registry)
            if cleaned is not value:
                event_dict[key] = cleaned
        return event_dict
