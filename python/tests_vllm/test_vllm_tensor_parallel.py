"""Tensor parallelism (issue 33 §1): tensor_parallel_size=2 on vLLM CPU, two worker processes of
vLLM's multiprocessing executor, KV in LMCache's in-process engine (one per rank, each holding its
rank's KV shard). Every rank holds the whole hidden state after the all-reduce, so rank 0 keeps
the one copy: it alone has a store, a pool and a capture; the other rank's LMCache engine builds
no hidden-state store. LMCache's scheduler asks every rank's lookup and takes the least: rank 1
answers its KV hit, rank 0 caps its own at the hidden-state coverage, so every rank skips the
same prefix, and a prefill rank 0 cannot restore is computed by both ranks."""

import os

import pytest
import torch

import engines
import hsstore.vllm
from conftest import CPU_KV, STEP_TOKENS
from test_vllm_lmcache import CHUNK, HIDDEN, LAYERS, assert_exact, run

def worker_rank_state(worker, engine_id):
    """What a rank holds: its TP rank, whether it has a store and a capture, whether its LMCache
    engine built a hidden-state store, and what its store holds."""
    from hsstore.vllm.connector import worker_connector
    from lmcache.integration.vllm.utils import ENGINE_NAME
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    hs = worker_connector(engine_id)
    engine = LMCacheEngineBuilder.get(ENGINE_NAME)
    held = hs.store.stats() if hs.store is not None else {}
    return {"rank": hs.rank, "store": hs.store is not None, "capture": hs.capture is not None,
            "lmcache_store": engine.hidden_state_store is not None,
            "keys_held": held.get("keys_held"), "bytes_held": held.get("bytes_held")}


def ranks(llm):
    engine_id = llm.llm_engine.vllm_config.kv_transfer_config.engine_id
    return llm.collective_rpc(worker_rank_state, args=(engine_id,))


def recompute(llm, hs, prompt):
    """The same prompt with no prefix hit of any kind, on the same two ranks: the reference."""
    states, out, d = run(llm, hs, prompt, skip_prefix_cache=True)
    assert out.num_cached_tokens == 0 and d["rows_computed"] == len(prompt)
    return states


@pytest.fixture(scope="module")
def tp2_engine(tiny_model):
    # vLLM CPU binds each rank's OpenMP threads to a NUMA node of its own ("auto"); this machine
    # has one node, so each rank gets one core by hand (its first and second CPU).
    previous = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    cpus = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{cpus[0]}|{cpus[-1]}"
    hs = hsstore.vllm.HiddenStates(layers=LAYERS, worker_init=CPU_KV)
    try:
        with engines.engine(tiny_model, hs, lmcache=engines.lmcache_config(), multiprocess=True,
                            executor="mp", tensor_parallel_size=2,
                            max_num_batched_tokens=STEP_TOKENS) as llm:
            yield llm, hs
    finally:
        if previous is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = previous


def test_tp2_prefix_restored_by_rank_0_equals_a_tp2_recompute_one_copy_kept(tp2_engine, tokens):
    llm, hs = tp2_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    _, out, d = run(llm, hs, a)
    assert out.num_cached_tokens == 0 and d["rows_computed"] == len(a)

    states, out, d = run(llm, hs, b)
    # Both ranks skipped the prefix (its KV from each rank's LMCache), rank 0 restored its rows.
    assert out.num_cached_tokens == 1024
    assert d["rows_restored"] == 1024 and d["rows_computed"] == 100
    assert d["lookup_hits_capped"] == 0
    assert_exact(states, recompute(llm, hs, b), len(b))

    # One copy: rank 0's store holds the prefix's 4 chunks of both layers; rank 1 has none.
    rank0, rank1 = ranks(llm)
    assert rank0["rank"] == 0 and rank0["store"] and rank0["capture"] and rank0["lmcache_store"]
    assert rank0["keys_held"] == 1024 // CHUNK
    assert rank0["bytes_held"] == (1024 // CHUNK) * len(LAYERS) * CHUNK * HIDDEN * 4
    assert rank1 == {"rank": 1, "store": False, "capture": False, "lmcache_store": False,
                     "keys_held": None, "bytes_held": None}
    stats = hs.stats()
    assert len(stats) == 2 and "store_stats" not in stats[1]


def test_tp2_hidden_states_missing_on_rank_0_cap_the_hit_of_both_ranks(tp2_engine, tokens):
    llm, hs = tp2_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    states_a, _, _ = run(llm, hs, a)
    # Rank 0's pool loses chunks 2 and 3 of layer 1 (as pool pressure would); the KV of every
    # rank stays in LMCache. (The rows cross to the worker process as lists.)
    engines.rpc(llm, engines.worker_keep_only, a, 2, 4, -1, states_a[-1][:1024].tolist())
    assert engines.rpc(llm, engines.worker_has_chunks, a, 1) == [True, True, False, False]

    states, out, d = run(llm, hs, b)
    # The least answer over the ranks is rank 0's capped one: both ranks compute from 512 on.
    assert out.num_cached_tokens == 512
    assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 512
    assert d["rows_restored"] == 512 and d["rows_computed"] == len(b) - 512
    reference = recompute(llm, hs, b)
    assert_exact(states, reference, len(b))
    for label in LAYERS:  # control: the restored rows are the prefix's
        assert torch.equal(states[label][:512], states_a[label][:512])
