"""Hidden-state pool pressure with real vLLM + LMCache (LMCache#4824): the KV stays, the hidden
states do not, and the engine is told only the hit every required layer covers. An engine of
its own (its pool is tiny), hsstore's drop-in and LMCache's own store."""

import pytest

import engines
from test_vllm_lmcache import CHUNK, ENTRY_BYTES, GIB, assert_exact, capture, recompute, run


@pytest.mark.parametrize("store", ["hsstore", "lmcache"])
def test_hidden_states_evicted_kv_kept_engine_told_smaller_hit(tiny_model, tokens, store):
    # LMCache#4824 as reproduced with the drop-in: a hidden-state pool with room for 4 (chunk,
    # layer) entries, too small for two layers of A's 4 chunks. Prefill steps of 1024 tokens: A's
    # first step completes all 4 chunks, stored layer by layer.
    hs = capture(store)
    config = engines.lmcache_config(hs_gb=4.5 * ENTRY_BYTES / GIB)
    with engines.engine(tiny_model, hs, lmcache=config, max_num_batched_tokens=1024) as llm:
        prefix = tokens(1024)
        a, b = prefix + tokens(100), prefix + tokens(100)
        run(llm, hs, a)
        states, out, d = run(llm, hs, b)
        told = out.num_cached_tokens
        # LMCache holds all 4 chunks of KV; the engine was told only what every layer covers.
        assert told < 1024 and told % CHUNK == 0
        assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 1024 - told
        assert d["rows_restored"] == told and d["rows_computed"] == len(b) - told
        if store == "hsstore":
            # hsstore never evicts the keys of the prompt it is storing: the final layer's 4
            # chunks fit, the intermediate layer's do not, so no prefix has both.
            assert told == 0
            assert engines.rpc(llm, engines.worker_has_chunks, a, -1) == [True] * 4
            assert engines.rpc(llm, engines.worker_has_chunks, a, 1) == [False] * 4
            assert hs.stats()[0]["store_stats"]["allocation_failures"] >= 1
        assert_exact(states, recompute(llm, hs, b), len(b))
