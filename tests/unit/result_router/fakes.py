"""Fakes shared by the result-router's unit tests."""

from __future__ import annotations


class FakeRedis:
    """The few Redis calls the router's delivery path makes, in a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def set(self, key, value, px=None, nx=False):
        if nx and key in self.data:
            return None
        self.data[key] = value
        return True

    async def exists(self, key):
        return int(key in self.data)

    def register_script(self, script):
        async def put(keys, args):  # ResultStore's script, as far as these tests need it: SET NX of the result
            return [int(bool(await self.set(keys[0], args[0], nx=True))), 0]
        return put
