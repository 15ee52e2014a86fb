"""Fakes shared by the API unit tests."""

import asyncio

from llmq_core import wire


def final(request_id: str, text: str = "hello", outcome: wire.Outcome = wire.Outcome.SUCCEEDED,
          error: wire.ErrorInfo | None = None, finish_reason: str = "length") -> wire.FinalResult:
    return wire.FinalResult(request_id=request_id, outcome=outcome, model="llmq-sim",
                            reply_to=wire.HttpReply(instance_id="pod"), error=error,
                            choices=[wire.Choice(index=0, text=text, finish_reason=finish_reason)],
                            usage=wire.Usage(prompt_tokens=3, completion_tokens=len(text), total_tokens=3 + len(text)))


def chunk(request_id: str, text: str, seq: int, index: int = 0) -> wire.TokenChunk:
    return wire.TokenChunk(request_id=request_id, index=index, text=text, seq=seq, sent_ms=0)


class CancelRecorder:
    """A CancelPublisher that records (request_id, reason)."""

    def __init__(self) -> None:
        self.cancels: list[tuple[str, str]] = []

    async def __call__(self, request_id: str, reason: str) -> None:
        self.cancels.append((request_id, reason))


class Trigger:
    """An awaitable the test fires by hand (stands in for a deadline timer or a disconnect)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
