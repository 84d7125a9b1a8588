"""LMCache's multi-process mode with real vLLM + a real `lmcache server` (LMCache 0.5.6,
engine-driven transfers on the CPU): the KV comes back from the server, the hidden states from
hsstore in the worker (hsstore.vllm.mp_connector), and the whole prompt's hidden states equal a
full recompute bit for bit. The engine is told at most min(the server's lookup, hidden-state
coverage of every required layer); a server killed and restarted is a counted recompute."""

import time

import pytest
import torch

import engines
import hsstore.vllm
from conftest import STEP_TOKENS
from lmcache_server import lmcache_server
from test_vllm_lmcache import CHUNK, LAYERS, assert_exact, recompute, run
from test_vllm_lmcache_pool import PRESSURE_POOL_GB, PRESSURE_STEP_TOKENS, run_past_a_full_pool

HEALTH_TIMEOUT_S = 120.0


def capture(**config):
    return hsstore.vllm.HiddenStates(layers=LAYERS, lmcache="mp", config=config or None)


def client(server, **extra):
    # A short heartbeat: a killed server is noticed (and a restarted one re-registered with)
    # within seconds rather than LMCache's default 10 s.
    return {**server.client_config, "mp.heartbeat_interval": 2.0, "mp.mq_timeout": 30.0, **extra}


def scheduler_connector(llm):
    """The scheduler's connector of an in-process engine (engines.engine runs one)."""
    return llm.llm_engine.engine_core.engine_core.scheduler.connector


def wait_for_health(llm, hs, healthy):
    """Until the scheduler's and the worker's LMCache adapters both see the server as `healthy`
    (their heartbeats; the worker re-registers its KV cache with a restarted server first)."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        scheduler = scheduler_connector(llm).scheduler_adapter.is_healthy
        worker = hs.stats()[0]["mp_server_healthy"]
        if scheduler == healthy and worker == healthy:
            return
        assert time.monotonic() < deadline, f"server health never became {healthy}"
        time.sleep(0.5)


@pytest.fixture(scope="module", autouse=True)
def lmcache_imported():
    """vLLM resolves the connector class (so imports LMCache) before its CPU worker starts;
    the worker's kernel-dispatch scan then trips on numba's llvmlite wrapper, which LMCache
    imports. engines.allow_engines_after_lmcache patches it (a vLLM CPU + LMCache matter)."""
    import hsstore.vllm.mp_connector  # noqa: F401

    engines.allow_engines_after_lmcache()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with lmcache_server(tmp_path_factory.mktemp("lmcache-mp")) as s:
        yield s


def test_config_names_the_mp_connector():
    hs = capture(max_hidden_state_cpu_size=0.5)
    config = hs.kv_transfer_config({"mp.host": "tcp://127.0.0.1", "mp.port": 5599})
    assert config.kv_connector == "HiddenStateLMCacheMPConnector"
    assert config.kv_connector_module_path == "hsstore.vllm.mp_connector"
    extra = config.kv_connector_extra_config
    assert extra["lmcache.mp.port"] == 5599 and extra["hsstore.layers"] == LAYERS
    assert extra["hsstore.config"] == {"max_hidden_state_cpu_size": 0.5}
    with pytest.raises(ValueError, match="store='lmcache' needs lmcache=True"):
        hsstore.vllm.HiddenStates(lmcache="mp", store="lmcache")
    with pytest.raises(ValueError, match="lmcache must be"):
        hsstore.vllm.HiddenStates(lmcache="multi")


def test_75_percent_cached_prompt_kv_from_server_hidden_states_from_hsstore(tiny_model, tokens,
                                                                              server):
    hs = capture()
    with engines.engine(tiny_model, hs, lmcache=client(server),
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        assert hs.stats()[0]["mp_chunk_size"] == CHUNK  # asked of the server
        prefix = tokens(768)
        a, b = prefix + tokens(256), prefix + tokens(256)  # 75% of B is A's
        states_a, out_a, d_a = run(llm, hs, a)
        assert out_a.num_cached_tokens == 0 and d_a["rows_computed"] == len(a)
        assert d_a["rows_stored"] == len(a)  # 4 full chunks, every layer

        states_b, out_b, d_b = run(llm, hs, b)
        # The server answered 3 chunks (768 tokens) of KV, the hidden states cover them: only
        # the tail ran.
        assert out_b.num_cached_tokens == 768
        assert d_b["lookups"] >= 1 and d_b["lookup_hits_capped"] == 0
        assert d_b["rows_restored"] == 768 and d_b["rows_computed"] == 256
        assert d_b["lookups_server_down"] == 0

        assert_exact(states_b, recompute(llm, hs, b), len(b))
        for label in LAYERS:  # control: the prefixes agree, the tails differ
            assert torch.equal(states_a[label][:768], states_b[label][:768])
            assert not torch.equal(states_a[label][768:], states_b[label][768:])


def test_hidden_state_pool_pressure_caps_the_servers_hit(tiny_model, tokens, server):
    # The pool of test_vllm_lmcache_pool.py; the server keeps all the KV. Its lookup finds all 4
    # chunks, the engine is told only what every layer covers, and the server's lookup locks past
    # that are released.
    hs = capture(max_hidden_state_cpu_size=PRESSURE_POOL_GB)
    with engines.engine(tiny_model, hs, lmcache=client(server),
                        max_num_batched_tokens=PRESSURE_STEP_TOKENS) as llm:
        _, _, d = run_past_a_full_pool(llm, hs, tokens)
        assert d["recomputes"] == 0  # nothing found missing at restore: the cap did the work
        assert hs.stats()[0]["store_stats"]["allocation_failures"] >= 1


def test_worker_in_another_process_recomputes_what_the_scheduler_cannot_cap(tiny_model, tokens,
                                                                             server):
    # The worker in a process of its own (executor "mp", as vllm serve runs on a CPU): the
    # scheduler cannot ask the store, so the server's whole hit goes to vLLM; the worker finds
    # the intermediate layer missing under pool pressure (the final layer's 4 chunks fit, the
    # intermediate layer's do not, as in test_vllm_lmcache_pool.py), reports the first block,
    # and vLLM recomputes from it. The rows equal a recompute; nothing was capped.
    hs = capture(max_hidden_state_cpu_size=PRESSURE_POOL_GB)
    with engines.engine(tiny_model, hs, lmcache=client(server), multiprocess=True, executor="mp",
                        max_num_batched_tokens=PRESSURE_STEP_TOKENS) as llm:
        prefix = tokens(1024)
        a, b = prefix + tokens(100), prefix + tokens(100)
        run(llm, hs, a)
        assert engines.rpc(llm, engines.worker_salted, a, "") == 0  # no prefix has both layers
        states, _, d = run(llm, hs, b)
        assert d["lookup_hits_capped"] == 0  # the scheduler saw no store
        assert d["recomputes"] == 1 and d["rows_restored"] == 0
        assert d["rows_computed"] == len(b)
        assert_exact(states, recompute(llm, hs, b), len(b))
        # A prompt whose hidden states are all there (2 chunks, both layers: the pool's 4
        # entries) is restored from the worker's store, not recomputed.
        c = tokens(512) + tokens(50)
        run(llm, hs, c)
        states_c, out_c, d_c = run(llm, hs, c)
        assert d_c["recomputes"] == 0 and d_c["rows_restored"] == 512
        assert out_c.num_cached_tokens == 512
        reference = recompute(llm, hs, c)
        for label in LAYERS:
            assert torch.equal(states_c[label][:512], reference[label][:512]), label
            # The tail ran in a step starting at token 512, the recompute's at 0: vLLM CPU's
            # attention rounds differently there (conftest.py), so only to 1e-5 of the largest.
            bound = 1e-5 * float(reference[label].abs().max())
            assert float((states_c[label][512:] - reference[label][512:]).abs().max()) <= bound


def test_server_killed_and_restarted_is_a_counted_recompute(tiny_model, tokens, tmp_path):
    with lmcache_server(tmp_path) as own:  # this test kills it: a server of its own
        hs = capture()
        with engines.engine(tiny_model, hs, lmcache=client(own),
                            max_num_batched_tokens=STEP_TOKENS) as llm:
            prefix = tokens(768)
            a = prefix + tokens(256)
            run(llm, hs, a)
            _, out, _ = run(llm, hs, prefix + tokens(256))
            assert out.num_cached_tokens == 768  # the server serves A's prefix

            own.kill()
            wait_for_health(llm, hs, False)
            c = prefix + tokens(256)
            states, out, d = run(llm, hs, c)
            # No server: no hit, though hsstore still holds the prefix's hidden states.
            assert out.num_cached_tokens == 0
            assert d["lookups_server_down"] == 1
            assert d["rows_restored"] == 0 and d["rows_computed"] == len(c)
            assert_exact(states, recompute(llm, hs, c), len(c))

            own.start()  # an empty cache on the same port
            wait_for_health(llm, hs, True)
            d_ = prefix + tokens(256)
            states, out, d = run(llm, hs, d_)
            # The restarted server has no KV of the prefix: its hidden states are not served.
            assert out.num_cached_tokens == 0 and d["lookups_server_down"] == 0
            assert d["rows_restored"] == 0 and d["rows_computed"] == len(d_)
            assert_exact(states, recompute(llm, hs, d_), len(d_))

            e = prefix + tokens(256)
            states, out, d = run(llm, hs, e)
            # D stored the prefix's KV in the new server: KV and hidden states are served again.
            assert out.num_cached_tokens == 768
            assert d["rows_restored"] == 768 and d["rows_computed"] == 256
            assert_exact(states, recompute(llm, hs, e), len(e))


def worker_coverage(worker, engine_id, tokens):
    """The hidden-state coverage the worker's store holds for tokens (no KV check)."""
    from hsstore.vllm.connector import worker_connector

    hs = worker_connector(engine_id)
    return hs.store.coverage(hs.store.chunks(list(tokens)), hs.labels)


def test_server_dropping_kv_ends_the_hit_hidden_states_unserved(tiny_model, tokens, server):
    # The server drops its KV (LMCache's CLEAR, what the connector's reset_cache sends; the
    # server's own L1 eviction works in the background, so a test of it would be a race).
    hs = capture()
    with engines.engine(tiny_model, hs, lmcache=client(server),
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        prefix = tokens(768)
        a = prefix + tokens(256)
        run(llm, hs, a)
        assert scheduler_connector(llm).reset_cache() is True
        # hsstore still holds all of A's hidden states.
        assert engines.rpc(llm, worker_coverage, a) == 1024

        b = prefix + tokens(256)
        states, out, d = run(llm, hs, b)
        # The server's answer ends where its KV does: the hidden states past it are not
        # served, and it was the server's answer, not the hidden-state cap, that ended it.
        assert out.num_cached_tokens == 0
        assert d["lookup_hits_capped"] == 0 and d["lookups_server_down"] == 0
        assert d["rows_restored"] == 0 and d["rows_computed"] == len(b)
        assert_exact(states, recompute(llm, hs, b), len(b))

        c = prefix + tokens(256)
        states, out, d = run(llm, hs, c)  # B stored the prefix's KV again: served again
        assert out.num_cached_tokens == 768 and d["rows_restored"] == 768
        assert_exact(states, recompute(llm, hs, c), len(c))


def test_cache_salt_separates_hidden_states_as_it_separates_kv(tiny_model, tokens, server):
    hs = capture()
    with engines.engine(tiny_model, hs, lmcache=client(server),
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        prefix = tokens(768)
        a = prefix + tokens(256)
        run(llm, hs, a, cache_salt="tenant-1")

        b = prefix + tokens(256)
        states, out, d = run(llm, hs, b, cache_salt="tenant-2")
        # The server slices KV by salt: no hit for tenant 2, so no hidden states either.
        assert out.num_cached_tokens == 0 and d["rows_restored"] == 0
        reference, _, _ = run(llm, hs, b, cache_salt="tenant-2", skip_prefix_cache=True)
        assert_exact(states, reference, len(b))
        # Each tenant's hidden states under keys of its own.
        assert engines.rpc(llm, engines.worker_salted, a, "tenant-1") == 1024
        assert engines.rpc(llm, engines.worker_salted, b, "tenant-2") == 1024
        assert engines.rpc(llm, engines.worker_salted, a, "") == 0  # nothing under no salt

        # Tenant 2's hidden states are dropped; its KV stays in the server, tenant 1's hidden
        # states of the same tokens stay in hsstore. Tenant 2 is not served tenant 1's rows:
        # the server's hit (tenant 2's KV) is capped at tenant 2's coverage, 0.
        assert engines.rpc(llm, engines.worker_salted, b, "tenant-2", True) == 0
        c = prefix + tokens(256)
        states, out, d = run(llm, hs, c, cache_salt="tenant-2")
        assert out.num_cached_tokens == 0
        assert d["lookup_hits_capped"] == 1 and d["lookup_tokens_capped"] == 768
        assert d["rows_restored"] == 0 and d["rows_computed"] == len(c)
        reference, _, _ = run(llm, hs, c, cache_salt="tenant-2", skip_prefix_cache=True)
        assert_exact(states, reference, len(c))

        # Tenant 1 is still served its own, KV and hidden states.
        e = prefix + tokens(256)
        states, out, d = run(llm, hs, e, cache_salt="tenant-1")
        assert out.num_cached_tokens == 768 and d["rows_restored"] == 768
        reference, _, _ = run(llm, hs, e, cache_salt="tenant-1", skip_prefix_cache=True)
        assert_exact(states, reference, len(e))
