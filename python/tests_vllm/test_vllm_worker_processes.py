"""Worker processes: vLLM's default multiprocess mode (the engine core in a child process) with
LMCache, and workers apart from the scheduler (executor "mp") without it, where only the worker
can see missing hidden states and has vLLM recompute them."""

import pytest

import engines
import hsstore.vllm
from conftest import CPU_KV, STEP_TOKENS
from test_vllm_prefix_cache import LAYERS, assert_exact, run


def test_worker_process_without_lmcache_recomputes_what_the_scheduler_cannot_see(tiny_model,
                                                                                 tokens):
    # Workers in their own processes (executor "mp"): the scheduler cannot ask the store, so a
    # locally cached prefix whose hidden states are gone is found by the worker, reported as
    # invalid blocks, and recomputed by vLLM (kv_load_failure_policy="recompute").
    hs = hsstore.vllm.HiddenStates(layers=LAYERS, lmcache=False)
    with engines.engine(tiny_model, hs, prefix_caching=True, multiprocess=True, executor="mp",
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        prefix = tokens(1024)
        a, b = prefix + tokens(40), prefix + tokens(90)
        run(llm, hs, a)
        # The hidden states of the chunk (= vLLM block) at token 256 are gone.
        assert engines.rpc(llm, engines.worker_drop_engine_chunk, a, 256 // engines.block_size(llm))
        states, _, d = run(llm, hs, b)
        assert d["recomputes"] == 1 and d["rows_restored"] == 256
        assert d["rows_computed"] == len(b) - 256
        assert_exact(llm, hs, b, states)


@pytest.mark.parametrize("store", ["hsstore", "lmcache"])
def test_worker_processes_prefix_from_lmcache(tiny_model, tokens, store):
    # vLLM's default: the engine core (scheduler and worker) in a child process.
    hs = hsstore.vllm.HiddenStates(layers=LAYERS, store=store, worker_init=CPU_KV)
    with engines.engine(tiny_model, hs, lmcache=engines.lmcache_config(), multiprocess=True,
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        prefix = tokens(1024)
        a, b = prefix + tokens(100), prefix + tokens(100)
        run(llm, hs, a)
        states, out, d = run(llm, hs, b)
        assert out.num_cached_tokens == 1024
        assert d["rows_restored"] == 1024 and d["rows_computed"] == 100
        assert_exact(llm, hs, b, states)
