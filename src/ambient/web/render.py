"""Server-side rendering: one Jinja2 environment (autoescape on for every template), whole pages or one block of a
page (``?fragment=NAME``, what the live layer swaps in), and the helpers every page shares (CSRF field, notice,
state colours, times, the redirect back after an action).

Every string from a file (an agent's question, an error text) goes through autoescape: no template marks anything
from the brain ``|safe``; the only Markup made here is :func:`csrf_field`'s own hidden input.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from ambient.web.security import CSRF_FIELD, CSRF_SCOPE

TEMPLATES: Final = Path(__file__).resolve().parent / "templates"

#: The navigation bar: (label, path). A page is "current" when the request path starts with its path.
NAV: Final[tuple[tuple[str, str], ...]] = (
    ("Overview", "/"),
    ("Escalations", "/escalations"),
    ("Workflows", "/workflows"),
    ("Learning", "/learning"),
    ("Matrix", "/matrix"),
    ("Claims & locks", "/claims"),
)

#: Every status word the brain writes, mapped to one of five colours (classes ``st-done``... in app.css).
_STATE_CLASS: Final[Mapping[str, str]] = {
    **dict.fromkeys(("done", "ok", "finished", "succeeded", "success", "answered", "decided", "approved"), "done"),
    **dict.fromkeys(("running", "started", "active", "open", "held", "up"), "running"),
    **dict.fromkeys(("waiting", "escalated", "pending_escalation", "gate", "held_gate", "shadow", "stale"), "waiting"),
    **dict.fromkeys(("failed", "error", "errored", "aborted", "crashed", "expired", "rejected", "down"), "failed"),
}


def state_class(status: object) -> str:
    """The colour class of a status word: ``st-done``, ``st-running``, ``st-waiting``, ``st-failed``, ``st-pending``."""
    return "st-" + _STATE_CLASS.get(str(status or "").lower(), "pending")


def _moment(value: object) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and math.isfinite(value):
        return datetime.fromtimestamp(float(value), UTC)
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def when(value: object) -> str:
    """A timestamp (epoch seconds or ISO text) as local ``YYYY-MM-DD HH:MM:SS``; empty when unknown."""
    moment = _moment(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def ago(value: object, now: datetime | None = None) -> str:
    """How long ago, in words a person reads at a glance (``12 s ago``, ``3 min ago``, ``2 h ago``, ``4 d ago``)."""
    moment = _moment(value)
    if moment is None:
        return ""
    seconds = ((now or datetime.now(UTC)) - moment).total_seconds()
    if seconds < 0:
        return "in " + duration(-seconds)
    if seconds < 1:
        return "just now"
    return duration(seconds) + " ago"


def duration(seconds: object) -> str:
    """Seconds as ``850 ms``, ``42 s``, ``3 min 05 s``, ``2 h 10 min``, ``3 d 4 h``."""
    try:
        s = float(seconds)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(s):
        return ""
    if s < 1:
        return f"{round(s * 1000)} ms"
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def money(value: object) -> str:
    """A cost in dollars (``$0.0123``, ``$4.20``)."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    return f"${v:.4f}" if abs(v) < 1 else f"${v:,.2f}"


@functools.cache
def environment() -> jinja2.Environment:
    """The one Jinja2 environment: the package's templates, autoescape on for every one of them."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(state_class=state_class, when=when, ago=ago, duration=duration, money=money)
    env.globals.update(nav=NAV)
    return env


def _context(request: Request, context: Mapping[str, Any]) -> dict[str, Any]:
    csrf = str(request.scope.get(CSRF_SCOPE, ""))
    level = request.query_params.get("level", "ok")
    return {
        "request": request,
        "url_for": request.url_for,
        "csrf_token": csrf,
        "csrf_field": lambda: Markup('<input type="hidden" name="{}" value="{}">').format(CSRF_FIELD, csrf),
        "notice": request.query_params.get("notice", "")[:500],
        "notice_level": level if level in ("ok", "error") else "ok",
        "current_path": console_path(request),
        "root": request.scope.get("root_path", ""),
        "here": here(request),
        **context,
    }


def console_path(request: Request) -> str:
    """The request's path within the console (``/escalations``), without the secret prefix it is served under
    (``root_path``, :mod:`ambient.web.security`): what links and ``back`` fields say; the prefix is added to links
    by the templates (``root``) and to redirects by the security middleware."""
    path, root = request.url.path, str(request.scope.get("root_path", ""))
    return (path[len(root) :] or "/") if root and path.startswith(root) else path


def here(request: Request) -> str:
    """The current console path and query, without the notice and fragment: the ``back`` of a page's forms."""
    keep = [(k, v) for k, v in request.query_params.multi_items() if k not in ("notice", "level", "fragment", "token")]
    return console_path(request) + (f"?{urlencode(keep)}" if keep else "")


def render(
    request: Request, name: str, context: Mapping[str, Any] | None = None, *, status_code: int = 200
) -> Response:
    """The page ``name``, or only its block ``?fragment=NAME`` (400 naming the blocks when there is no such block)."""
    template = environment().get_template(name)
    ctx = _context(request, context or {})
    fragment = request.query_params.get("fragment")
    if fragment is None:
        return HTMLResponse(template.render(ctx), status_code=status_code)
    block = template.blocks.get(fragment)
    if block is None:
        known = ", ".join(sorted(template.blocks))
        return PlainTextResponse(f"No fragment {fragment!r} on this page (known: {known}).", status_code=400)
    return HTMLResponse("".join(block(template.new_context(ctx))), status_code=status_code)


#: What a refused form brings back of each field it keeps (a URL has room for a context, not for a file).
KEPT_FORM_CHARS = 4000


def safe_back(back: object, default: str = "/") -> str:
    """``back`` when it is a path of this site (``/...``, not ``//host`` nor a scheme), else ``default``."""
    text = str(back or "")
    parts = urlsplit(text)
    if not text.startswith("/") or text.startswith("//") or parts.scheme or parts.netloc or "\\" in text:
        return default
    return text


def redirect_back(
    back: object,
    notice: str,
    *,
    ok: bool = True,
    default: str = "/",
    keep_form: dict[str, str] | None = None,
    anchor: str = "",
) -> RedirectResponse:
    """The answer to an action (a form POST): 303 to the page it came from, with its notice. A refused form may
    come back with what the person typed (``keep_form``, read by the page as ``form_<name>``) and at its place on
    the page (``anchor``), so nothing typed is lost."""
    target = safe_back(back, default)
    path, _, query = target.partition("?")
    keep = [p for p in query.split("&") if p and not p.startswith(("notice=", "level=", "form_"))]
    fields = {"notice": notice, "level": "ok" if ok else "error"}
    fields.update({f"form_{k}": v[:KEPT_FORM_CHARS] for k, v in (keep_form or {}).items()})
    keep.append(urlencode(fields))
    return RedirectResponse(path + "?" + "&".join(keep) + (f"#{anchor}" if anchor else ""), status_code=303)
