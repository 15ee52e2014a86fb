"""The batch-time model of ``llmq capacity`` and ``llmq simulate``: a fixed part plus prefill per uncached prompt token.

A batch of requests takes ``fixed_ms + prefill_ms_per_token * (the uncached prompt tokens of its requests)``. A request
has ``prompt_tokens``; with probability ``prefix_hit_rate`` its first ``prefix_tokens`` (a shared header) are already
in the worker's prefix cache and cost nothing. ``prompt_tokens = 0`` is the fixed-time engine of seed 003 (any batch
takes ``fixed_ms``), the default of both commands.

The default prefill cost is derived, not measured: a forward pass costs about 2 x parameters FLOPs per prompt token
(attention's share left out), for a 7B-parameter code model on one H100 SXM (989.5 TFLOP/s dense BF16, NVIDIA's
datasheet) at an assumed 50% of that peak during prefill: 2 * 7e9 / (989.5e12 * 0.5) s = 0.0283 ms per token. Pass
``--prefill-ms-per-token`` with your engine's figure.
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE_MODEL_PARAMS = 7e9  # a 7B-parameter code model
REFERENCE_PEAK_FLOPS = 989.5e12  # H100 SXM, dense BF16 tensor FLOP/s (NVIDIA's datasheet)
REFERENCE_PREFILL_UTILISATION = 0.5  # share of that peak a prefill reaches: an assumption, not a measurement
DEFAULT_PREFILL_MS_PER_TOKEN = round(
    2 * REFERENCE_MODEL_PARAMS / (REFERENCE_PEAK_FLOPS * REFERENCE_PREFILL_UTILISATION) * 1000, 4
)
PREFILL_SOURCE = "derived: 2 x 7e9 FLOPs per prompt token on an H100 SXM (989.5 TFLOP/s dense BF16, NVIDIA) at an assumed 50% of peak"


@dataclass(frozen=True)
class BatchTimeModel:
    """``fixed_ms``: a batch's time apart from prefill (ms); ``prefill_ms_per_token``: ms per uncached prompt token;
    ``prompt_tokens``: tokens per request's prompt (0: fixed-time mode); ``prefix_tokens``: the shared header's
    tokens among them; ``prefix_hit_rate``: share of requests (0..1) whose header the worker holds cached."""

    fixed_ms: float = 250
    prefill_ms_per_token: float = DEFAULT_PREFILL_MS_PER_TOKEN
    prompt_tokens: int = 0
    prefix_tokens: int = 0
    prefix_hit_rate: float = 0.0

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why these settings make no model (a sentence naming the flag), or None."""
        if self.fixed_ms <= 0:
            return f"the batch time must be > 0 ms, not {self.fixed_ms:g}"
        if self.prefill_ms_per_token < 0:
            return f"--prefill-ms-per-token must be >= 0, not {self.prefill_ms_per_token:g}"
        if self.prompt_tokens < 0 or self.prefix_tokens < 0:
            return "--prompt-tokens and --prefix-tokens must be >= 0"
        if self.prefix_tokens > self.prompt_tokens:
            return f"--prefix-tokens ({self.prefix_tokens}) is part of the prompt: at most --prompt-tokens"
        if not 0 <= self.prefix_hit_rate <= 1:
            return f"--prefix-hit-rate is a share, 0..1, not {self.prefix_hit_rate:g}"
        if self.prefix_hit_rate and not self.prefix_tokens:
            return "--prefix-hit-rate needs --prefix-tokens (the header a hit saves)"
        return None

    @property
    def fixed(self) -> bool:
        """True when a batch's time does not depend on its prompts (seed 003's engine)."""
        return self.prompt_tokens == 0 or self.prefill_ms_per_token == 0

    def uncached_tokens(self, hit: bool) -> int:
        """Prompt tokens one request's prefill computes: all of them, less the header on a cache hit."""
        return self.prompt_tokens - (self.prefix_tokens if hit else 0)

    @property
    def mean_uncached_tokens(self) -> float:
        """Expected uncached prompt tokens per request."""
        return self.prompt_tokens - self.prefix_hit_rate * self.prefix_tokens

    def batch_ms(self, uncached_tokens: float) -> float:
        """Time (ms) of a batch whose requests hold ``uncached_tokens`` uncached prompt tokens together."""
        return self.fixed_ms + (0.0 if self.fixed else self.prefill_ms_per_token * uncached_tokens)

    def expected_batch_ms(self, requests: float) -> float:
        """Expected time (ms) of a batch of ``requests`` requests."""
        return self.batch_ms(requests * self.mean_uncached_tokens)

    def describe(self) -> dict:
        """The model as plain data, with where its prefill figure comes from."""
        out = {"fixed_ms": self.fixed_ms, "mode": "fixed" if self.fixed else "prefill"}
        if not self.fixed:
            out |= {
                "prefill_ms_per_token": self.prefill_ms_per_token,
                "prefill_source": PREFILL_SOURCE
                if self.prefill_ms_per_token == DEFAULT_PREFILL_MS_PER_TOKEN
                else "given",
                "prompt_tokens": self.prompt_tokens,
                "prefix_tokens": self.prefix_tokens,
                "prefix_hit_rate": self.prefix_hit_rate,
                "mean_uncached_tokens": self.mean_uncached_tokens,
            }
        return out
