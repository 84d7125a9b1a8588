"""torch inputs and outputs (skipped when torch is not installed; scripts/lmcache_venv runs them
in its venv, which has torch)."""

import numpy as np
import pytest

from conftest import CHUNK, DIM, Fixture

torch = pytest.importorskip("torch")


def test_torch_roundtrip_is_zero_copy_torch_tensor():
    f = Fixture()
    tokens = torch.arange(2 * CHUNK, dtype=torch.int64)
    f.mark_kv_present(f.keys_for(tokens))
    data = torch.randn(2 * CHUNK, DIM)
    assert f.store.store_hidden_states(tokens, data) == 2
    out = f.store.retrieve_hidden_states(tokens)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device.type == "cpu"
    torch.testing.assert_close(out, data)
    out[0, 0] = 123.0  # writable, and its own memory: the store is unchanged
    again = f.store.retrieve_hidden_states(tokens)
    torch.testing.assert_close(again, data)
    assert isinstance(f.store.retrieve_hidden_states(tokens, like="numpy"), np.ndarray)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_half_inputs_widen_exactly(dtype):
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    data = torch.randn(2 * CHUNK, DIM).to(getattr(torch, dtype))
    f.store.store_hidden_states(tokens, data)
    torch.testing.assert_close(f.store.retrieve_hidden_states(tokens), data.float(), rtol=0, atol=0)


def test_requires_grad_and_views():
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    base = torch.randn(2 * CHUNK, 2 * DIM, requires_grad=True)
    view = base[:, DIM:]
    assert f.store.store_hidden_states(tokens, view) == 2
    torch.testing.assert_close(f.store.retrieve_hidden_states(tokens), view.detach())
    with pytest.raises(ValueError, match="strides"):
        f.store.store_hidden_states(list(range(100, 116)), torch.randn(DIM, 2 * CHUNK).t())
    with pytest.raises(ValueError, match="token_ids"):
        f.store.store_hidden_states(torch.zeros(16), torch.randn(16, DIM))
    assert f.roundtrip_ok()


def test_retrieve_into_torch_out():
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    data = torch.randn(2 * CHUNK, DIM)
    f.store.store_hidden_states(tokens, data)
    out = torch.zeros(2 * CHUNK, DIM)
    assert f.store.retrieve_hidden_states_into(tokens, out) == 2 * CHUNK
    torch.testing.assert_close(out, data)


def test_torch_fast_path_edge_cases():
    """CPU torch tensors are read without __dlpack__; unusual ones fall back to DLPack."""
    from hsstore import _hsstore

    base = torch.randn(2 * CHUNK, 3 * DIM)
    assert _hsstore._roundtrip_tensor(base[:, DIM : 2 * DIM]) == (2 * CHUNK, DIM, 3 * DIM, "float32", "host")
    assert _hsstore._roundtrip_tensor(base[3:4, :DIM]) == (1, DIM, DIM, "float32", "host")
    assert _hsstore._roundtrip_tensor(torch.zeros(4, 8, dtype=torch.bfloat16))[3] == "bfloat16"
    with pytest.raises(ValueError, match="float64"):
        _hsstore._roundtrip_tensor(torch.zeros(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="2-D"):
        _hsstore._roundtrip_tensor(torch.zeros(4))
    with pytest.raises(ValueError):
        _hsstore._roundtrip_tensor(torch.Size([4, 8]))
    f = Fixture()
    tokens = torch.arange(100, 100 + 2 * CHUNK, dtype=torch.int32)
    f.mark_kv_present(f.keys_for(tokens.tolist()))
    data = torch.randn(2 * CHUNK, DIM)
    neg = torch._neg_view(data)  # shares data's storage with a flag torch's __dlpack__ ignores
    assert f.store.store_hidden_states(tokens, neg) == 2
    torch.testing.assert_close(f.store.retrieve_hidden_states(tokens), -data)
    strided_ids = torch.arange(0, 4 * CHUNK, 2)[: 2 * CHUNK]
    assert [k for *_, k in f.db.process_tokens(strided_ids)] == f.keys_for(strided_ids.tolist())


def test_meta_tensor_is_value_error_naming_the_argument():
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    before = f.store.stats()
    meta = torch.empty((2 * CHUNK, DIM), device="meta")
    with pytest.raises(ValueError, match="hidden_states is a torch tensor on the 'meta' device"):
        f.store.store_hidden_states(tokens, meta)
    with pytest.raises(ValueError, match="out is a torch tensor on the 'meta' device"):
        f.store.retrieve_hidden_states_into(tokens, meta)
    with pytest.raises(ValueError, match="token_ids is a torch tensor on the 'meta' device"):
        f.store.store_hidden_states(torch.empty(2 * CHUNK, dtype=torch.int64, device="meta"),
                                    torch.zeros(2 * CHUNK, DIM))
    assert f.store.stats() == before
    assert f.roundtrip_ok()


def test_retrieve_layers_into_torch_outputs():
    f = Fixture()
    tokens = torch.arange(2 * CHUNK)
    f.mark_kv_present(f.keys_for(tokens))
    data = {0: torch.randn(2 * CHUNK, DIM), -1: torch.randn(2 * CHUNK, DIM)}
    for layer, rows in data.items():
        f.store.store_hidden_states(tokens, rows, layer_idx=layer)
    outs = [torch.empty(2 * CHUNK, DIM, dtype=torch.bfloat16), torch.empty(2 * CHUNK, DIM)]
    assert f.store.retrieve_layers_into(tokens, [0, -1], outs) == 2 * CHUNK
    assert torch.equal(outs[0], data[0].to(torch.bfloat16))
    assert torch.equal(outs[1], data[-1])
