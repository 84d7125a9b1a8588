"""hsstore's backing tiers under vLLM: a prefix whose hidden states left the pool but are held by
the Redis tier is a hit, read through at restore, bit-exact; with the server gone it is a capped
hit and recomputed. Before the soak (bench/soak.py) found it, the cap counted the pool only, so a
tier was written and never read under vLLM."""

import pathlib

import pytest

import engines
from conftest import STEP_TOKENS
from pd_engine import Redis
from test_vllm_lmcache import LAYERS, assert_exact, capture, recompute, run


def worker_drop_pool(worker, engine_id):
    """Every hidden state out of the worker's pool (the Redis tier keeps its copies)."""
    from hsstore.vllm.connector import worker_connector

    return worker_connector(engine_id).store.drop_all()


def worker_flush(worker, engine_id):
    from hsstore.vllm.connector import worker_connector

    worker_connector(engine_id).store.flush()


@pytest.fixture(scope="module")
def tiered_engine(tiny_model, tmp_path_factory):
    redis = Redis(pathlib.Path(tmp_path_factory.mktemp("redis")))
    hs = capture("hsstore")
    config = engines.lmcache_config(extra_config={
        "hidden_state_remote_url": f"redis://127.0.0.1:{redis.port}",
        "hidden_state_remote_timeout_ms": 500})
    try:
        with engines.engine(tiny_model, hs, lmcache=config,
                            max_num_batched_tokens=STEP_TOKENS) as llm:
            yield llm, hs, redis
    finally:
        redis.close()


def test_prefix_held_by_the_redis_tier_is_a_hit_read_through(tiered_engine, tokens):
    llm, hs, _ = tiered_engine
    prefix = tokens(768)
    a, b = prefix + tokens(100), prefix + tokens(100)
    run(llm, hs, a)
    engines.rpc(llm, worker_flush)  # A's chunks are in Redis
    assert engines.rpc(llm, worker_drop_pool) == 3
    states, out, d = run(llm, hs, b)
    assert out.num_cached_tokens == 768 and d["lookup_hits_capped"] == 0
    assert d["rows_restored"] == 768 and d["rows_computed"] == 100
    remote = hs.stats()[0]["store_stats"]["remote"]
    assert remote["hits"] == 3 * len(LAYERS) and remote["read_through_chunks"] == 3 * len(LAYERS)
    assert_exact(states, recompute(llm, hs, b), len(b))


def test_prefix_lost_with_the_server_is_capped_and_recomputed(tiered_engine, tokens):
    llm, hs, redis = tiered_engine
    prefix = tokens(512)
    a, b = prefix + tokens(100), prefix + tokens(100)
    engines.rpc(llm, worker_drop_pool)  # what earlier tests left in the pool
    run(llm, hs, a)
    engines.rpc(llm, worker_flush)
    redis.command("FLUSHALL")  # the server lost everything (a restart without persistence)
    assert engines.rpc(llm, worker_drop_pool) == 2
    states, out, d = run(llm, hs, b)
    assert out.num_cached_tokens == 0  # LMCache holds the KV; the hidden states are gone
    assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 512
    assert d["rows_restored"] == 0 and d["rows_computed"] == len(b)
    assert_exact(states, recompute(llm, hs, b), len(b))
