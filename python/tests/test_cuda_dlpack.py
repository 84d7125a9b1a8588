"""The device path without torch: CUDA buffers (hsstore._DeviceBuffer, exported through DLPack like
any producer's) stored, retrieved into, and compared bit for bit. Marked `cuda`: skipped without a
device; run with `pytest python/tests -m cuda` on a GPU machine."""

import numpy as np
import pytest

from hsstore import _hsstore
from conftest import CHUNK, DIM, Fixture, rows

pytestmark = pytest.mark.cuda


def bf16_round(a: np.ndarray) -> np.ndarray:
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_device_input_roundtrip(dtype):
    f = Fixture()
    tokens = list(range(4 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    host = rows(4 * CHUNK) * 3
    if dtype == "float16":
        src, expected = host.astype(np.float16), host.astype(np.float16).astype(np.float32)
    elif dtype == "bfloat16":
        src, expected = host, bf16_round(host)
    else:
        src, expected = host, host
    device = _hsstore._DeviceBuffer.from_host(src, dtype)
    assert _hsstore._roundtrip_tensor(device)[3:] == (dtype, "cuda")
    assert f.store.store_hidden_states(tokens, device) == 4
    f.store.flush()
    out = f.store.retrieve_hidden_states(tokens, like="numpy")
    np.testing.assert_array_equal(out, expected)
    assert f.roundtrip_ok()


def test_retrieve_into_device_buffer():
    f = Fixture()
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    data = rows(2 * CHUNK)
    f.store.store_hidden_states(tokens, data)
    out = _hsstore._DeviceBuffer(2 * CHUNK, DIM, "float32")
    assert f.store.retrieve_hidden_states_into(tokens, out) == 2 * CHUNK
    back = np.frombuffer(out.to_host_bytes(), np.float32).reshape(2 * CHUNK, DIM)
    np.testing.assert_array_equal(back, data)
    tail = _hsstore._DeviceBuffer(8, DIM, "float32")
    assert f.store.retrieve_hidden_states_into(tokens, tail, row_begin=2 * CHUNK - 8) == 8
    np.testing.assert_array_equal(np.frombuffer(tail.to_host_bytes(), np.float32).reshape(8, DIM),
                                  data[-8:])


def test_device_input_bad_shape_is_value_error():
    f = Fixture()
    device = _hsstore._DeviceBuffer.from_host(rows(CHUNK))
    with pytest.raises(ValueError, match="hidden_states"):
        f.store.store_hidden_states(list(range(CHUNK + 1)), device)
    assert f.roundtrip_ok()
