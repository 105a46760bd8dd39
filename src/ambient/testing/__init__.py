"""Test doubles shipped with the package, like httpx's ``MockTransport``: nothing here runs in the daemon.

:mod:`ambient.testing.fakeapi` serves fake Anthropic Messages and OpenAI Chat Completions APIs on 127.0.0.1, so the
AI runners (and the real Claude Code CLI) are tested and benched offline. Standard library only.
"""
