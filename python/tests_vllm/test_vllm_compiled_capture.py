"""Capture with vLLM's compilation on (no enforce_eager): every layer comes from the model's
auxiliary hidden-state outputs and its output (hsstore.vllm.aux_outputs), which are outputs of the
compiled graph; forward hooks never fire inside it.

Three engines of one model, built one after another (vLLM keeps one KV connector per process):
eager (enforce_eager=True), compiled by Dynamo with the eager backend (the same kernels as eager,
so its numbers are eager's bit for bit) and compiled by Inductor (vLLM's default: fused kernels,
whose rounding differs from eager's by a few ulp in the model itself, logits included). Each runs a
prompt, a second prompt sharing its 512-token prefix (a prefix hit: the prefix's rows restored)
and the second again with vLLM's prefix cache skipped (the full recompute)."""

import pytest
import torch

import engines
import hsstore.vllm
from conftest import STEP_TOKENS
from engines import run

HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 0, 1, 2, 3]  # the final state and every decoder layer of the tiny Llama
PREFIX = 512
MODES = {
    "eager": {"enforce_eager": True},
    "dynamo": {"enforce_eager": False, "compilation_config": {"backend": "eager"}},
    "inductor": {"enforce_eager": False},
}


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    import random

    rng = random.Random(55)
    prefix = [rng.randrange(3, 1000) for _ in range(PREFIX)]
    a = prefix + [rng.randrange(3, 1000) for _ in range(100)]
    b = prefix + [rng.randrange(3, 1000) for _ in range(100)]
    out = {}
    for mode, args in MODES.items():
        hs = hsstore.vllm.HiddenStates(layers=LAYERS, lmcache=False)
        with engines.engine(tiny_model, hs, prefix_caching=True,
                            max_num_batched_tokens=STEP_TOKENS, **args) as llm:
            config = llm.llm_engine.vllm_config
            states_a, _, d_a = run(llm, hs, a)
            states_b, out_b, d_b = run(llm, hs, b)
            recomputed, out_r, d_r = run(llm, hs, b, skip_prefix_cache=True)
            out[mode] = {"a": states_a, "b": states_b, "recomputed": recomputed,
                         "deltas": (d_a, d_b, d_r), "cached": (out_b.num_cached_tokens,
                                                              out_r.num_cached_tokens),
                         "stats": hs.stats()[0], "mode": int(config.compilation_config.mode),
                         "enforce_eager": config.model_config.enforce_eager,
                         "tokens": (out_b.outputs[0].token_ids, out_r.outputs[0].token_ids)}
    return out


@pytest.mark.parametrize("mode", ["dynamo", "inductor"])
def test_compiled_engine_takes_every_layer_from_the_model_outputs(runs, mode):
    r = runs[mode]
    assert r["mode"] != 0 and r["enforce_eager"] is False  # compiled (CompilationMode not NONE)
    assert r["stats"]["labels_from_outputs"] == LAYERS
    assert r["stats"]["labels_from_hooks"] == []
    d_a = r["deltas"][0]
    assert d_a["rows_computed"] == PREFIX + 100 and d_a["prompts_completed"] == 1


@pytest.mark.parametrize("mode", ["eager", "dynamo", "inductor"])
def test_prefix_hit_equals_full_recompute(runs, mode):
    r = runs[mode]
    _, d_b, d_r = r["deltas"]
    assert r["cached"] == (PREFIX, 0)  # vLLM's prefix hit, then the recompute without it
    assert d_b["rows_restored"] == PREFIX and d_b["rows_computed"] == 100
    assert d_r["rows_restored"] == 0 and d_r["rows_computed"] == PREFIX + 100
    for label in LAYERS:
        assert r["b"][label].shape == (PREFIX + 100, HIDDEN)
        assert torch.equal(r["b"][label], r["recomputed"][label]), label
        assert torch.equal(r["b"][label][:PREFIX], r["a"][label][:PREFIX]), label
        assert not torch.equal(r["b"][label][PREFIX:], r["a"][label][PREFIX:]), label


def test_dynamo_compiled_capture_equals_eager_engine_bit_for_bit(runs):
    for key in ("a", "b", "recomputed"):
        for label in LAYERS:
            assert torch.equal(runs["dynamo"][key][label], runs["eager"][key][label]), (key, label)


def test_inductor_compiled_capture_is_the_models_own_rounding_of_eager(runs):
    """Inductor's fused kernels round differently from eager's (the model, not the capture): the
    rows agree with eager to float32 rounding, not bit for bit; the restored and recomputed ones
    of one engine do (test_prefix_hit_equals_full_recompute)."""
    for label in LAYERS:
        compiled, eager = runs["inductor"]["a"][label], runs["eager"]["a"][label]
        assert torch.allclose(compiled, eager, rtol=1e-4, atol=1e-4), label
    assert runs["inductor"]["tokens"] == runs["eager"]["tokens"]
