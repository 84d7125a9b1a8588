"""vLLM's own prefix cache without LMCache (hidden states in an hsstore Engine per worker): the
same exactness, and a locally cached prefix whose hidden states are missing is capped by the
scheduler and recomputed, never handed over short."""

import pytest
import torch

import engines
import hsstore.vllm
from conftest import STEP_TOKENS
from engines import run

HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 1]


def assert_exact(llm, hs, prompt, states):
    reference, out, d = run(llm, hs, prompt, skip_prefix_cache=True)
    assert out.num_cached_tokens == 0 and d["rows_computed"] == len(prompt)
    for label in LAYERS:
        assert states[label].shape == (len(prompt), HIDDEN)
        assert torch.equal(states[label], reference[label]), label


@pytest.fixture(scope="module")
def local_engine(tiny_model):
    hs = hsstore.vllm.HiddenStates(layers=LAYERS, lmcache=False)
    with engines.engine(tiny_model, hs, prefix_caching=True,
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        yield llm, hs


def test_vllm_prefix_cache_without_lmcache_equals_full_recompute(local_engine, tokens):
    llm, hs = local_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)
    states_a, _, d_a = run(llm, hs, a)
    assert d_a["rows_computed"] == len(a)
    states_b, out, d = run(llm, hs, b)
    assert out.num_cached_tokens == 1024  # vLLM's own prefix cache
    assert d["rows_restored"] == 1024 and d["rows_computed"] == 100
    assert d["local_hits_capped"] == 0
    assert_exact(llm, hs, b, states_b)
    for label in LAYERS:
        assert not torch.equal(states_a[label][1024:], states_b[label][1024:])


def test_local_hit_without_hidden_states_is_capped_and_recomputed(local_engine, tokens):
    llm, hs = local_engine
    prefix = tokens(1024)
    a, b = prefix + tokens(50), prefix + tokens(70)
    run(llm, hs, a)
    # vLLM still caches every block of A's prefix; the hidden states of the chunk at token 512
    # (chunks are vLLM's blocks here) are gone.
    assert engines.rpc(llm, engines.worker_drop_engine_chunk, a, 512 // engines.block_size(llm))
    states, out, d = run(llm, hs, b)
    assert out.num_cached_tokens == 512  # the scheduler truncated vLLM's hit at the coverage
    assert d["local_hits_capped"] == 1 and d["local_tokens_capped"] == 512
    assert d["rows_restored"] == 512 and d["rows_computed"] == len(b) - 512
    assert_exact(llm, hs, b, states)
