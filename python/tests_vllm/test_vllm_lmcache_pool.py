"""Hidden-state pool pressure with real vLLM + LMCache (LMCache#4824): the KV stays, the hidden
states do not, and the engine is told only the hit every required layer covers. An engine of
its own (its pool is tiny), hsstore's drop-in and LMCache's own store."""

import pytest

import engines
from test_vllm_lmcache import CHUNK, ENTRY_BYTES, GIB, assert_exact, capture, recompute, run

# A hidden-state pool with room for 4 (chunk, layer) entries: too small for two layers of a
# 4-chunk prompt. Engines with it prefill in steps of 1024 tokens (PRESSURE_STEP_TOKENS): the
# prompt's first step completes all 4 chunks, stored layer by layer.
PRESSURE_POOL_GB = 4.5 * ENTRY_BYTES / GIB
PRESSURE_STEP_TOKENS = 1024


def run_past_a_full_pool(llm, hs, tokens):
    """A (4 chunks + a tail) through the full pool, then B sharing A's 4 chunks: B is told only
    the chunk-aligned hit every layer covers (< 1024, counted as capped), restores exactly that,
    computes the rest, and its whole prompt equals a recompute. Returns (A, told, B's deltas)."""
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    run(llm, hs, a)
    states, out, d = run(llm, hs, b)
    told = out.num_cached_tokens
    assert told < 1024 and told % CHUNK == 0
    assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 1024 - told
    assert d["rows_restored"] == told and d["rows_computed"] == len(b) - told
    assert_exact(states, recompute(llm, hs, b), len(b))
    return a, told, d


@pytest.mark.parametrize("store", ["hsstore", "lmcache"])
def test_hidden_states_evicted_kv_kept_engine_told_smaller_hit(tiny_model, tokens, store):
    # LMCache#4824 as reproduced with the drop-in; LMCache holds all 4 chunks of KV.
    hs = capture(store)
    config = engines.lmcache_config(hs_gb=PRESSURE_POOL_GB)
    with engines.engine(tiny_model, hs, lmcache=config,
                        max_num_batched_tokens=PRESSURE_STEP_TOKENS) as llm:
        a, told, _ = run_past_a_full_pool(llm, hs, tokens)
        if store == "hsstore":
            # hsstore never evicts the keys of the prompt it is storing: the final layer's 4
            # chunks fit, the intermediate layer's do not, so no prefix has both.
            assert told == 0
            assert engines.rpc(llm, engines.worker_has_chunks, a, -1) == [True] * 4
            assert engines.rpc(llm, engines.worker_has_chunks, a, 1) == [False] * 4
            assert hs.stats()[0]["store_stats"]["allocation_failures"] >= 1
