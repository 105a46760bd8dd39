"""Test doubles shipped with the package, like httpx's ``MockTransport``: nothing here runs in the daemon.

:mod:`ambient.testing.fakeapi` serves fake Anthropic Messages and OpenAI Chat Completions APIs on 127.0.0.1, so the
AI runners (and the real Claude Code CLI) are tested and benched offline; a package by concern (the playbook, the
shared server, one module per provider, the command line). :mod:`ambient.testing.stub_agent` is a stub agent for
tests and chaos runs (``python -m ambient.testing.stub_agent``). Standard library only, those three.
:mod:`ambient.testing.clock` is a clock a test moves by hand (``ManualClock``), and :mod:`ambient.testing.ports`
fakes of the engine's ports (``fake_ports``), to drive a run in-process.
"""
