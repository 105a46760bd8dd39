"""The ``llm`` runner: one model call, no tools, for agents that only think (review, summarise, classify, decide).

The agent's markdown body and the answer contract are the system prompt (:func:`ambient.runners.prompt.
system_prompt`); the SPAWN, rendered as a brief, is the one user message; the answer maps onto RETURN / ESCALATE /
BLOCKED_ON / ERROR through :func:`ambient.runners.answer.final_answer`, like a command agent's JSON.

Decisions:

- **Official SDKs, imported when an agent runs** (the ``llm`` extra: ``pip install 'ambient[llm]'``). Without one, the
  item ends in an error result saying so; the daemon and the other kinds of agents are unaffected.
- **Anthropic**: the Messages API. The system prompt is one text block marked ``cache_control: ephemeral``: the
  stable prefix (the answer tool, then the agent body and contract) is byte-identical for every item of a fan-out
  over one agent, so the provider's prompt cache serves items 2..N. Structured output is a forced tool ``answer``
  whose input schema is :data:`ambient.runners.prompt.ANSWER_SCHEMA`; a text answer (a model that ignores the tool,
  or a proxy that drops it) still goes through ``final_answer`` (last JSON object, else plain text → RETURN).
  ``temperature``, when set, is sent as an extra body field (the SDK no longer names it).
- **OpenAI**: Chat Completions with ``response_format: json_schema`` (non-strict: ``result`` and ``context`` are open
  objects), a system then a user message. That covers OpenAI and the servers speaking its API at a ``base_url``
  (Ollama, vLLM, llama.cpp server, LM Studio, OpenRouter). OpenAI itself gets ``max_completion_tokens`` and a
  ``prompt_cache_key`` naming the agent; other servers get the older, universal ``max_tokens``.
- **Model**: the runner's ``model:``, else the agent's frontmatter ``model:``; Claude Code's aliases (``opus``,
  ``sonnet``, ``haiku``, ``fable``) become the ids of :data:`ANTHROPIC_ALIASES`. Anthropic without either uses
  ``sonnet``; OpenAI without a model (or with a Claude alias) is an error result, since no default fits every server.
- **Key**: the variable ``api_key_env`` (default ``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY``) of the daemon's
  environment, else the file of that name, lower-cased, in ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``).
  No key is ``provider_refused`` naming both places, except for OpenAI at an explicit ``base_url`` (a local server
  such as Ollama needs none: a placeholder is sent). The key is handed to the SDK only; every text that leaves this
  module (error messages, the watch) has it masked, including the provider's own error messages.
- **Errors**: retries of 429, 5xx and connection failures are the SDK's (``max_retries``, its exponential backoff,
  honouring ``retry-after``). 401/403 are never retried: ``provider_refused``, so the person gets one clear
  escalation instead of a retry storm. Anything else (4xx, still failing after the retries, a timeout, the provider
  unreachable) is ``provider_failed`` with the status and the provider's message, cut to 500 characters. The whole
  call, retries included, is bounded by ``timeout_s``; each attempt too.
- **One client per call**, closed when the call ends, so no connection outlives an item or its event loop. What
  makes a client costly (20-100 ms of CPU: loading the CA certificates into a TLS context) is done once, in a worker
  thread, and the context shared; a client then costs well under a millisecond. The SDK itself is imported in a worker
  thread too (2 s for ``anthropic``), so the first llm agent does not stall the daemon's loop.
- **Usage**: model, tokens (Anthropic's convention: ``input_tokens`` excludes cache reads and writes), ``turns=1``
  and ``cost_usd`` from the runner's ``price:`` or :mod:`ambient.runners.pricing` (None for an unknown model).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambient.core.errors import AmbientError
from ambient.runners.answer import final_answer
from ambient.runners.base import RunRequest, Watch
from ambient.runners.gateway import Grant, ModelGateway, Upstream, metered, upstream_auth
from ambient.runners.keys import DEFAULT_KEY, credential
from ambient.runners.pricing import cost_usd
from ambient.runners.prompt import ANSWER_SCHEMA, AgentPrompt, read_agent_prompt, render_brief, system_prompt
from ambient.runners.result import AgentResult, Usage, error_result
from ambient.runners.runner_config import LlmRunnerConfig

#: Claude Code's model aliases → current Anthropic model ids (the ``aliases`` of the model catalog bundled in Claude
#: Code 2.1.332, first-party API). A full id is sent as written.
ANTHROPIC_ALIASES: dict[str, str] = {
    "opus": "claude-opus-5-5",
    "sonnet": "claude-sonnet-5-5",
    "haiku": "claude-haiku-5-5",
    "fable": "claude-fable-5-2",
}
#: The model of an Anthropic agent that names none.
ANTHROPIC_DEFAULT_MODEL = ANTHROPIC_ALIASES["sonnet"]
DEFAULT_BASE_URL: dict[str, str] = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1"}
BASE_URL_ENV: dict[str, str] = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}
#: Sent as the key to an OpenAI-compatible server at an explicit ``base_url`` when no key is configured.
NO_KEY_PLACEHOLDER = "ambient-no-key"
#: The name of the forced tool that carries an Anthropic answer.
ANSWER_TOOL = "answer"
#: The answer text handed to the watch is cut to this many characters.
MAX_WATCH_CHARS = 4000
#: A provider's error message is cut to this many characters.
MAX_PROVIDER_MESSAGE = 500
INSTALL_HINT = "pip install 'ambient[llm]'"
_MASK = "***"

_ANSWER_TOOL_DESCRIPTION = "Give your final answer to ambient: the JSON object described in your instructions."


class _Refused(Exception):
    """A configuration that cannot make a call (no SDK, no model, no key): becomes the carried result."""

    def __init__(self, result: AgentResult) -> None:
        super().__init__(result.error)
        self.result = result


@dataclass(frozen=True, slots=True)
class _Reply:
    """What one model call gave: the structured answer (if any), the text, why it stopped, the usage."""

    structured: dict[str, Any] | None
    text: str
    stop: str | None
    usage: Usage
    refusal: str | None = None


async def _require_sdk(provider: str) -> None:
    """Import the provider's SDK (the optional ``llm`` extra) in a worker thread the first time; its absence is an
    error result."""
    try:
        if sys.modules.get(provider) is None:
            await asyncio.to_thread(importlib.import_module, provider)
    except ImportError:
        raise _Refused(
            error_result("bad_request", f"the {provider} SDK is not installed, which llm agents need: {INSTALL_HINT}")
        ) from None


def resolve_model(provider: str, configured: str | None, frontmatter: str | None) -> str | None:
    """The model id to send: the runner's ``model:``, else the agent's frontmatter ``model:``, aliases mapped for
    Anthropic (:data:`ANTHROPIC_ALIASES`); Anthropic defaults to ``sonnet``; None for OpenAI without a usable model
    (none given, or only a Claude alias)."""
    model = configured or frontmatter
    if provider == "anthropic":
        return ANTHROPIC_ALIASES.get(model or "sonnet", model or ANTHROPIC_DEFAULT_MODEL)
    if model is None or model in ANTHROPIC_ALIASES:
        return None
    return model


def _mask(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` masked (the exact value; a provider's own partial masks are harmless)."""
    if secret and len(secret) >= 4:
        return text.replace(secret, _MASK)
    return text


def _cut(text: str, limit: int = MAX_PROVIDER_MESSAGE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LlmRunner:
    """Carries out a SPAWN as one model call (see the module docstring). ``environ`` is where keys and base URLs
    are read (default ``os.environ``); ``watch`` receives the answer text as an ``assistant`` turn."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        watch: Watch | None = None,
        gateway: ModelGateway | None = None,
    ) -> None:
        self.environ: Mapping[str, str] = environ if environ is not None else os.environ
        self.watch = watch
        self.gateway = gateway  # the call through it, metered, when started (ambient.runners.gateway)

    async def run(self, req: RunRequest, cfg: LlmRunnerConfig) -> AgentResult:
        """One call for ``req``; never raises for a provider's or the agent's failure; re-raises cancellation."""
        started = time.monotonic()
        key: str | None = None
        grant: Grant | None = None
        try:
            await _require_sdk(cfg.provider)
            prompt = self._prompt(req)
            model = resolve_model(cfg.provider, cfg.model, prompt.model)
            if model is None:
                raise _Refused(self._no_model(req, cfg, prompt))
            base_url = cfg.base_url or self.environ.get(BASE_URL_ENV[cfg.provider]) or None
            key = self._key(cfg, base_url)
            official = base_url is None or base_url.rstrip("/").startswith("https://api.openai.com")
            grant = self._grant(req, cfg, model, base_url, key)
            if grant is not None and self.gateway is not None:  # the SDK talks to the gateway with the grant
                base_url, key = self.gateway.url, grant.token
            system = system_prompt(prompt)
            brief = render_brief(req)
            async with asyncio.timeout(cfg.timeout_s):
                if cfg.provider == "anthropic":
                    reply = await self._anthropic(cfg, model, base_url, key, system, brief)
                else:
                    reply = await self._openai(req, cfg, model, base_url, key, system, brief, official=official)
            result = self._answer(req, cfg, reply, key)
        except asyncio.CancelledError:
            raise
        except _Refused as exc:
            result = exc.result
        except TimeoutError:
            result = error_result(
                "provider_failed", f"provider {cfg.provider} gave no answer within timeout_s={cfg.timeout_s:g}s"
            )
        except Exception as exc:  # noqa: BLE001 - an SDK error or a bug: a result, never a crash of the daemon
            result = self._failure(cfg, exc, key)
        finally:
            if grant is not None and self.gateway is not None:
                await self.gateway.release(grant)
        if grant is not None:
            result = metered(result, grant)
        return replace(result, duration_ms=int((time.monotonic() - started) * 1000))

    def _grant(self, req: RunRequest, cfg: LlmRunnerConfig, model: str, base_url: str | None, key: str) -> Grant | None:
        """The call's key to the model gateway, which holds the real one (None: no gateway started)."""
        if self.gateway is None or not self.gateway.started:
            return None
        real = None if key == NO_KEY_PLACEHOLDER else key
        name = cfg.api_key_env or DEFAULT_KEY[cfg.provider]
        return self.gateway.grant(
            run_id=req.run_id,
            item=req.item,
            attempt=req.attempt,
            agent=req.agent,
            key=req.key,
            upstream=Upstream(
                cfg.provider, base_url or DEFAULT_BASE_URL[cfg.provider], upstream_auth(cfg.provider, name, real)
            ),
            price=cfg.price,
            model=model,
        )

    # ------------------------------------------------------------------------------------------- preparation

    def _prompt(self, req: RunRequest) -> AgentPrompt:
        if req.prompt_file is None:
            return AgentPrompt(body="")
        try:
            return read_agent_prompt(req.prompt_file)
        except (OSError, AmbientError) as exc:
            why = str(exc) if isinstance(exc, AmbientError) else (exc.strerror or str(exc))
            raise _Refused(
                error_result("bad_request", f"cannot read the prompt of agent {req.agent} ({req.prompt_file}): {why}")
            ) from None

    @staticmethod
    def _no_model(req: RunRequest, cfg: LlmRunnerConfig, prompt: AgentPrompt) -> AgentResult:
        if prompt.model in ANTHROPIC_ALIASES:
            why = f"its frontmatter names {prompt.model!r}, a Claude alias, which an openai server does not know"
        else:
            why = "neither its runner nor its frontmatter names a model"
        return error_result(
            "bad_request", f"agent {req.agent} has no model for provider openai: {why}; set model: in its llm runner"
        )

    def _key(self, cfg: LlmRunnerConfig, base_url: str | None) -> str:
        name = cfg.api_key_env or DEFAULT_KEY[cfg.provider]
        key = credential(name, self.environ)
        if key is not None:
            return key
        if cfg.provider == "openai" and base_url:
            return NO_KEY_PLACEHOLDER  # a local server (Ollama, llama.cpp...) asks for no key
        raise _Refused(
            error_result(
                "provider_refused",
                f"no key for provider {cfg.provider}: set {name} in the daemon's environment or put it in "
                f"$CREDENTIALS_DIRECTORY/{name.lower()} (systemd: LoadCredential={name.lower()}:/path/to/key)",
            )
        )

    @staticmethod
    async def _client(provider: str, base_url: str, key: str, cfg: LlmRunnerConfig) -> Any:
        """A new SDK client for one call (close it: ``async with``), on the shared TLS context."""
        ssl_context = await _ssl_context()
        if provider == "anthropic":
            import anthropic

            return anthropic.AsyncAnthropic(
                api_key=key,
                base_url=base_url,
                max_retries=cfg.max_retries,
                timeout=cfg.timeout_s,
                http_client=anthropic.DefaultAsyncHttpxClient(verify=ssl_context),
            )
        import openai

        return openai.AsyncOpenAI(
            api_key=key,
            base_url=base_url,
            max_retries=cfg.max_retries,
            timeout=cfg.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(verify=ssl_context),
        )

    # ------------------------------------------------------------------------------------------ the two calls

    async def _anthropic(
        self, cfg: LlmRunnerConfig, model: str, base_url: str | None, key: str, system: str, brief: str
    ) -> _Reply:
        from anthropic import AsyncAnthropic

        client: AsyncAnthropic = await self._client("anthropic", base_url or DEFAULT_BASE_URL["anthropic"], key, cfg)
        extra: dict[str, Any] | None = {"temperature": cfg.temperature} if cfg.temperature is not None else None
        async with client:
            message = await client.messages.create(
                model=model,
                max_tokens=cfg.max_tokens,
                system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                messages=[{"role": "user", "content": brief}],
                tools=[
                    {
                        "name": ANSWER_TOOL,
                        "description": _ANSWER_TOOL_DESCRIPTION,
                        "input_schema": ANSWER_SCHEMA,
                    }
                ],
                tool_choice={"type": "tool", "name": ANSWER_TOOL},
                extra_body=extra,
            )
        structured: dict[str, Any] | None = None
        texts: list[str] = []
        for block in message.content:
            if block.type == "tool_use" and block.name == ANSWER_TOOL and isinstance(block.input, dict):
                structured = dict(block.input)
            elif block.type == "text":
                texts.append(block.text)
        u = message.usage
        usage = Usage(
            model=message.model or model,
            input_tokens=u.input_tokens or 0,
            output_tokens=u.output_tokens or 0,
            cache_read_tokens=u.cache_read_input_tokens or 0,
            cache_write_tokens=u.cache_creation_input_tokens or 0,
            turns=1,
        )
        stop = str(message.stop_reason) if message.stop_reason is not None else None
        return _Reply(structured, "\n".join(texts), stop, usage)

    async def _openai(
        self,
        req: RunRequest,
        cfg: LlmRunnerConfig,
        model: str,
        base_url: str | None,
        key: str,
        system: str,
        brief: str,
        *,
        official: bool,
    ) -> _Reply:
        from openai import AsyncOpenAI

        client: AsyncOpenAI = await self._client("openai", base_url or DEFAULT_BASE_URL["openai"], key, cfg)
        extra: dict[str, Any] = {}
        if official:
            extra["max_completion_tokens"] = cfg.max_tokens
            extra["prompt_cache_key"] = f"ambient-{req.agent}"
        else:
            extra["max_tokens"] = cfg.max_tokens
        if cfg.temperature is not None:
            extra["temperature"] = cfg.temperature
        async with client:
            completion = await client.chat.completions.create(
                model=model,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": brief}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "agent_answer", "schema": ANSWER_SCHEMA, "strict": False},
                },
                extra_body=extra,
            )
        choice = completion.choices[0] if completion.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        refusal = choice.message.refusal if choice is not None else None
        structured: dict[str, Any] | None = None
        with contextlib.suppress(ValueError, RecursionError):  # a reply nested past the decoder's depth is text
            parsed = json.loads(text) if text.strip().startswith("{") else None
            structured = parsed if isinstance(parsed, dict) else None
        u = completion.usage
        usage = Usage(model=completion.model or model, turns=1)
        if u is not None:
            details = u.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
            written = (details.cache_write_tokens or 0) if details is not None else 0
            usage = replace(
                usage,
                input_tokens=max(0, (u.prompt_tokens or 0) - cached - written),
                output_tokens=u.completion_tokens or 0,
                cache_read_tokens=cached,
                cache_write_tokens=written,
            )
        stop = str(choice.finish_reason) if choice is not None and choice.finish_reason is not None else None
        return _Reply(structured, text, stop, usage, refusal=refusal or None)

    # ------------------------------------------------------------------------------------------- the answer

    def _answer(self, req: RunRequest, cfg: LlmRunnerConfig, reply: _Reply, key: str | None) -> AgentResult:
        usage = replace(reply.usage, cost_usd=cost_usd(reply.usage, cfg.price))
        shown = json.dumps(reply.structured, ensure_ascii=False) if reply.structured else reply.text
        self._tell(req, _mask(shown, key))
        if reply.refusal is not None:
            words = _cut(_mask(reply.refusal, key))
            return error_result("agent_error", f"the model refused to answer: {words}", usage=usage)
        if reply.stop == "refusal":
            return error_result("agent_error", "the model refused to answer (stop_reason refusal)", usage=usage)
        if reply.stop in ("max_tokens", "length"):
            return error_result(
                "bad_output",
                f"the answer was cut at max_tokens={cfg.max_tokens} before it was complete; raise max_tokens",
                usage=usage,
            )
        result = final_answer(reply.structured, reply.text, agent=req.agent)
        return replace(result, usage=usage)

    def _tell(self, req: RunRequest, text: str) -> None:
        if self.watch is None or not text:
            return
        with contextlib.suppress(Exception):  # a watcher's failure never fails the agent
            self.watch(req, "assistant", text[:MAX_WATCH_CHARS])

    # ------------------------------------------------------------------------------------------- failures

    def _failure(self, cfg: LlmRunnerConfig, exc: Exception, key: str | None) -> AgentResult:
        """An exception of the call as a result: a refused key, a provider's error, or an unexpected one."""
        provider = cfg.provider
        status = getattr(exc, "status_code", None)
        message = _mask(_cut(_provider_message(exc)), key)
        if isinstance(status, int) and status in (401, 403):
            name = cfg.api_key_env or DEFAULT_KEY[provider]
            return error_result(
                "provider_refused",
                f"the key for provider {provider} is refused ({status}): check {name} in the daemon's environment "
                f"or $CREDENTIALS_DIRECTORY/{name.lower()}, then retry ({message})",
            )
        if status == 404:
            return error_result(
                "provider_unreachable",
                f"provider {provider} answered 404 at {base_url_of(exc)}: check base_url (its path) and the model name "
                f"({message})",
            )
        if isinstance(status, int):
            retried = status in (408, 409, 429) or status >= 500
            after = f" after {cfg.max_retries} retries" if retried and cfg.max_retries else ""
            return error_result("provider_failed", f"provider {provider} answered {status}{after}: {message}")
        kind = type(exc).__name__
        if kind == "APITimeoutError":
            return error_result(
                "provider_failed",
                f"provider {provider} gave no answer within timeout_s={cfg.timeout_s:g}s ({cfg.max_retries} retries)",
            )
        if kind == "APIConnectionError":
            return error_result(
                "provider_unreachable",
                f"provider {provider} unreachable at {base_url_of(exc)} after {cfg.max_retries} retries: {message}; "
                "check base_url and the network, then retry",
            )
        if _is_sdk_error(exc):
            return error_result("provider_failed", f"provider {provider} call failed ({kind}): {message}")
        return error_result("exception", f"llm runner failed ({kind}): {message}")


_SSL: list[Any] = []  # the shared TLS context, once built


async def _ssl_context() -> Any:
    """The TLS context every client shares: the SDKs' own default (system CA store, ``SSL_CERT_FILE``), built once in
    a worker thread. Two first calls at once may both build one; either is fine."""
    if not _SSL:
        import httpx2  # the HTTP client of both SDKs

        context = await asyncio.to_thread(httpx2.create_ssl_context)
        if not _SSL:
            _SSL.append(context)
    return _SSL[0]


def _provider_message(exc: BaseException) -> str:
    """The provider's own words for an error (``error.message`` of its JSON body), else the exception's text; a
    connection error adds its cause (refused, DNS...)."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text} ({cause})"
    return text


def _is_sdk_error(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("anthropic", "openai", "httpx"))


def base_url_of(exc: BaseException) -> str:
    """The address an SDK error was about (its request's URL without the path's query), for the person."""
    request = getattr(exc, "request", None)
    url = getattr(request, "url", None)
    if url is None:
        return "its base_url"
    text = str(url)
    return text.split("?", 1)[0]
