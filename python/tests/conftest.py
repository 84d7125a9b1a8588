"""Shared fixtures. CUDA tests carry @pytest.mark.cuda and skip without a CUDA device, so
`pytest python/tests -m cuda` runs just them on a GPU machine (torch not required: the torch-free
ones use hsstore._DeviceBuffer; the torch ones also need torch.cuda)."""

import numpy as np
import pytest

import hsstore

CHUNK = 8
DIM = 16


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and torch.cuda")


def pytest_collection_modifyitems(config, items):
    """`cuda` tests need a CUDA device visible to hsstore (a CUDA build); those that also use
    torch skip themselves when torch.cuda is unavailable."""
    from hsstore import _hsstore

    if _hsstore._cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device (or hsstore built without CUDA)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


def make_config(**overrides):
    values = {
        "chunk_size": CHUNK,
        "enable_hidden_state_cache": True,
        "max_hidden_state_cpu_size": 0.01,
        "max_local_cpu_size": 0.01,
    }
    values.update(overrides)
    return hsstore.Config(values)


class FakeStorageManager:
    """LMCache's test pattern: the set of keys whose KV is present."""

    def __init__(self):
        self.present = set()
        self.calls = 0

    def contains(self, key, search_range=None, pin=False):
        self.calls += 1
        return "LocalCPUBackend" if key in self.present else None


class Fixture:
    def __init__(self, **overrides):
        self.config = make_config(**overrides)
        self.db = hsstore.ChunkedTokenDatabase(self.config, hsstore.Metadata(model_name="m"))
        self.sm = FakeStorageManager()
        self.store = hsstore.HiddenStateStore(self.config, self.db)
        self.store.bind_storage_manager(self.sm)

    def keys_for(self, tokens):
        return [key for _, _, key in self.db.process_tokens(tokens=tokens)]

    def mark_kv_present(self, keys):
        self.sm.present.update(keys)

    def roundtrip_ok(self):
        """A valid store + retrieve on fresh tokens still works (used after every bad input)."""
        tokens = list(range(10_000, 10_000 + 2 * CHUNK))
        self.mark_kv_present(self.keys_for(tokens))
        rows = np.random.default_rng(7).standard_normal((2 * CHUNK, DIM)).astype(np.float32)
        self.store.store_hidden_states(tokens, rows)
        out = self.store.retrieve_hidden_states(tokens, like="numpy")
        return out is not None and np.array_equal(out, rows)


@pytest.fixture
def fix():
    f = Fixture()
    yield f
    f.store.close()


def rows(n, dim=DIM, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
