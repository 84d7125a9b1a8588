"""CUDA tensors from torch through the DLPack stream handshake. Marked `cuda`: skipped without a
device; `pytest python/tests -m cuda` runs them on a GPU machine (test_cuda_dlpack.py covers the
device path without torch)."""

import pytest

from conftest import CHUNK, DIM, Fixture

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch without CUDA"),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cuda_store_on_a_side_stream_then_retrieve(dtype):
    f = Fixture()
    tokens = list(range(4 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # Produced on the side stream; the store must copy after this kernel, on that stream.
        data = (torch.randn(4 * CHUNK, DIM, device="cuda") * 3).to(getattr(torch, dtype))
        assert f.store.store_hidden_states(tokens, data) == 4
    out = f.store.retrieve_hidden_states(tokens)
    torch.testing.assert_close(out, data.float().cpu(), rtol=0, atol=0)


def test_cuda_retrieve_into_device_tensor():
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    data = torch.randn(2 * CHUNK, DIM)
    f.store.store_hidden_states(tokens, data)
    out = torch.zeros(2 * CHUNK, DIM, device="cuda")
    assert f.store.retrieve_hidden_states_into(tokens, out) == 2 * CHUNK
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), data)


def test_cuda_strided_view():
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    base = torch.randn(2 * CHUNK, 3 * DIM, device="cuda")
    view = base[:, DIM : 2 * DIM]
    f.store.store_hidden_states(tokens, view)
    torch.testing.assert_close(f.store.retrieve_hidden_states(tokens), view.cpu())


def test_cuda_batch_on_two_streams_equals_host_single_calls():
    f = Fixture()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    prompts = [list(range(100 * r, 100 * r + (r % 3 + 1) * CHUNK)) for r in range(6)]
    for p in prompts:
        f.mark_kv_present(f.keys_for(p))
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    items = []
    for layer in range(3):
        for r, p in enumerate(prompts):
            with torch.cuda.stream(streams[r % 2]):
                data = (torch.randn(len(p), DIM, device="cuda") * 3).to(dtypes[(r + layer) % 3])
                items.append((p, data, layer))
    # Each item's tensor was produced on its stream: borrowed on torch's current stream.
    written = []
    for s in streams:
        with torch.cuda.stream(s):
            written += f.store.store_batch([it for i, it in enumerate(items) if (i % 6) % 2 == streams.index(s)])
    assert sorted(written) == sorted(len(p) // CHUNK for p, _, _ in items)
    outs = [torch.full((len(p), DIM), -1.0, device="cuda") for p, _, _ in items]
    assert f.store.retrieve_batch_into([(p, o, layer) for (p, _, layer), o in zip(items, outs)]) == [
        len(p) for p, _, _ in items
    ]
    torch.cuda.synchronize()
    for (p, data, layer), o in zip(items, outs):
        torch.testing.assert_close(o.cpu(), data.float().cpu(), rtol=0, atol=0)
