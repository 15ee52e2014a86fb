"""Fakes shared by the API unit tests."""

import asyncio

import msgspec

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


class FakeRedis:
    """In memory, the Redis calls an API pod makes (no expiry). Scripts: the idempotency release compares and deletes;
    the rate limiter's take answers ``take_reply`` ({1, 0, 0}: granted) and records its keys and args in ``takes``,
    its refund in ``gives``."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.data: dict[str, bytes] = {}
        self.hashes: dict[str, dict[bytes, bytes]] = {}
        self.take_reply = [1, 0, 0]
        self.takes: list[tuple[list, list]] = []
        self.gives: list[tuple[list, list]] = []

    async def publish(self, channel: str, data: bytes) -> int:
        self.published.append((channel, data))
        return 0

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    async def set(self, key: str, value: bytes, nx: bool = False, px: int | None = None) -> bool | None:
        if nx and key in self.data:
            return None
        self.data[key] = value
        return True

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        return dict(self.hashes.get(key, {}))

    async def hdel(self, key: str, *fields: bytes) -> int:
        return sum(self.hashes.get(key, {}).pop(f, None) is not None for f in fields)

    def register_script(self, script: str):
        async def run(keys: list, args: list):
            if "cjson" in script:  # release: delete while the claim names this request
                claim = self.data.get(keys[0])
                if claim and msgspec.json.decode(claim)["request_id"] == args[0]:
                    del self.data[keys[0]]
                    return 1
                return 0
            if "amount" in script:  # the rate limiter's refund
                self.gives.append((keys, args))
                return 1
            self.takes.append((keys, args))
            return list(self.take_reply)
        return run
