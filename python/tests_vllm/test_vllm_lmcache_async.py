"""LMCache's async lookup path (``enable_async_loading``) with real vLLM + LMCache: the scheduler's
LMCacheAsyncLookupClient answers None ("not yet") until the worker's prefetch responds, and the
hit it then reports is still min(KV hit, hidden-state coverage of every required layer). Under
hidden-state pool pressure, as test_vllm_lmcache_pool.py for the synchronous path."""

import pytest

import engines
from test_vllm_lmcache import CHUNK, ENTRY_BYTES, GIB, assert_exact, capture, recompute, run


def async_config(**extra):
    return engines.lmcache_config(enable_async_loading=True, **extra)


@pytest.mark.parametrize("store", ["hsstore", "lmcache"])
def test_async_lookup_hidden_states_evicted_kv_kept_engine_told_smaller_hit(tiny_model, tokens,
                                                                          store):
    # A hidden-state pool with room for 4 (chunk, layer) entries, too small for two layers of
    # A's 4 chunks (test_vllm_lmcache_pool.py has the arithmetic). The KV of all 4 stays.
    hs = capture(store)
    config = async_config(hs_gb=4.5 * ENTRY_BYTES / GIB)
    with engines.engine(tiny_model, hs, lmcache=config, max_num_batched_tokens=1024) as llm:
        prefix = tokens(1024)
        a, b = prefix + tokens(100), prefix + tokens(100)
        _, out_a, d_a = run(llm, hs, a)
        assert out_a.num_cached_tokens == 0
        assert d_a["async_lookups"] >= 1 and d_a["lookups"] == d_a["async_lookups"]
        states, out, d = run(llm, hs, b)
        told = out.num_cached_tokens
        # The async lookup answered (it is the only lookup that ran) and was capped: the engine
        # was told only what every layer covers, though LMCache prefetched all 4 chunks of KV.
        assert d["async_lookups"] >= 1 and d["lookups"] == d["async_lookups"]
        assert told < 1024 and told % CHUNK == 0
        assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 1024 - told
        assert d["rows_restored"] == told and d["rows_computed"] == len(b) - told
        assert d["recomputes"] == 0  # nothing found missing at restore: the cap did the work
        if store == "hsstore":
            assert told == 0
            assert engines.rpc(llm, engines.worker_has_chunks, a, -1) == [True] * 4
            assert engines.rpc(llm, engines.worker_has_chunks, a, 1) == [False] * 4
        assert_exact(states, recompute(llm, hs, b), len(b))


def test_async_lookup_full_coverage_is_not_capped(tiny_model, tokens):
    # Control: with room for every layer, the async hit is LMCache's whole KV hit, restored.
    hs = capture("hsstore")
    with engines.engine(tiny_model, hs, lmcache=async_config(),
                        max_num_batched_tokens=256) as llm:
        prefix = tokens(1024)
        a, b = prefix + tokens(100), prefix + tokens(100)
        run(llm, hs, a)
        states, out, d = run(llm, hs, b)
        assert out.num_cached_tokens == 1024
        assert d["async_lookups"] >= 1 and d["lookup_hits_capped"] == 0
        assert d["rows_restored"] == 1024 and d["rows_computed"] == 100
        assert_exact(states, recompute(llm, hs, b), len(b))
