"""What a model call cost: a built-in price table of Anthropic and OpenAI models, and the cost of a usage. Pure.

Figures are US dollars per million tokens. Token counts follow Anthropic's convention, which :class:`ambient.runners.
result.Usage` carries for every provider: ``input_tokens`` are the prompt tokens read neither from nor into the cache,
``cache_read_tokens`` and ``cache_write_tokens`` the others (an OpenAI usage, whose ``prompt_tokens`` include its
cached ones, is split that way by the runner).

Where the prices come from:

- Anthropic: the model catalog baked into Claude Code 2.1.332 (the CLI bundled with claude-agent-sdk 0.2.189, which
  computes its own ``total_cost_usd`` from it): base input, output, 5-minute cache write (the ``ephemeral`` TTL
  ambient asks for) and cache read, plus Haiku 5.5's dearer tier for prompts over 100,000 tokens.
- OpenAI: OpenAI's published standard (not Batch/Flex/priority) rates as reported, with their dates, in public
  pricing notes of September to November 2026 (GPT-6 Astra, GPT-6 Sol/Luna, GPT-6.1 Sol/Terra, GPT-6.2 Astra/Sol,
  the July 2026 GPT-5.6 Terra/Luna cut) and OpenAI's earlier pricing page (GPT-5.5, 5.4, 5, 4.1). Cache writes are
  billed 1.25x input since GPT-5.6 and not at all before. Prompts over 272,000 input tokens cost 2x input and cache
  and 1.5x output for the whole request on the GPT-6 and 5.6 families.

A model outside the table has ``cost_usd=None`` (unknown, never a guess) unless its runner sets ``price:``; a
``price:`` without cache figures bills cache reads at 0.1x and writes at 1.25x its input price (both providers'
current multipliers). Prices change: a ``price:`` always wins over the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ambient.runners.result import Usage
from ambient.runners.runner_config import Price

MTOK = 1_000_000
#: Cache multipliers of the input price for a ``price:`` that gives no cache figures.
CACHE_READ_MULTIPLIER = 0.1
CACHE_WRITE_MULTIPLIER = 1.25


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens for one model; ``long`` applies to the whole request when its prompt (uncached, cache
    read and cache write tokens together) is over ``long_above`` tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    long_above: int | None = None
    long: ModelPrice | None = None

    @classmethod
    def of(cls, price: Price) -> ModelPrice:
        """A runner's ``price:``; missing cache figures follow :data:`CACHE_READ_MULTIPLIER` / ``..._WRITE_...``."""
        return cls(
            input=price.input,
            output=price.output,
            cache_read=price.cache_read if price.cache_read is not None else price.input * CACHE_READ_MULTIPLIER,
            cache_write=price.cache_write if price.cache_write is not None else price.input * CACHE_WRITE_MULTIPLIER,
        )


def _anthropic(input_: float, output: float, cache_read: float | None = None) -> ModelPrice:
    """Anthropic's shape: cache writes (5 minutes) 1.25x input, reads 0.1x unless the catalog says otherwise."""
    return ModelPrice(input_, output, input_ / 10 if cache_read is None else cache_read, input_ * 1.25)


_OPENAI_LONG_ABOVE = 272_000


def _openai(input_: float, cached: float, output: float, *, writes: bool = True, long: bool = True) -> ModelPrice:
    """OpenAI's shape: cache writes 1.25x input (GPT-5.6 on; before, a write is plain input), the 272K tier."""
    base = ModelPrice(input_, output, cached, input_ * 1.25 if writes else input_)
    if not long:
        return base
    doubled = ModelPrice(base.input * 2, base.output * 1.5, base.cache_read * 2, base.cache_write * 2)
    return replace(base, long_above=_OPENAI_LONG_ABOVE, long=doubled)


_HAIKU_55 = ModelPrice(0.1, 0.5, 0.01, 0.125, long_above=100_000, long=ModelPrice(0.5, 2.5, 0.05, 0.625))

#: Built-in prices by model id (see the module docstring for sources). Dated ids resolve through :func:`model_price`.
PRICES: dict[str, ModelPrice] = {
    # Anthropic (Claude Code 2.1.332 catalog)
    "claude-opus-5-5": _anthropic(4, 20, 0.2),
    "claude-opus-5": _anthropic(5, 25),
    "claude-opus-4-8": _anthropic(5, 25),
    "claude-opus-4-7": _anthropic(5, 25),
    "claude-opus-4-6": _anthropic(5, 25),
    "claude-opus-4-5": _anthropic(5, 25),
    "claude-opus-4-1": _anthropic(15, 75),
    "claude-opus-4-0": _anthropic(15, 75),
    "claude-opus-4": _anthropic(15, 75),
    "claude-sonnet-5-5": _anthropic(2, 10, 0.1),
    "claude-sonnet-5": _anthropic(2, 10),
    "claude-sonnet-4-6": _anthropic(3, 15),
    "claude-sonnet-4-5": _anthropic(3, 15),
    "claude-sonnet-4-0": _anthropic(3, 15),
    "claude-sonnet-4": _anthropic(3, 15),
    "claude-3-7-sonnet": _anthropic(3, 15),
    "claude-3-5-sonnet": _anthropic(3, 15),
    "claude-haiku-5-5": _HAIKU_55,
    "claude-haiku-4-5": _anthropic(1, 5),
    "claude-3-5-haiku": _anthropic(0.8, 4),
    "claude-fable-5-2": _anthropic(8, 40, 0.2),
    "claude-fable-5-1": _anthropic(10, 50, 0.25),
    "claude-fable-5": _anthropic(10, 50),
    "claude-mythos-5-2": _anthropic(8, 40, 0.2),
    "claude-mythos-5-1": _anthropic(10, 50, 0.25),
    "claude-mythos-5": _anthropic(10, 50),
    # OpenAI (standard tier)
    "gpt-6.2-astra": _openai(8, 0.4, 40),
    "gpt-6.2-sol": _openai(2, 0.1, 10),
    "gpt-6.1-sol": _openai(2, 0.1, 10),
    "gpt-6.1-terra": _openai(1, 0.05, 5),
    "gpt-6-astra": _openai(10, 1, 50),
    "gpt-6-sol": _openai(2, 0.2, 10),
    "gpt-6-luna": _openai(0.1, 0.01, 0.5),
    "gpt-5.6-terra": _openai(2, 0.2, 12),
    "gpt-5.6-luna": _openai(0.2, 0.02, 1.2),
    "gpt-5.5": _openai(5, 0.5, 30, writes=False, long=False),
    "gpt-5.4": _openai(2.5, 0.25, 15, writes=False, long=False),
    "gpt-5.4-mini": _openai(0.75, 0.075, 4.5, writes=False, long=False),
    "gpt-5": _openai(1.25, 0.125, 10, writes=False, long=False),
    "gpt-5-mini": _openai(0.25, 0.025, 2, writes=False, long=False),
    "gpt-5-nano": _openai(0.05, 0.005, 0.4, writes=False, long=False),
    "gpt-4.1": _openai(2, 0.5, 8, writes=False, long=False),
    "gpt-4.1-mini": _openai(0.4, 0.1, 1.6, writes=False, long=False),
    "gpt-4.1-nano": _openai(0.1, 0.025, 0.4, writes=False, long=False),
}

# A dated snapshot: claude-haiku-4-5-20251001, claude-sonnet-4-20250514, gpt-4.1-2025-04-14.
_DATED = re.compile(r"^(?P<base>.+?)-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


def model_price(model: str | None) -> ModelPrice | None:
    """The built-in price of ``model`` (exact id, else without its date suffix), or None."""
    if not model:
        return None
    found = PRICES.get(model)
    if found is not None:
        return found
    dated = _DATED.match(model)
    return PRICES.get(dated.group("base")) if dated else None


def cost_usd(usage: Usage, price: Price | ModelPrice | None = None) -> float | None:
    """What ``usage`` cost: at ``price`` (a runner's ``price:``) if given, else at the built-in price of
    ``usage.model``; None when neither is known."""
    table = ModelPrice.of(price) if isinstance(price, Price) else price
    if table is None:
        table = model_price(usage.model)
    if table is None:
        return None
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    if table.long is not None and table.long_above is not None and prompt > table.long_above:
        table = table.long
    total = (
        usage.input_tokens * table.input
        + usage.output_tokens * table.output
        + usage.cache_read_tokens * table.cache_read
        + usage.cache_write_tokens * table.cache_write
    )
    return round(total / MTOK, 8)
