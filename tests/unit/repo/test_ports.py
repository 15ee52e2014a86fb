"""tests/ports.py: blocks of one run never overlap, sit below the ephemeral range, and are free when handed out."""

import socket

from tests import ports


def test_blocks_do_not_overlap_and_are_free():
    bases = [ports.block(20) for _ in range(30)]
    spans = sorted((base, base + 20) for base in bases)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert all(ports.LOW_PORT <= base and base + 20 <= ports.HIGH_PORT for base in bases)
    for base in bases:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", base))  # still free: nothing of this run took it


def test_a_port_in_use_is_never_handed_out(monkeypatch):
    taken = ports.block(1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        monkeypatch.setattr(ports, "_handed_out", [])  # only the bind check can refuse it now
        held_first = iter([taken, taken])  # the allocator's first two random bases: the held port
        draw = ports._random.randrange
        monkeypatch.setattr(ports._random, "randrange", lambda *bounds: next(held_first, None) or draw(*bounds))
        assert ports.block(1) != taken
