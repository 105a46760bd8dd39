"""Notification messages: what the person reads on a phone, built from an escalation or a result.

Pure text rules (DESIGN §6, RELIABILITY S-09): agent text made plain and safe, cut as Telegram counts characters so
a message always fits 4096 with its options and the exact answer command intact. Sending them is
:mod:`ambient.human.notify`'s; keeping them until they are sent is :mod:`ambient.human.outbox`'s.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

Kind = Literal["escalation", "info", "digest"]

TELEGRAM_MAX_CHARS = 4096  # Bot API sendMessage limit, after entity parsing (RELIABILITY S-09)


class Message(BaseModel):
    """One notification: what the person reads, plus what a notifier needs to offer answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    body: str
    kind: Kind = "info"
    escalation_id: str | None = None
    options: tuple[str, ...] = ()
    answer_hint: str | None = None  # e.g. "ambient decide e-12 OPTION"
    nonce: str | None = None  # per-escalation button token (Telegram callback_data); never shown
    dedupe_id: str = ""  # one pending message per id; default derived from the content

    @model_validator(mode="before")
    @classmethod
    def _default_dedupe_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("dedupe_id"):
            kind = data.get("kind", "info")
            if data.get("escalation_id"):
                ident = f"{kind}-{data['escalation_id']}"
            else:
                content = f"{kind}\0{data.get('title', '')}\0{data.get('body', '')}"
                ident = f"{kind}-{hashlib.sha256(content.encode()).hexdigest()[:20]}"
            data = {**data, "dedupe_id": ident}
        return data

    @property
    def silent(self) -> bool:
        """Only decisions make the phone buzz; results and digests arrive silently."""
        return self.kind != "escalation"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean_text(text: str) -> str:
    """Agent text made plain and safe to show: control and bidi-override characters removed.

    Markup is left as literal characters; notifiers send it as plain text (apprise escapes it with
    ``body_format=TEXT``; the Bot API client sends no ``parse_mode``), so it is never rendered (S-09).
    """
    return _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))


def text_length(text: str) -> int:
    """Length as Telegram counts it (UTF-16 code units), with a newline counted twice.

    apprise sends each newline as ``\r\n`` to HTML targets, so this is an upper bound of what arrives.
    """
    return len(text.encode("utf-16-le")) // 2 + text.count("\n")


def cut_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-16 units, ending with a marker saying it was cut."""
    if text_length(text) <= limit:
        return text
    marker = f"\n… [cut: {len(text)} characters in all]"
    budget = limit - text_length(marker)
    if budget <= 0:
        return marker[: max(limit, 0)]
    kept: list[str] = []
    used = 0
    for ch in text:
        width = 2 if ord(ch) > 0xFFFF or ch == "\n" else 1
        if used + width > budget:
            break
        kept.append(ch)
        used += width
    return "".join(kept) + marker


def fit_message(title: str, body: str, limit: int = TELEGRAM_MAX_CHARS) -> tuple[str, str]:
    """Title and body cut so that ``title + "\\r\\n" + body`` fits ``limit`` (apprise joins them so)."""
    title = cut_text(title, min(limit // 4, 250))
    room = limit - text_length(title) - 2
    return title, cut_text(body, max(room, 0))


def answer_command(escalation_id: str, option: str) -> str:
    """The exact CLI line that answers an escalation with an option (quoted for a shell)."""
    return f"ambient decide {shlex.quote(escalation_id)} {shlex.quote(option)}"


@dataclass(frozen=True)
class QuestionCard:
    """What a person reads of one escalation, whatever the channel: the single input of the message formatters.
    Every field is untrusted text (an agent's words), made plain where it is shown."""

    escalation_id: str
    what: str
    question: str
    options: Sequence[str]
    workflow: str | None = None
    item: str | None = None
    step: str | None = None
    agent: str | None = None
    deadline: str | None = None
    prediction: str | None = None  # what a learned rule in shadow would choose (you still decide)
    nonce: str | None = None  # the Telegram buttons' proof that they belong to this question


def format_escalation(
    card: QuestionCard, *, telegram_buttons: bool = False, limit: int = TELEGRAM_MAX_CHARS, reminder: bool = False
) -> tuple[str, str]:
    """Title and body of an escalation, readable on a phone.

    What happened, where (workflow / item / step / agent), the question (agent text, plain and cut in
    the middle of the message so the options and answer instructions always survive), the options
    numbered, what a learned rule in shadow would choose (``prediction``: you still decide), and exactly how to
    answer. Every field is treated as untrusted plain text.
    """
    c = card
    escalation_id, options, prediction, deadline = c.escalation_id, c.options, c.prediction, c.deadline
    if not options:
        raise ValueError("an escalation needs at least one option")
    opts = [clean_text(o).strip()[:100] or f"option {i}" for i, o in enumerate(options, 1)]
    head = "Reminder, decision still needed: " if reminder else "Decision needed: "
    title = head + (clean_text(c.what).strip().splitlines() or ["(no summary)"])[0][:120]
    where = [
        f"{label}: {clean_text(value).strip()[:200]}"
        for label, value in (("Workflow", c.workflow), ("Item", c.item), ("Step", c.step), ("Agent", c.agent))
        if value
    ]
    head = "\n".join(where)
    tail_lines = ["Options:", *(f"{i}. {o}" for i, o in enumerate(opts, 1)), ""]
    if prediction:
        tail_lines += [f"{clean_text(prediction).strip()[:300]}.", ""]
    tail_lines.append("To answer, run:")
    tail_lines.append(f"  {answer_command(escalation_id, 'OPTION')}")
    tail_lines.append(f"  e.g. {answer_command(escalation_id, opts[0])}")
    if telegram_buttons:
        tail_lines.append("or tap one of the buttons under this message in Telegram.")
    if deadline:
        tail_lines.append(f"Answer before {clean_text(deadline)[:60]}.")
    tail_lines.append(f"Ref: {escalation_id}")
    tail = "\n".join(tail_lines)
    title, _ = fit_message(title, "", limit)
    # Room left for the agent's question once title, header and instructions are placed.
    placed = [p for p in (head, tail) if p]
    fixed = text_length(title) + 2 + sum(text_length(p) for p in placed) + len(placed) * text_length("\n\n")
    question_text = cut_text(clean_text(c.question).strip() or "(no details)", max(limit - fixed, 40))
    body = "\n\n".join(part for part in (head, question_text, tail) if part)
    return fit_message(title, body, limit)


def escalation_message(card: QuestionCard, *, telegram_buttons: bool = False, reminder: bool = False) -> Message:
    """A ready :class:`Message` for an escalation: :func:`format_escalation` text plus answer data.

    A ``reminder`` says so in its title and is a message of its own (its first message may still be queued).
    """
    title, body = format_escalation(card, telegram_buttons=telegram_buttons, reminder=reminder)
    escalation_id, options, nonce = card.escalation_id, card.options, card.nonce
    return Message(
        title=title,
        body=body,
        kind="escalation",
        escalation_id=escalation_id,
        options=tuple(options),
        answer_hint=answer_command(escalation_id, "OPTION"),
        nonce=nonce,
        dedupe_id=f"reminder-{escalation_id}" if reminder else "",
    )
