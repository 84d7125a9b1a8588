"""What a capture step hands the store, and what it never does, without an engine: a stand-in model
runner (vLLM's host arrays, a model whose forward output the runner records as
hsstore.vllm.aux_outputs does) and a store that records its calls.

On a GPU the capture must never wait on the host: the step plan comes from vLLM's host arrays, the
rows are device copies from the model's outputs, and the store gets the capture's own device
tensors (no host copy) with the engine's current stream. Here every host-wait call is made to fail
during begin_step, the forward and end_step."""

import contextlib
import types

import numpy as np
import pytest
import torch

from hsstore.vllm import capture as capture_module
from hsstore.vllm.aux_outputs import AuxOutputs
from hsstore.vllm.capture import PromptCapture
from hsstore.vllm.stores import _complete_end

HIDDEN, LAYERS, CHUNK = 8, 4, 4
STREAM = object()  # stands for torch.cuda.current_stream() of a GPU engine


class RecordingStore:
    """Full chunks of CHUNK tokens, nothing stored before; every call recorded."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def chunks(self, tokens, salt=None):
        return [(s, s + CHUNK, tuple(tokens[: s + CHUNK]))
                for s in range(0, len(tokens) - CHUNK + 1, CHUNK)]

    complete_end = staticmethod(_complete_end)

    def restore(self, tokens, chunks, labels, outs, row_begin, end, stream=None):
        self.calls.append(("restore", dict(outs), row_begin, end, stream))
        return 0

    def store_rows(self, tokens, chunks, labels, outs, token_offset, end, stream=None):
        self.calls.append(("store_rows", {label: outs[label] for label in labels}, token_offset,
                           end, stream))
        return len(labels)


class Layer(torch.nn.Module):
    def forward(self, hidden, residual):
        return hidden * 2, residual


def runner(prompt, *, compiled, aux_ids=None, reason=None):
    model = torch.nn.Module()
    model.model = types.SimpleNamespace(layers=torch.nn.ModuleList(Layer() for _ in range(LAYERS)))
    r = types.SimpleNamespace(
        model=model, device=torch.device("cpu"),
        model_config=types.SimpleNamespace(get_hidden_size=lambda: HIDDEN, dtype=torch.float32),
        vllm_config=types.SimpleNamespace(compilation_config=types.SimpleNamespace(
            mode=2 if compiled else 0, cudagraph_mode=None)),
        input_batch=types.SimpleNamespace(num_reqs=1, req_ids=["r-0123abcd"],
                                          num_computed_tokens_cpu=np.array([0])),
        query_start_loc=types.SimpleNamespace(np=np.array([0, len(prompt)])),
        requests={"r-0123abcd": types.SimpleNamespace(prompt_token_ids=prompt, block_ids=[[0]])})
    if aux_ids is not None:
        r._hsstore_aux = AuxOutputs(aux_ids, owned=True)
    if reason is not None:
        r._hsstore_aux_reason = reason
    return r


@contextlib.contextmanager
def no_host_waits(monkeypatch):
    """Every call that waits on the device (or copies device data to the host) fails."""
    def refuse(name):
        def call(*args, **kwargs):
            raise AssertionError(f"{name} called during a capture step")
        return call

    with monkeypatch.context() as m:
        for name in ("cpu", "item", "tolist", "numpy"):
            m.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
        m.setattr(torch.cuda, "synchronize", refuse("torch.cuda.synchronize"))
        # vLLM CPU replaces torch.cuda's Stream and Event with placeholders once imported.
        m.setattr(torch.cuda.Stream, "synchronize", refuse("Stream.synchronize"), raising=False)
        m.setattr(torch.cuda.Event, "synchronize", refuse("Event.synchronize"), raising=False)
        yield


def step(cap, r, prompt, monkeypatch):
    """One engine step over the whole prompt: the forward's output as the wrapped runner
    records it (final state, then aux layers in id order)."""
    rows = len(prompt)
    hidden = torch.arange(rows * HIDDEN, dtype=torch.float32).reshape(rows, HIDDEN)
    aux = [hidden + 1000 * i for i in r._hsstore_aux.ids]
    with no_host_waits(monkeypatch):
        cap.begin_step()
        r._hsstore_aux.record((hidden, aux))
        cap.end_step()
    return hidden, aux


def test_store_gets_the_captures_device_tensors_and_the_engine_stream(monkeypatch):
    prompt = list(range(10, 22))  # 12 tokens: 3 full chunks
    r = runner(prompt, compiled=True, aux_ids=(1, 3))
    store = RecordingStore()
    cap = PromptCapture(store, [-1, 0, 2], block_size=CHUNK)
    monkeypatch.setattr(capture_module, "_current_stream", lambda device: STREAM)
    assert cap.attach(r) == [-1, 0, 2]
    assert cap.aux_labels == [-1, 0, 2] and cap.hook_labels == []
    hidden, aux = step(cap, r, prompt, monkeypatch)
    assert [c[0] for c in store.calls] == ["store_rows"]
    _, tensors, offset, end, stream = store.calls[0]
    assert (offset, end, stream) == (0, 12, STREAM)
    states = cap.take("r")  # the external id (vLLM's 8-hex suffix dropped)
    for label in (-1, 0, 2):
        # The capture's own buffer on the runner's device, not a host copy of it.
        assert tensors[label].device == r.device
        assert tensors[label].data_ptr() == states[label].data_ptr()
    assert torch.equal(states[-1], hidden)
    assert torch.equal(states[0], aux[0]) and torch.equal(states[2], aux[1])  # ids 1, 3


def test_restore_gets_the_engine_stream(monkeypatch):
    prompt = list(range(10, 22))
    r = runner(prompt, compiled=True, aux_ids=(1,))
    r.input_batch.num_computed_tokens_cpu = np.array([8])  # vLLM's prefix hit: 8 tokens
    r.query_start_loc.np = np.array([0, 4])
    store = RecordingStore()
    cap = PromptCapture(store, [-1, 0], block_size=CHUNK)
    monkeypatch.setattr(capture_module, "_current_stream", lambda device: STREAM)
    cap.attach(r)
    with no_host_waits(monkeypatch):
        cap.begin_step()
    kind, outs, row_begin, end, stream = store.calls[0]
    assert (kind, row_begin, end, stream) == ("restore", 0, 8, STREAM)
    assert all(t.device == r.device for t in outs.values())


def test_current_stream_of_a_cpu_engine_is_none():
    assert capture_module._current_stream(torch.device("cpu")) is None


def test_compiled_model_without_aux_outputs_is_refused_naming_why():
    prompt = list(range(10, 22))
    r = runner(prompt, compiled=True,
               reason="GPT2LMHeadModel does not implement vLLM's SupportsEagle3")
    cap = PromptCapture(RecordingStore(), [-1, 1], block_size=CHUNK)
    with pytest.raises(RuntimeError) as error:
        cap.attach(r)
    message = str(error.value)
    assert "layers [1]" in message and "GPT2LMHeadModel" in message
    assert "SupportsEagle3" in message and "enforce_eager=True" in message


def test_compiled_model_where_hsstore_was_not_imported_early_says_how(monkeypatch):
    r = runner(list(range(12)), compiled=True)
    cap = PromptCapture(RecordingStore(), [2], block_size=CHUNK)
    with pytest.raises(RuntimeError, match="worker_extension_cls='hsstore.vllm.WorkerExtension'"):
        cap.attach(r)


def test_eager_model_without_aux_outputs_uses_hooks():
    r = runner(list(range(12)), compiled=False)
    cap = PromptCapture(RecordingStore(), [-1, 1], block_size=CHUNK)
    assert cap.attach(r) == [-1, 1]
    assert cap.aux_labels == [] and cap.hook_labels == [-1, 1]
    assert len(cap._hooks) == 2


def test_layers_beyond_a_drafts_aux_outputs_use_hooks():
    r = runner(list(range(12)), compiled=False, aux_ids=(2,))
    r._hsstore_aux.owned = False  # vLLM's EAGLE-3 draft reads aux layer 2 (label 1)
    cap = PromptCapture(RecordingStore(), [-1, 1, 3], block_size=CHUNK)
    cap.attach(r)
    assert cap.aux_labels == [-1, 1] and cap.hook_labels == [3]


def test_aux_output_count_mismatch_is_an_error():
    aux = AuxOutputs((1, 2), owned=True)
    aux.record((torch.zeros(2, 2), [torch.zeros(2, 2)]))
    with pytest.raises(RuntimeError, match="returned 1 auxiliary hidden states, expected 2"):
        aux.take()
