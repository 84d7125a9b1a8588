"""FP8 storage (hidden_state_storage_dtype fp8_e4m3 / fp8_e5m2) through the Python API: a store
round-trips within the stated bound (per element, |restored - x| <= row amax / 28 for E4M3,
/ 14 for E5M2; docs/design.md, "FP8 storage"), and the config names and rules."""

import numpy as np
import pytest

import hsstore
from conftest import CHUNK, DIM, Fixture

BOUND = {"fp8_e4m3": 1 / 28, "fp8_e5m2": 1 / 14}


def _rows(n, dim, seed):
    rng = np.random.default_rng(seed)
    # Rows of very different magnitudes: each is quantised against its own scale.
    magnitude = 10.0 ** rng.integers(-4, 5, size=(n, 1))
    return (rng.standard_normal((n, dim)) * magnitude).astype(np.float32)


@pytest.mark.parametrize("storage", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_store_round_trips_within_the_bound(storage):
    f = Fixture(hidden_state_storage_dtype=storage)
    assert f.config.hidden_state_storage_dtype == storage
    tokens = list(range(3 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    data = _rows(len(tokens), DIM, 1)
    assert f.store.store_hidden_states(tokens, data) == 3
    out = f.store.retrieve_hidden_states(tokens, like="numpy")
    assert out.dtype == np.float32 and out.shape == data.shape
    amax = np.abs(data).max(axis=1, keepdims=True)
    err = np.abs(out.astype(np.float64) - data) / amax
    assert err.max() <= BOUND[storage] * (1 + 1e-5)
    assert err.max() > 0  # lossy, as documented
    assert np.isfinite(out).all()


@pytest.mark.parametrize("storage", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_store_of_float16_input_round_trips_within_the_bound(storage):
    f = Fixture(hidden_state_storage_dtype=storage)
    tokens = list(range(100, 100 + 2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    data = _rows(len(tokens), DIM, 2).clip(-6e4, 6e4).astype(np.float16)
    assert f.store.store_hidden_states(tokens, data) == 2
    out = f.store.retrieve_hidden_states(tokens, like="numpy")
    wide = data.astype(np.float64)
    amax = np.abs(wide).max(axis=1, keepdims=True)
    assert (np.abs(out - wide) / amax).max() <= BOUND[storage] * (1 + 1e-5)


def test_fp8_is_opt_in_and_goes_to_the_backing_tiers():
    assert hsstore.Config({}).hidden_state_storage_dtype == "float32"
    # FP8 rows travel with their scales through the tiers and P/D transfer (wire codes 3, 4).
    c = hsstore.Config(
        {"hidden_state_storage_dtype": "fp8_e4m3", "hidden_state_remote_url": "redis://h:1"}
    )
    assert c.hidden_state_storage_dtype == "fp8_e4m3"
    with pytest.raises(hsstore.ConfigError, match="hidden_state_storage_dtype"):
        hsstore.Config({"hidden_state_storage_dtype": "fp8"})
