"""What every Server-Sent Events stream of the edge shares, whatever its dialect: the JSON of a ``data:`` line.

A JSON encoder writes U+2028, U+2029 and U+0085 raw, as JSON allows; but clients that split an event stream by
universal newlines (httpx's ``iter_lines``, Python's ``str.splitlines``) cut an event there and cannot decode either
half. So the edge escapes them in every JSON it streams: in valid UTF-8 their bytes occur only as those characters, and
JSON's structure is ASCII, so each one found is inside a string, where ``\\uXXXX`` means the same character.
"""

from __future__ import annotations

import msgspec

_encode = msgspec.json.encode
# UTF-8 of the line separators JSON leaves raw -> their JSON escapes
_SEPARATORS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def data_json(payload: object) -> bytes:
    """``payload`` as JSON for one ``data:`` line: no byte of it ends a line for any line splitter."""
    data = _encode(payload)
    for raw, escaped in _SEPARATORS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data
