"""Real vLLM + real LMCache: hidden states of a real forward pass, restored plus computed, equal a
full recompute bit for bit, and the engine is never told a prefix hit whose hidden states are not
all there. Each test runs with hsstore's drop-in and, where LMCache's own HiddenStateStore has the
capability, with LMCache's store as the reference."""

import hashlib

import pytest
import torch

import engines
import hsstore.vllm
from conftest import CPU_KV, STEP_TOKENS
from engines import counters, delta, run  # noqa: F401 (the other LMCache tests import them from here)

CHUNK = 256
HIDDEN = engines.TINY["hidden_size"]
ENTRY_BYTES = CHUNK * HIDDEN * 4  # one (chunk, layer) entry, float32
GIB = 1024**3
LAYERS = [-1, 1]  # the final state and an intermediate layer


def capture(store):
    return hsstore.vllm.HiddenStates(layers=LAYERS, store=store, worker_init=CPU_KV)


def recompute(llm, hs, prompt):
    """A full recompute (no prefix hit of any kind, same prefill steps): the reference."""
    states, out, d = run(llm, hs, prompt, skip_prefix_cache=True)
    assert out.num_cached_tokens == 0 and d["rows_restored"] == 0
    assert d["rows_computed"] == len(prompt)
    return states


def assert_exact(states, reference, prompt_len):
    assert set(states) == set(LAYERS)
    for label in LAYERS:
        assert states[label].shape == (prompt_len, HIDDEN)
        assert torch.equal(states[label], reference[label]), label
        assert states[label].abs().mean() > 0.1  # O(1) activations: a wrong row would show


@pytest.fixture(scope="module", params=["hsstore", "lmcache"])
def lmcache_engine(request, tiny_model):
    hs = capture(request.param)
    with engines.engine(tiny_model, hs, lmcache=engines.lmcache_config(),
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        yield llm, hs, request.param


def test_prefix_from_lmcache_equals_full_recompute(lmcache_engine, tokens):
    llm, hs, _ = lmcache_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    states_a, out_a, d_a = run(llm, hs, a)
    assert out_a.num_cached_tokens == 0 and d_a["rows_computed"] == len(a)

    states_b, out_b, d_b = run(llm, hs, b)
    # B's prefix KV came from LMCache, its hidden states from the store: only the tail ran.
    assert out_b.num_cached_tokens == 1024
    assert d_b["rows_restored"] == 1024 and d_b["rows_computed"] == 100
    assert d_b["lookup_hits_capped"] == 0

    assert_exact(states_b, recompute(llm, hs, b), len(b))
    for label in LAYERS:  # control: the prefixes agree, the tails differ
        assert torch.equal(states_a[label][:1024], states_b[label][:1024])
        assert not torch.equal(states_a[label][1024:], states_b[label][1024:])


def test_multi_turn_stores_only_new_rows(lmcache_engine, tokens):
    llm, hs, store = lmcache_engine
    turn1 = tokens(1100)
    _, out1, d1 = run(llm, hs, turn1, max_tokens=60)
    assert d1["rows_computed"] == 1100 and d1["rows_stored"] == 1024  # 4 full chunks
    generated = list(out1.outputs[0].token_ids)
    assert len(generated) == 60
    turn2 = turn1 + generated + tokens(300)  # 1460 tokens: 5 full chunks

    states, out2, d2 = run(llm, hs, turn2)
    # Turn 1's hidden states cover its prompt's 4 chunks: that is the hit, whatever KV LMCache
    # holds beyond it; rows from 1024 on are computed, and only they are stored (token_offset).
    assert out2.num_cached_tokens == 1024
    assert d2["rows_restored"] == 1024 and d2["rows_computed"] == len(turn2) - 1024
    assert d2["rows_stored"] == CHUNK  # chunk [1024, 1280) only
    if store == "hsstore":
        assert d2["chunks_written"] == len(LAYERS)
    assert_exact(states, recompute(llm, hs, turn2), len(turn2))


def test_kv_evicted_drops_orphans_lazily_and_recomputes(lmcache_engine, tokens):
    llm, hs, _ = lmcache_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(50), prefix + tokens(60)
    run(llm, hs, a)
    assert engines.rpc(llm, engines.worker_has_chunks, a, -1) == [True] * 4
    # LMCache evicts the KV of A's first chunk; the hidden states stay until a walk meets them.
    assert engines.rpc(llm, engines.worker_evict_lmcache_kv, a, [0]) == 1
    assert engines.rpc(llm, engines.worker_has_chunks, a, -1) == [True] * 4
    assert engines.rpc(llm, engines.worker_store, "retrieve_hidden_states", a) is None
    assert engines.rpc(llm, engines.worker_has_chunks, a, -1)[0] is False  # dropped by the walk

    states, out, d = run(llm, hs, b)
    assert out.num_cached_tokens == 0  # no KV prefix: the whole prompt is recomputed
    assert d["rows_restored"] == 0 and d["rows_computed"] == len(b)
    assert_exact(states, recompute(llm, hs, b), len(b))


def test_two_layers_required_one_missing_recomputes_uncovered_part(lmcache_engine, tokens):
    llm, hs, _ = lmcache_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    states_a, _, _ = run(llm, hs, a)
    # Chunks 2 and 3 keep the final layer only (dropped, then stored again for -1 alone).
    engines.rpc(llm, engines.worker_keep_only, a, 2, 4, -1, states_a[-1])
    assert engines.rpc(llm, engines.worker_has_chunks, a, -1) == [True] * 4
    assert engines.rpc(llm, engines.worker_has_chunks, a, 1) == [True, True, False, False]

    states, out, d = run(llm, hs, b)
    # All or nothing: the hit ends where one required layer ends, though the other goes on.
    assert out.num_cached_tokens == 512
    assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 512
    assert d["rows_restored"] == 512 and d["rows_computed"] == len(b) - 512
    assert_exact(states, recompute(llm, hs, b), len(b))


def test_cache_salt_keeps_tenants_hidden_states_apart(lmcache_engine, tokens):
    # LMCache's in-process engine keys KV without vLLM's cache_salt: tenant 2 finds tenant 1's
    # KV. hsstore keys hidden states with the salt (hsstore.salt), so that hit is capped at
    # tenant 2's own hidden states: none, a full recompute. LMCache's own store, the reference,
    # keys by tokens only: tenant 2 is served tenant 1's entries.
    llm, hs, store = lmcache_engine
    prefix = tokens(1024)
    a, b, c = prefix + tokens(100), prefix + tokens(100), prefix + tokens(100)
    run(llm, hs, a, cache_salt="tenant-1")

    states, out, d = run(llm, hs, b, cache_salt="tenant-2")
    if store == "lmcache":
        assert out.num_cached_tokens == 1024 and d["rows_restored"] == 1024
        assert_exact(states, recompute(llm, hs, b), len(b))
        return
    assert out.num_cached_tokens == 0
    assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 1024
    assert d["rows_restored"] == 0 and d["rows_computed"] == len(b)
    assert_exact(states, recompute(llm, hs, b), len(b))
    # Each tenant's rows under keys of its own (the recomputes store unsalted ones too).
    assert engines.rpc(llm, engines.worker_salted, a, "tenant-1") == 1024
    assert engines.rpc(llm, engines.worker_salted, b, "tenant-2") == 1024
    assert engines.rpc(llm, engines.worker_salted, c, "tenant-3") == 0

    # Each tenant is now served its own prefix.
    for salt in ("tenant-2", "tenant-1"):
        states, out, d = run(llm, hs, c, cache_salt=salt)
        assert out.num_cached_tokens == 1024 and d["lookup_hits_capped"] == 0
        assert d["rows_restored"] == 1024 and d["rows_computed"] == 100
        assert_exact(states, recompute(llm, hs, c), len(c))
    # Tenant 2's hidden states dropped (its KV and tenant 1's rows stay): tenant 2 is capped and
    # recomputes, never served tenant 1's rows.
    assert engines.rpc(llm, engines.worker_salted, b, "tenant-2", True) == 0
    states, out, d = run(llm, hs, c, cache_salt="tenant-2")
    assert out.num_cached_tokens == 0 and d["lookup_tokens_capped"] == 1024
    assert d["rows_restored"] == 0
    assert_exact(states, recompute(llm, hs, c), len(c))
    # A client cannot claim another tenant's salt through kv_transfer_params: the connector
    # replaces it with the request's own cache_salt before LMCache carries it to the lookup.
    spoof = {"lmcache.hsstore.cache_salt": "tenant-1"}
    states, out, d = run(llm, hs, prefix + tokens(100), cache_salt="tenant-3",
                         kv_transfer_params=spoof)
    assert out.num_cached_tokens == 0 and d["lookup_tokens_capped"] == 1024
    assert d["rows_restored"] == 0
    states, out, d = run(llm, hs, prefix + tokens(100), kv_transfer_params=spoof)  # no salt
    assert out.num_cached_tokens == 1024 and d["rows_restored"] == 1024  # the unsalted rows


def test_a_tagged_request_hits_its_own_hidden_states_and_nobody_else_s(lmcache_engine, tokens):
    # LMCache keys a request's chunks by its "lmcache.tag.*" kv_transfer_params (its KV and its
    # lookup); the capture keys the hidden states with the same tags, so a tagged request is
    # served its own rows, and the untagged namespace, another tag, or a tag that spells a salt
    # never sees them. LMCache's own store keys by tokens only: a tagged request never hits it.
    llm, hs, store = lmcache_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    blue = {"lmcache.tag.tenant": "blue"}
    run(llm, hs, a, kv_transfer_params=blue)
    states, out, d = run(llm, hs, b, kv_transfer_params=blue)
    if store == "lmcache":
        assert out.num_cached_tokens == 0 and d["rows_restored"] == 0
        assert_exact(states, recompute(llm, hs, b), len(b))
        return
    assert out.num_cached_tokens == 1024 and d["lookup_hits_capped"] == 0
    assert d["rows_restored"] == 1024 and d["rows_computed"] == 100
    # The rows are under blue's keys only (checked before any untagged recompute stores some).
    assert engines.rpc(llm, engines.worker_tagged, a, blue) == 1024
    assert engines.rpc(llm, engines.worker_tagged, a, {}) == 0
    assert engines.rpc(llm, engines.worker_tagged, a, {"lmcache.tag.tenant": "red"}) == 0
    digest = hashlib.sha256(b"tenant-1").hexdigest()[:32]  # the old fold's salt spelling
    assert engines.rpc(llm, engines.worker_salted, a, "tenant-1") == 0
    run(llm, hs, a, kv_transfer_params={"lmcache.tag.salt": digest})
    assert engines.rpc(llm, engines.worker_salted, a, "tenant-1") == 0
    # Another tag: no hit (its KV is apart too), and blue is still served its own.
    states, out, d = run(llm, hs, b, kv_transfer_params={"lmcache.tag.tenant": "red"})
    assert out.num_cached_tokens == 0 and d["rows_restored"] == 0
    assert_exact(states, recompute(llm, hs, b), len(b))
    states, out, d = run(llm, hs, b, kv_transfer_params=blue)
    assert out.num_cached_tokens == 1024 and d["rows_restored"] == 1024
    assert_exact(states, recompute(llm, hs, b), len(b))
