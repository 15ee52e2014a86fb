"""What a running request generated, kept so that another worker can continue it if this one is lost (issue 30).

A request's token ids per choice go to Redis as :class:`~llmq_core.wire.Progress` frames (``constants.progress_key``):
a stream's before each chunk is published (its frames then hold at least the text its caller got), every
``worker.progress_interval_ms`` otherwise, and its key is deleted once its result is out. A continued request starts
with its continuation's ids unwritten, so its first frames restate them for this attempt
(``llmq_core.continuation`` reads only the newest attempt's frames).
"""

from __future__ import annotations

from llmq_core import wire


class Generated:
    """One request's generated token ids per choice index, and how many of each its frames hold."""

    def __init__(self, continuation: wire.Continuation | None = None) -> None:
        self._ids: dict[int, list[int]] = {}
        self._written: dict[int, int] = {}
        self.wrote = False  # a frame went out: the key exists until the result is out
        if continuation is not None:
            for index, ids in enumerate(continuation.token_ids):
                if ids:
                    self._ids[index] = list(ids)

    def add(self, index: int, token_ids: tuple[int, ...] | list[int]) -> None:
        if token_ids:
            self._ids.setdefault(index, []).extend(token_ids)

    @property
    def unwritten(self) -> bool:
        return any(len(ids) > self._written.get(index, 0) for index, ids in self._ids.items())

    def frames(self, attempt: int) -> list[wire.Progress]:
        """The ids no frame holds yet, one frame per choice, counted as written."""
        frames = []
        for index, ids in self._ids.items():
            start = self._written.get(index, 0)
            if len(ids) > start:
                frames.append(wire.Progress(attempt=attempt, index=index, start=start, token_ids=ids[start:]))
                self._written[index] = len(ids)
        self.wrote = self.wrote or bool(frames)
        return frames
