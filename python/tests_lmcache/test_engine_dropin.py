"""hsstore.lmcache.install() inside a real LMCache 0.5.6 LMCacheEngine: the engine builds the
drop-in, post_init() binds its real StorageManager, KV lives in LMCache's real LocalCPUBackend.
Each LMCache HiddenStateStore test case has a counterpart here, run through the engine."""

import pytest
import torch
from unittest.mock import MagicMock

import hsstore.lmcache
from lmcache.v1.cache_engine import LMCacheEngine
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.token_database import ChunkedTokenDatabase
import lmcache.v1.hidden_state_store as lmcache_hss

CHUNK = 8
DIM = 16


class RealEngine:
    def __init__(self, *, layers=None, enable=True, instance="hsstore_dropin", extra_config=None):
        self.config = LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK,
            local_cpu=True,
            max_local_cpu_size=0.05,
            local_disk=None,
            max_local_disk_size=0,
            remote_url=None,
            save_unfull_chunk=False,
            enable_hidden_state_cache=enable,
            max_hidden_state_cpu_size=0.05,
            hidden_state_layers=layers,
            enable_async_loading=False,
            use_layerwise=False,
            lmcache_instance_id=instance,
            extra_config=extra_config,
        )
        self.metadata = LMCacheMetadata(
            model_name="test_model", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(1, 2, CHUNK, 1, DIM),
            chunk_size=CHUNK,
        )
        self.db = ChunkedTokenDatabase(self.config, self.metadata)
        self.engine = LMCacheEngine(self.config, self.metadata, self.db,
                                    MagicMock(spec=GPUConnectorInterface), MagicMock(), MagicMock())
        self.engine.post_init()
        self.store = self.engine.hidden_state_store
        sm = self.engine.storage_manager
        self.kv = sm.storage_backends["LocalCPUBackend"] if sm is not None else None

    def keys_for(self, tokens):
        return [key for _, _, key in self.db.process_tokens(tokens=tokens)]

    def put_kv(self, keys):
        for key in keys:
            obj = self.kv.allocate(torch.Size([2, CHUNK, 1, DIM]), torch.bfloat16,
                                   fmt=MemoryFormat.KV_2LTD)
            self.kv.submit_put_task(key, obj)
            obj.ref_count_down()

    def evict_kv(self, key):
        assert self.kv.remove(key)

    def close(self):
        self.engine.close()


@pytest.fixture(autouse=True)
def dropin_installed():
    hsstore.lmcache.install()
    assert hsstore.lmcache.installed()
    yield
    hsstore.lmcache.uninstall()
    assert not hsstore.lmcache.installed()


@pytest.fixture
def eng():
    e = RealEngine()
    yield e
    e.close()


def test_engine_builds_the_dropin_and_binds_its_storage_manager(eng):
    assert isinstance(eng.store, hsstore.lmcache.HiddenStateStore)
    assert eng.store._storage_manager is eng.engine.storage_manager


def test_uninstall_restores_lmcache_store():
    hsstore.lmcache.uninstall()
    e = RealEngine(instance="hsstore_dropin_orig")
    try:
        assert type(e.store) is lmcache_hss.HiddenStateStore
    finally:
        e.close()
        hsstore.lmcache.install()


def test_disabled_engine_has_no_store():
    e = RealEngine(enable=False, instance="hsstore_dropin_off")
    try:
        assert e.store is None
    finally:
        e.close()


def test_roundtrip_and_chunk_alignment(eng):
    tokens = list(range(3 * CHUNK))
    keys = eng.keys_for(tokens)
    eng.put_kv(keys)
    rows = torch.randn(len(tokens), DIM)
    assert eng.store.store_hidden_states(tokens, rows) == 3
    assert eng.store.store_hidden_states(tokens, rows) == 0
    assert all(eng.store.has_chunk(k) for k in keys)
    out = eng.store.retrieve_hidden_states(tokens)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, rows)


def test_kv_eviction_truncates_prefix(eng):
    tokens = list(range(3 * CHUNK))
    keys = eng.keys_for(tokens)
    eng.put_kv(keys)
    rows = torch.randn(len(tokens), DIM)
    eng.store.store_hidden_states(tokens, rows)
    eng.evict_kv(keys[1])
    out = eng.store.retrieve_hidden_states(tokens)
    torch.testing.assert_close(out, rows[:CHUNK])
    assert not eng.store.has_chunk(keys[1])
    assert eng.store.has_chunk(keys[2])  # not walked past the cut


def test_reverse_order_lru_touch(eng):
    tokens = list(range(3 * CHUNK))
    keys = eng.keys_for(tokens)
    eng.put_kv(keys)
    eng.store.store_hidden_states(tokens, torch.randn(len(tokens), DIM))
    assert list(eng.store._lru.keys()) == keys
    eng.store.retrieve_hidden_states(tokens)
    assert list(eng.store._lru.keys()) == [keys[2], keys[1], keys[0]]
    assert eng.store._evict_one_lru()
    assert eng.store.has_chunk(keys[0]) and eng.store.has_chunk(keys[1])
    assert not eng.store.has_chunk(keys[2])


def test_hs_eviction_does_not_touch_kv(eng):
    tokens = list(range(2 * CHUNK))
    keys = eng.keys_for(tokens)
    eng.put_kv(keys)
    eng.store.store_hidden_states(tokens, torch.randn(len(tokens), DIM))
    assert eng.store.drop_key(keys[0])
    assert all(eng.engine.storage_manager.contains(k) is not None for k in keys)


def test_middle_hole_cutoff(eng):
    tokens = list(range(3 * CHUNK))
    keys = eng.keys_for(tokens)
    eng.put_kv(keys)
    rows = torch.randn(len(tokens), DIM)
    eng.store.store_hidden_states(tokens, rows)
    eng.store.drop_key(keys[1])
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens), rows[:CHUNK])


def test_multi_layer(eng):
    tokens = list(range(2 * CHUNK))
    eng.put_kv(eng.keys_for(tokens))
    l0, l3 = torch.randn(len(tokens), DIM), torch.randn(len(tokens), DIM)
    assert eng.store.store_hidden_states(tokens, l0, layer_idx=0) == 2
    assert eng.store.store_hidden_states(tokens, l3, layer_idx=3) == 2
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens, layer_idx=0), l0)
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens, layer_idx=3), l3)
    assert eng.store.retrieve_hidden_states(tokens, layer_idx=99) is None
    assert eng.store.num_cached_chunks() == 2


def test_allowlist():
    e = RealEngine(layers=[0], instance="hsstore_dropin_allow")
    try:
        tokens = list(range(CHUNK))
        keys = e.keys_for(tokens)
        e.put_kv(keys)
        rows = torch.randn(CHUNK, DIM)
        assert e.store.store_hidden_states(tokens, rows, layer_idx=0) == 1
        assert e.store.store_hidden_states(tokens, rows, layer_idx=1) == 0
        assert e.store.has_chunk(keys[0], layer_idx=0)
        assert not e.store.has_chunk(keys[0], layer_idx=1)
    finally:
        e.close()


def test_independent_pools(eng):
    other = RealEngine(instance="hsstore_dropin_other")
    try:
        assert other.store._allocator is not eng.store._allocator
        tokens = list(range(4 * CHUNK))
        eng.store.store_hidden_states(tokens, torch.randn(len(tokens), DIM))
        assert eng.store.num_cached_chunks() == 4
        assert other.store.num_cached_chunks() == 0
    finally:
        other.close()


def test_unbound_storage_manager_returns_full_prefix(eng):
    eng.store.bind_storage_manager(None)
    tokens = list(range(2 * CHUNK))  # no KV at all
    rows = torch.randn(len(tokens), DIM)
    eng.store.store_hidden_states(tokens, rows)
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens), rows)


def test_shape_validation(eng):
    with pytest.raises(ValueError):
        eng.store.store_hidden_states([1, 2, 3], torch.randn(2, DIM))
    with pytest.raises(ValueError):
        eng.store.store_hidden_states([1, 2, 3], torch.randn(3))
    with pytest.raises(ValueError):
        eng.store.store_hidden_states(list(range(CHUNK)), torch.randn(CHUNK, DIM).double())


def test_token_offset_incremental_and_validation(eng):
    tokens = list(range(2 * CHUNK))
    keys = eng.keys_for(tokens)
    eng.put_kv(keys)
    rows = torch.randn(len(tokens), DIM)
    assert eng.store.store_hidden_states(tokens[:CHUNK], rows[:CHUNK], token_offset=0) == 1
    assert eng.store.store_hidden_states(tokens, rows[CHUNK:], token_offset=CHUNK) == 1
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens), rows)
    for offset, n in ((-1, CHUNK), (CHUNK + 1, 0), (2, CHUNK)):
        with pytest.raises(ValueError):
            eng.store.store_hidden_states(tokens[:CHUNK], torch.randn(n, DIM), token_offset=offset)


def test_partial_tail_rows_are_accepted_like_lmcache(eng):
    tokens = list(range(2 * CHUNK + 3))  # a partial chunk LMCache does not save
    eng.put_kv(eng.keys_for(tokens))
    rows = torch.randn(len(tokens), DIM)
    assert eng.store.store_hidden_states(tokens, rows) == 2
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens), rows[: 2 * CHUNK])


def test_torch_token_ids_and_bf16_rows(eng):
    tokens = torch.arange(2 * CHUNK)
    eng.put_kv(eng.keys_for(tokens))
    rows = torch.randn(2 * CHUNK, DIM).to(torch.bfloat16)
    assert eng.store.store_hidden_states(tokens, rows) == 2
    torch.testing.assert_close(eng.store.retrieve_hidden_states(tokens), rows.float())
