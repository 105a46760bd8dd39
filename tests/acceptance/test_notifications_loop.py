"""README, "Escalations and notifications": what reaches the person's phone, and only what still needs them
(issue 23.6, 23.7, and `ambient notify test` for the Telegram answers channel)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.acceptance.harness import Brain, FakeTelegram, Webhook, wait

FAILING_AGENT = """
    import sys
    sys.exit(1)
"""


def _failing_run(brain: Brain, name: str, items: list[str], extra: str = "") -> None:
    brain.python_agent("broken", FAILING_AGENT)
    brain.workflow(
        name,
        f"""
workflow: {name}
for_each:
  items: {items}
  spawn: broken
  scope: {{zone: project, files: ["workspace/{name}/{{{{item}}}}.md"]}}
{extra}""",
    )


def test_a_digest_batches_results_and_goes_out_while_the_daemon_runs(brain: Brain, webhook: Webhook) -> None:
    """`notify.digest`: finished runs are not sent one by one but as one message every `digest_hours`, sent while
    the daemon runs (it waited in the outbox for the next escalation or start)."""
    brain.config(
        f"""
        tick_seconds: 0.2
        notify:
          urls: ["{webhook.url}"]
          results: all
          digest: true
          digest_hours: 0.001
        """
    )
    brain.python_agent("fine", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'status': 'ok'}))\n")
    brain.workflow(
        "tidy", "workflow: tidy\nfor_each:\n  items: [a]\n  spawn: fine\n  scope: {zone: project, files: [w/a.md]}\n"
    )
    with brain.daemon():
        brain.wait_finished("tidy")
        [digest] = wait(lambda: [t for t in webhook.texts() if t.startswith("ambient digest")], "the digest")
    assert digest.startswith("ambient digest of the last 3.6 s: 1 update(s)"), digest
    assert "tidy" in digest, digest
    assert not [t for t in webhook.texts() if t.startswith("tidy")], webhook.texts()  # never sent on its own


def test_remind_before_sends_a_reminder_before_the_deadline(brain: Brain, webhook: Webhook) -> None:
    """Issue 23.6: `on_escalate: {timeout, remind_before}` sends a reminder that long before the deadline."""
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\n')
    _failing_run(brain, "nightly", ["db"], extra="on_escalate: {timeout: 8s, remind_before: 6s, on_timeout: abort}\n")
    with brain.daemon():
        [esc] = brain.wait_escalation()
        assert esc["remind_at"] is not None and esc["deadline"] is not None, esc
        reminder = wait(lambda: [t for t in webhook.texts() if t.startswith("Reminder")], "the reminder at the webhook")
        assert f"Ref: {esc['id']}" in reminder[0]
        assert brain.escalations()[0]["reminded"] is True
    first = [t for t in webhook.texts() if t.startswith("Decision needed") and esc["id"] in t]
    assert len(first) == 1, webhook.texts()


def test_an_escalation_answered_while_its_message_waits_is_never_sent(brain: Brain, webhook: Webhook) -> None:
    """Issue 23.7: a "Decision needed" still in the outbox when the person answers is dropped, not delivered."""
    webhook.fail_next = 10_000
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\n  retry_base_s: 0.2\n  retry_cap_s: 0.4\n')
    _failing_run(brain, "deploy", ["web"])
    with brain.daemon() as daemon:
        [esc] = brain.wait_escalation()
        daemon.wait_log("notification_retry")  # the phone is out of reach: the message waits in the outbox
        assert brain.decide(esc["id"], "skip").rc == 0
        brain.wait_finished("deploy")
        webhook.fail_next = 0
        wait(brain.outbox_empty, "the outbox to empty")
    assert not any(f"Ref: {esc['id']}" in t for t in webhook.texts()), webhook.texts()


def test_a_new_url_receives_only_what_is_pending_now(brain: Brain, webhook: Webhook) -> None:
    """Issue 23.7: a URL added to a brain that ran without one gets the escalations still pending, nothing else."""
    _failing_run(brain, "old", ["a", "b", "c"])
    brain.until_idle()
    escs = {e["item"]: e for e in brain.escalations()}
    assert brain.decide(escs["a"]["id"], "skip").rc == 0
    assert brain.decide(escs["b"]["id"], "skip").rc == 0
    brain.until_idle()
    brain.config(f'notify:\n  urls: ["{webhook.url}"]\n')
    with brain.daemon():
        wait(lambda: any(f"Ref: {escs['c']['id']}" in t for t in webhook.texts()), "the pending escalation")
        wait(brain.outbox_empty, "the outbox to empty")
    sent = webhook.texts()
    assert len(sent) == 1, sent
    assert all(f"Ref: {escs[k]['id']}" not in sent[0] for k in ("a", "b"))


def test_notify_test_covers_the_telegram_answers_bot(
    brain: Brain, webhook: Webhook, telegram: FakeTelegram, tmp_path: Path
) -> None:
    """`ambient notify test` sends through every channel the daemon uses: the URLs and the Telegram answers bot."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "telegram-token").write_text(telegram.token)
    brain.config(f"""
        notify:
          urls: ["{webhook.url}"]
        telegram: {{answers: true, chat_id: "4242", api_base: "{telegram.api_base}"}}
    """)
    res = brain.cli("notify", "test", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert res.rc == 0, res
    assert "2 of 2" in res.out, res
    assert "telegram" in res.out and "4242" in res.out, res
    assert [str(m["chat_id"]) for m in telegram.messages] == ["4242"]
    assert len(webhook.posts) == 1
    assert telegram.token not in res.text


def test_notify_test_says_when_the_telegram_bot_cannot_be_reached(brain: Brain, tmp_path: Path) -> None:
    """`ambient notify test` reports a Telegram answers bot it cannot reach as a failure (exit 1), token masked."""
    creds = tmp_path / "creds"
    creds.mkdir()
    token = "123456789:AAH-unreachableToken_abcdefghijklmnop"
    (creds / "telegram-token").write_text(token)
    brain.config('telegram: {answers: true, chat_id: "4242", api_base: "http://127.0.0.1:9"}\n')
    res = brain.cli("notify", "test", "--timeout", "5", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert res.rc == 1, res
    assert "FAIL" in res.out and "telegram" in res.out, res
    assert token not in res.text


def test_a_malformed_bot_token_fails_its_channel_only_and_doctor_says_so(
    brain: Brain, webhook: Webhook, tmp_path: Path
) -> None:
    """A bot token that cannot be one (the placeholder of examples/systemd) fails the Telegram channel with the rule
    it breaks; `notify test` still tries the URLs; `doctor` reports it instead of Telegram staying silently off."""
    token = tmp_path / "telegram-token"
    token.write_text("123456:ABC-your-bot-token\n")
    brain.config(f"""
        notify:
          urls: ["{webhook.url}"]
        telegram: {{answers: true, chat_id: "4242", token_file: "{token}"}}
    """)
    res = brain.cli("notify", "test")
    assert res.rc == 1, res
    assert re.search(r"^ok +json://", res.out, re.M) and len(webhook.posts) == 1, res
    assert "FAIL  the Telegram bot token is malformed" in res.out and "20 or more" in res.out, res
    assert "1 of 2 notification channel(s) worked" in res.out, res
    doctor = brain.cli("doctor")
    assert "telegram.answers is on but the Telegram bot token is malformed" in doctor.text, doctor
    assert "ABC-your-bot-token" not in res.text + doctor.text
