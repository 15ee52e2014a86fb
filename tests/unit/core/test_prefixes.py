"""The prefix chain: shared bytes give shared leading hashes, and the salt keeps models, tools and tenants apart."""

import pytest

from llmq_core import prefixes, wire
from llmq_core.constants import PREFIX_BLOCK_BYTES, PREFIX_MAX_BLOCKS


def _request(prompt=None, messages=None, tenant="acme", model="m", tools=None) -> wire.GenerationRequest:
    return wire.GenerationRequest(
        request_id="r",
        tenant_id=tenant,
        model=model,
        endpoint="completions" if messages is None else "chat.completions",
        prompt=prompt,
        messages=messages,
        tools=tools,
        created_ms=0,
        deadline_ms=1,
        reply_to=wire.HttpReply(instance_id="pod"),
    )


HEADER = "".join(f"line {i}: import module_{i}\n" for i in range(60))  # about 1.4 KB


def test_prompts_sharing_a_header_share_exactly_its_whole_blocks():
    a = prefixes.request_chain(_request(HEADER + "def f():"))
    b = prefixes.request_chain(_request(HEADER + "class G:"))
    shared = len(HEADER) // PREFIX_BLOCK_BYTES
    assert a[:shared] == b[:shared]
    assert prefixes.matched_blocks(b, set(a)) == shared


def test_only_whole_blocks_are_hashed_and_the_chain_is_bounded():
    assert prefixes.request_chain(_request("x" * (PREFIX_BLOCK_BYTES - 1))) == ()
    assert len(prefixes.request_chain(_request("x" * (3 * PREFIX_BLOCK_BYTES + 5)))) == 3
    assert (
        len(prefixes.request_chain(_request("x" * PREFIX_BLOCK_BYTES * (PREFIX_MAX_BLOCKS + 9)))) == PREFIX_MAX_BLOCKS
    )


def test_a_block_hash_depends_on_every_byte_before_it():
    a = prefixes.request_chain(_request("a" + HEADER))
    b = prefixes.request_chain(_request("b" + HEADER))
    assert set(a).isdisjoint(b)  # the same later bytes, a different first byte: no block matches


def test_tenant_scope_separates_tenants_and_shared_scope_joins_them():
    acme, rival = _request(HEADER, tenant="acme"), _request(HEADER, tenant="rival")
    assert set(prefixes.request_chain(acme)).isdisjoint(prefixes.request_chain(rival))
    assert prefixes.request_chain(acme, tenant_scoped=False) == prefixes.request_chain(rival, tenant_scoped=False)


def test_models_and_tools_salt_the_chain():
    plain = prefixes.request_chain(_request(HEADER))
    assert set(plain).isdisjoint(prefixes.request_chain(_request(HEADER, model="other")))
    tools = [wire.Tool(name="lookup", parameters='{"type":"object"}')]
    assert set(plain).isdisjoint(prefixes.request_chain(_request(HEADER, tools=tools)))


def test_chat_turns_are_identified_by_role_and_content_in_order():
    system = wire.ChatMessage(role="system", content=HEADER)
    one = _request(messages=[system, wire.ChatMessage(role="user", content="fix the bug")])
    two = _request(messages=[system, wire.ChatMessage(role="user", content="add a test")])
    swapped = _request(messages=[wire.ChatMessage(role="user", content=HEADER)])
    shared = len(HEADER) // PREFIX_BLOCK_BYTES
    assert prefixes.matched_blocks(prefixes.request_chain(two), set(prefixes.request_chain(one))) >= shared
    assert prefixes.matched_blocks(prefixes.request_chain(swapped), set(prefixes.request_chain(one))) == 0


def test_hashes_fit_the_wire_and_a_summary_round_trips():
    blocks = list(prefixes.request_chain(_request(HEADER)))
    summary = wire.PrefixSummary(worker_id="w", model="m", block_bytes=PREFIX_BLOCK_BYTES, blocks=blocks, sent_ms=5)
    assert wire.decode(wire.encode(summary)) == summary
    assert all(-(2**63) <= h < 2**63 for h in blocks)


def test_a_block_size_below_one_is_refused():
    with pytest.raises(ValueError, match="block_bytes"):
        prefixes.chain(b"abc", b"salt", block_bytes=0)
