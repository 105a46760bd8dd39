"""Offline fake model APIs on 127.0.0.1: the Anthropic Messages API and the OpenAI Chat Completions API.

A test double, not part of the daemon (shipped like httpx's ``MockTransport``: this package's names are a public
seam). Each fake is an HTTP server on a free loopback port, served by a daemon thread (standard library only), that
answers from a *playbook* written in the agent's system prompt, so the official SDKs and the real Claude Code CLI can
be driven end to end without a network or a key::

    with FakeAnthropic() as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key"}
        ...
        api.wait_for(lambda reqs: len(reqs) >= 2)

One module per concern: ``playbook`` (what the fake model says, read from the request: pure), ``server`` (the
threaded loopback server every fake shares, the :class:`Recorded` requests, injected failures), ``anthropic`` and
``openai`` (each provider's routes, replies, SSE streams and errors), ``__main__`` (the command line:
``python -m ambient.testing.fakeapi anthropic|openai [--port N] [--port-file F]`` serves one until SIGTERM).
"""

from .anthropic import STRUCTURED_OUTPUT_TOOLS, FakeAnthropic
from .openai import FakeOpenAI
from .playbook import CONTRACT_MARKER, Playbook
from .server import Billed, Recorded

__all__ = [
    "CONTRACT_MARKER",
    "STRUCTURED_OUTPUT_TOOLS",
    "Billed",
    "FakeAnthropic",
    "FakeOpenAI",
    "Playbook",
    "Recorded",
]
