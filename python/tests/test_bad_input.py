"""Every bad input raises ValueError (or hsstore.Error) naming the argument and value, and leaves
the store usable and unchanged."""

import numpy as np
import pytest

import hsstore
from conftest import CHUNK, DIM, Fixture, rows

TOKENS = list(range(2 * CHUNK))


def bad_stores():
    good = rows(2 * CHUNK)
    return [
        ("float64", dict(token_ids=TOKENS, hidden_states=good.astype(np.float64)), "float64"),
        ("int32 rows", dict(token_ids=TOKENS, hidden_states=np.zeros((16, DIM), np.int32)), "int32"),
        ("1-D", dict(token_ids=TOKENS, hidden_states=np.zeros(16, np.float32)), "2-D"),
        ("3-D", dict(token_ids=TOKENS, hidden_states=np.zeros((16, 2, 8), np.float32)), "2-D"),
        ("column-strided", dict(token_ids=TOKENS, hidden_states=good[:, ::2]), "strides"),
        ("transposed", dict(token_ids=TOKENS, hidden_states=rows(DIM, 2 * CHUNK).T), "strides"),
        ("not a tensor", dict(token_ids=TOKENS, hidden_states=[[1.0] * DIM] * 16), "__dlpack__"),
        ("rows mismatch", dict(token_ids=TOKENS, hidden_states=rows(2 * CHUNK - 1)), "15"),
        ("float token", dict(token_ids=TOKENS[:-1] + [1.5], hidden_states=good), "token_ids\\[15\\]"),
        ("str token", dict(token_ids=["a"] * 16, hidden_states=good), "token_ids\\[0\\]"),
        ("huge token", dict(token_ids=[2**40] * 16, hidden_states=good), "1099511627776"),
        ("negative token", dict(token_ids=[-5] * 16, hidden_states=good), "-5"),
        ("2-D token ids", dict(token_ids=np.zeros((2, 8), np.int64), hidden_states=good), "1-D"),
        ("float token ids", dict(token_ids=np.zeros(16, np.float32), hidden_states=good), "integers"),
        ("token_offset < 0", dict(token_ids=TOKENS, hidden_states=good, token_offset=-1), "-1"),
        ("token_offset > n", dict(token_ids=TOKENS, hidden_states=good[:0], token_offset=17), "17"),
        ("zero columns", dict(token_ids=TOKENS, hidden_states=np.zeros((16, 0), np.float32)), "cols"),
    ]


@pytest.mark.parametrize("case", bad_stores(), ids=lambda c: c[0])
def test_bad_store_is_value_error_and_store_unchanged(case):
    _, kwargs, needle = case
    f = Fixture()
    before = f.store.stats()
    with pytest.raises(ValueError, match=needle):
        f.store.store_hidden_states(**kwargs)
    after = f.store.stats()
    assert after["entries_held"] == before["entries_held"] == 0
    assert after["stores"] == before["stores"]
    assert f.roundtrip_ok()


def test_bad_retrieve_arguments():
    f = Fixture()
    with pytest.raises(ValueError, match="row_begin"):
        f.store.retrieve_hidden_states(TOKENS, row_begin=-1)
    with pytest.raises(ValueError, match="like"):
        f.store.retrieve_hidden_states(TOKENS, like="jax")
    with pytest.raises(ValueError, match="token_ids"):
        f.store.retrieve_hidden_states(None)
    f.mark_kv_present(f.keys_for(TOKENS))
    f.store.store_hidden_states(TOKENS, rows(2 * CHUNK))
    with pytest.raises(ValueError, match="out"):
        f.store.retrieve_hidden_states_into(TOKENS, np.zeros((16, DIM), np.int32))
    with pytest.raises(ValueError, match="out.rows"):
        f.store.retrieve_hidden_states_into(TOKENS, np.zeros((4, DIM), np.float32))
    with pytest.raises(ValueError, match="layer_idxs"):
        f.store.retrieve_layers(TOKENS, [])
    with pytest.raises(ValueError, match="storage_manager"):
        f.store.bind_storage_manager(object())
    assert f.roundtrip_ok()


def test_closed_store_raises_error():
    f = Fixture()
    f.store.close()
    f.store.close()  # idempotent
    with pytest.raises(hsstore.Error, match="closed"):
        f.store.store_hidden_states(TOKENS, rows(2 * CHUNK))
    with pytest.raises(hsstore.Error, match="closed"):
        f.store.retrieve_hidden_states(TOKENS)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="token_database"):
        hsstore.HiddenStateStore(Fixture().config, object())
    with pytest.raises(hsstore.ConfigError, match="max_hidden_state_cpu_size"):
        hsstore.HiddenStateStore({"max_hidden_state_cpu_size": 0}, hsstore.ChunkedTokenDatabase())


class _OnOtherDevice:
    """A producer whose DLPack tensor claims a device hsstore cannot use (ROCm, type 10)."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (10, 0)

    def __dlpack__(self, stream=None, **kwargs):
        import ctypes

        capsule = self.array.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        tensor = get(capsule, b"dltensor")
        ctypes.c_int32.from_address(tensor + 8).value = 10  # DLTensor.device.device_type
        return capsule


def test_unusable_device_is_value_error():
    f = Fixture()
    with pytest.raises(ValueError, match="hidden_states is on DLPack device type 10"):
        f.store.store_hidden_states(TOKENS, _OnOtherDevice(rows(2 * CHUNK)))
    with pytest.raises(ValueError, match="token_ids must be on the CPU"):
        f.store.retrieve_hidden_states(_OnOtherDevice(np.arange(16, dtype=np.int64)))
    assert f.store.stats()["stores"] == 0
    assert f.roundtrip_ok()
