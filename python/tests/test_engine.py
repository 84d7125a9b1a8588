import numpy as np

import hsstore
from conftest import CHUNK, DIM, make_config, rows


def test_disabled_engine_has_no_store():
    engine = hsstore.Engine(make_config(enable_hidden_state_cache=False))
    assert engine.hidden_state_store is None


def test_engine_couples_kv_and_hidden_states():
    engine = hsstore.Engine(make_config(), hsstore.Metadata(model_name="m", worker_id=2))
    store = engine.hidden_state_store
    assert store is engine.hidden_state_store
    assert engine.metadata.worker_id == 2
    tokens = list(range(3 * CHUNK))
    kv = np.ones((3 * CHUNK, 4), np.float16)
    assert engine.store(tokens, kv) == 3
    assert engine.lookup(tokens) == 3 * CHUNK
    data = rows(3 * CHUNK)
    assert store.store_hidden_states(tokens, data) == 3
    np.testing.assert_array_equal(store.retrieve_hidden_states(tokens, like="numpy"), data)
    # KV eviction of the middle chunk truncates the hidden-state prefix.
    keys = [k for *_, k in engine.token_database.process_tokens(tokens)]
    assert engine.kv_backend.remove(keys[1])
    np.testing.assert_array_equal(store.retrieve_hidden_states(tokens, like="numpy"), data[:CHUNK])
    assert not store.has_chunk(keys[1])
    kv_out = np.zeros_like(kv)
    assert engine.retrieve(tokens, kv_out) == CHUNK


def test_store_bound_to_native_kv_backend():
    config = make_config()
    db = hsstore.ChunkedTokenDatabase(config)
    store = hsstore.HiddenStateStore(config, db)
    kv = hsstore.LocalCpuBackend(1 << 20)
    store.bind_storage_manager(kv)
    assert store.storage_manager is kv
    tokens = list(range(2 * CHUNK))
    keys = [k for *_, k in db.process_tokens(tokens)]
    store.store_hidden_states(tokens, rows(2 * CHUNK))
    assert store.retrieve_hidden_states(tokens) is None  # no KV yet: both dropped
    store.store_hidden_states(tokens, rows(2 * CHUNK))
    assert kv.put(keys[0], b"kv0")
    assert kv.contains(keys[0]) and kv.contains(keys[0], None, False)
    assert store.retrieve_hidden_states(tokens, like="numpy").shape == (CHUNK, DIM)
