"""The FinalResult a fake worker answers: shared by the tests that stand in for workers."""

from __future__ import annotations

from llmq_core import wire


def fake_result(
    request: wire.GenerationRequest, outcome: wire.Outcome = wire.Outcome.SUCCEEDED, text: str = "", **fields
) -> wire.FinalResult:
    """``request``'s result: ``text`` as its one choice (none when errored), usage counting one token per character;
    ``fields``: the rest (error, finished_ms, worker_id, ...)."""
    choices = [] if outcome is wire.Outcome.ERRORED else [wire.Choice(index=0, text=text, finish_reason="length")]
    fields.setdefault("finished_ms", 0)
    return wire.FinalResult.for_request(
        request, outcome, choices=choices, usage=wire.Usage.of(request.prompt_tokens, len(text)), **fields
    )
