"""Offline fake model APIs on 127.0.0.1 (being split by concern: everything is in :mod:`.playbook` for now)."""

from .playbook import CONTRACT_MARKER, STRUCTURED_OUTPUT_TOOLS, FakeAnthropic, FakeOpenAI, Playbook, Recorded

__all__ = ["CONTRACT_MARKER", "STRUCTURED_OUTPUT_TOOLS", "FakeAnthropic", "FakeOpenAI", "Playbook", "Recorded"]
