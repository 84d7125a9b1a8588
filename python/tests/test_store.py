"""hsstore.HiddenStateStore through its LMCache-compatible API: the counterparts of LMCache's
own HiddenStateStore tests, with NumPy inputs, plus the C++ API's extras."""

import math
import os
import threading

import numpy as np
import pytest

import hsstore
from conftest import CHUNK, DIM, Fixture, rows


def test_chunks_align_with_kv_keys(fix):
    tokens = list(range(3 * CHUNK))
    keys = fix.keys_for(tokens)
    fix.mark_kv_present(keys)
    assert fix.store.store_hidden_states(tokens, rows(len(tokens))) == 3
    assert all(fix.store.has_chunk(k, layer_idx=0) for k in keys)
    assert not fix.store.has_chunk(keys[0], layer_idx=1)


def test_roundtrip_numpy_and_result_owns_memory(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    data = rows(len(tokens))
    assert fix.store.store_hidden_states(tokens, data) == 2
    assert fix.store.store_hidden_states(tokens, data) == 0  # LMCache: newly written only
    out = fix.store.retrieve_hidden_states(tokens, like="numpy")
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, data)
    fix.store.drop_key(fix.keys_for(tokens)[0])
    fix.store.close()
    np.testing.assert_array_equal(out, data)  # the result's memory is its own HostTensor


def test_float16_and_strided_input(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    wide = rows(len(tokens), 2 * DIM)
    view = wide[:, :DIM]  # row stride 2*DIM: describable, read in place
    assert fix.store.store_hidden_states(tokens, view.astype(np.float16)) == 2
    out = fix.store.retrieve_hidden_states(tokens, like="numpy")
    np.testing.assert_array_equal(out, view.astype(np.float16).astype(np.float32))
    fix2 = Fixture()
    fix2.mark_kv_present(fix2.keys_for(tokens))
    fix2.store.store_hidden_states(tokens, view)
    np.testing.assert_array_equal(fix2.store.retrieve_hidden_states(tokens, like="numpy"), view)


def test_kv_eviction_truncates_retrieved_prefix(fix):
    tokens = list(range(3 * CHUNK))
    keys = fix.keys_for(tokens)
    fix.mark_kv_present(keys)
    data = rows(len(tokens))
    fix.store.store_hidden_states(tokens, data)
    assert fix.store.num_cached_chunks() == 3
    fix.sm.present.discard(keys[1])
    out = fix.store.retrieve_hidden_states(tokens, like="numpy")
    np.testing.assert_array_equal(out, data[:CHUNK])
    assert not fix.store.has_chunk(keys[1])  # KV evicted -> HS dropped lazily
    assert fix.store.stats()["coupled_evictions"] == 1


def test_retrieve_refreshes_lru_in_reverse_prefix_order(fix):
    tokens = list(range(3 * CHUNK))
    keys = fix.keys_for(tokens)
    fix.mark_kv_present(keys)
    fix.store.store_hidden_states(tokens, rows(len(tokens)))
    assert fix.store.lru_keys() == keys
    fix.store.retrieve_hidden_states(tokens)
    assert fix.store.lru_keys() == [keys[2], keys[1], keys[0]]
    assert fix.store.evict_one_lru()
    assert fix.store.has_chunk(keys[0]) and fix.store.has_chunk(keys[1])
    assert not fix.store.has_chunk(keys[2])


def test_hs_eviction_does_not_touch_kv(fix):
    tokens = list(range(2 * CHUNK))
    keys = fix.keys_for(tokens)
    fix.mark_kv_present(keys)
    fix.store.store_hidden_states(tokens, rows(len(tokens)))
    assert fix.store.drop_key(keys[0])
    assert not fix.store.drop_key(keys[0])
    assert set(keys) <= fix.sm.present


def test_middle_hole_cuts_prefix(fix):
    tokens = list(range(3 * CHUNK))
    keys = fix.keys_for(tokens)
    fix.mark_kv_present(keys)
    data = rows(len(tokens))
    fix.store.store_hidden_states(tokens, data)
    fix.store.drop_key(keys[1])
    np.testing.assert_array_equal(fix.store.retrieve_hidden_states(tokens, like="numpy"),
                                  data[:CHUNK])


def test_multi_layer_and_retrieve_layers(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    l0, l3 = rows(len(tokens), seed=1), rows(len(tokens), seed=3)
    assert fix.store.store_hidden_states(tokens, l0, layer_idx=0) == 2
    assert fix.store.store_hidden_states(tokens, l3, layer_idx=3) == 2
    np.testing.assert_array_equal(fix.store.retrieve_hidden_states(tokens, layer_idx=3,
                                                                   like="numpy"), l3)
    assert fix.store.retrieve_hidden_states(tokens, layer_idx=99) is None
    out = fix.store.retrieve_layers(tokens, [0, 3], like="numpy")
    assert len(out) == 2
    np.testing.assert_array_equal(out[0], l0)
    np.testing.assert_array_equal(out[1], l3)
    assert fix.store.retrieve_layers(tokens, [0, 99]) == []
    assert fix.store.coverage(tokens, [0, 3]) == 2 * CHUNK
    assert fix.store.coverage(fix.db.process_tokens(tokens), [0]) == 2 * CHUNK
    assert fix.store.coverage(tokens, [99]) == 0
    assert fix.store.num_cached_chunks() == 2  # distinct keys, as in LMCache


def test_layer_allowlist():
    f = Fixture(hidden_state_layers=[0])
    tokens = list(range(CHUNK))
    keys = f.keys_for(tokens)
    assert f.store.store_hidden_states(tokens, rows(CHUNK), layer_idx=0) == 1
    assert f.store.store_hidden_states(tokens, rows(CHUNK), layer_idx=1) == 0
    assert f.store.has_chunk(keys[0], 0) and not f.store.has_chunk(keys[0], 1)


def test_independent_pools():
    a, b = Fixture(), Fixture()
    tokens = list(range(4 * CHUNK))
    a.store.store_hidden_states(tokens, rows(len(tokens)))
    assert a.store.num_cached_chunks() == 4
    assert b.store.num_cached_chunks() == 0


def test_unbound_storage_manager_treats_kv_as_present():
    f = Fixture()
    f.store.bind_storage_manager(None)
    assert f.store.storage_manager is None
    tokens = list(range(2 * CHUNK))
    f.store.store_hidden_states(tokens, rows(len(tokens)))
    assert f.store.retrieve_hidden_states(tokens, like="numpy").shape == (2 * CHUNK, DIM)
    assert f.sm.calls == 0


def test_token_offset_incremental(fix):
    tokens = list(range(2 * CHUNK))
    keys = fix.keys_for(tokens)
    fix.mark_kv_present(keys)
    data = rows(len(tokens))
    assert fix.store.store_hidden_states(tokens[:CHUNK], data[:CHUNK]) == 1
    assert fix.store.store_hidden_states(tokens, data[CHUNK:], token_offset=CHUNK) == 1
    np.testing.assert_array_equal(fix.store.retrieve_hidden_states(tokens, like="numpy"), data)


def test_row_begin_and_retrieve_into(fix):
    tokens = list(range(3 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    data = rows(len(tokens))
    fix.store.store_hidden_states(tokens, data)
    tail = fix.store.retrieve_hidden_states(tokens, row_begin=3 * CHUNK - 2, like="numpy")
    np.testing.assert_array_equal(tail, data[-2:])
    assert fix.store.retrieve_hidden_states(tokens, row_begin=3 * CHUNK) is None
    out = np.zeros((3 * CHUNK, DIM), np.float32)
    assert fix.store.retrieve_hidden_states_into(tokens, out) == 3 * CHUNK
    np.testing.assert_array_equal(out, data)
    out2 = np.zeros((3 * CHUNK, DIM), np.float32)
    assert fix.store.retrieve_hidden_states_into(tokens, out2, row_begin=CHUNK) == 2 * CHUNK
    np.testing.assert_array_equal(out2[: 2 * CHUNK], data[CHUNK:])
    # The output view's dtype decides what is written: float16 rounds to nearest-even.
    out16 = np.zeros((3 * CHUNK, DIM), np.float16)
    assert fix.store.retrieve_hidden_states_into(tokens, out16) == 3 * CHUNK
    np.testing.assert_array_equal(out16, data.astype(np.float16))


def test_token_id_forms(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    data = rows(len(tokens))
    fix.store.store_hidden_states(np.array(tokens, np.int32), data)
    for form in (tokens, tuple(tokens), np.array(tokens, np.int64), np.array(tokens, np.uint16),
                 np.repeat(np.array(tokens, np.int64), 2)[::2]):
        np.testing.assert_array_equal(fix.store.retrieve_hidden_states(form, like="numpy"), data)


def expected_auto_copy_threads() -> int:
    """What hidden_state_copy_threads: auto should choose here, read independently."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except OSError:
        pass
    return min(cpus, 8)


def test_copy_threads_default_and_explicit():
    assert hsstore.Config({}).hidden_state_copy_threads is None  # auto
    assert hsstore.Config({}).effective_copy_threads == expected_auto_copy_threads()
    assert hsstore.Config({"hidden_state_copy_threads": "auto"}).hidden_state_copy_threads is None
    three = hsstore.Config({"hidden_state_copy_threads": 3})
    assert three.hidden_state_copy_threads == 3 and three.effective_copy_threads == 3
    assert hsstore.Config(hsstore.Config({}).to_dict()).hidden_state_copy_threads is None
    with pytest.raises(ValueError, match="hidden_state_copy_threads"):
        hsstore.Config({"hidden_state_copy_threads": 0})


def test_stats_and_context_manager():
    with Fixture().store as store:
        assert store.stats()["entries_held"] == 0
        host_copy = store.stats()["host_copy"]  # the C++ HostCopyStats, key for key
        assert host_copy["copies"] in ("regular", "streaming")
        assert host_copy["widening"] in ("regular", "streaming")
        assert host_copy["chosen_by"] in ("calibration", "cpu rule", "config", "environment")
        # auto, the default: this thread's CPUs lowered by the cgroup quota, at most 8.
        assert host_copy["copy_threads"] == expected_auto_copy_threads()
        assert host_copy["copy_threads_auto"] is True
        assert host_copy["copy_threads_reason"].startswith("auto: ")
        assert host_copy["copy_workers_started"] == 0  # no copy large enough to split yet
        assert host_copy["min_bytes_per_copy_thread"] >= 4096
        assert host_copy["split_copies"] == 0
        assert host_copy["summary"] and host_copy["cpu"]
    with pytest.raises(hsstore.Error, match="closed"):
        store.num_cached_chunks() if False else store.store_hidden_states(
            list(range(CHUNK)), rows(CHUNK))


def test_storage_manager_exception_propagates(fix):
    tokens = list(range(CHUNK))
    fix.store.store_hidden_states(tokens, rows(CHUNK))

    class Broken:
        def contains(self, key, search_range=None, pin=False):
            raise KeyError("kv backend down")

    fix.store.bind_storage_manager(Broken())
    with pytest.raises(KeyError, match="kv backend down"):
        fix.store.retrieve_hidden_states(tokens)
    fix.store.bind_storage_manager(fix.sm)
    assert fix.roundtrip_ok()


def test_many_python_threads(fix):
    """Distinct token ranges from 4 threads; the GIL is released inside each call."""
    errors = []

    def worker(t):
        try:
            for i in range(20):
                tokens = list(range(100_000 * (t + 1) + i * 64, 100_000 * (t + 1) + i * 64 + 2 * CHUNK))
                fix.mark_kv_present(fix.keys_for(tokens))
                data = rows(2 * CHUNK, seed=t * 100 + i)
                fix.store.store_hidden_states(tokens, data)
                out = fix.store.retrieve_hidden_states(tokens, like="numpy")
                if out is None or not np.array_equal(out, data):
                    errors.append((t, i))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert fix.store.num_cached_chunks() == 4 * 20 * 2


def test_cycle_through_storage_manager_is_collected():
    import gc
    import weakref

    f = Fixture()

    class Manager:
        def __init__(self, store):
            self.store = store  # refers back: store -> manager -> store

        def contains(self, key, search_range=None, pin=False):
            return True

    manager = Manager(f.store)
    f.store.bind_storage_manager(manager)
    alive = weakref.ref(manager)
    del manager, f
    gc.collect()
    assert alive() is None


def test_how_tensors_are_seen():
    from hsstore import _hsstore

    assert _hsstore._roundtrip_tensor(np.zeros((2, 3), np.float32)) == (2, 3, 3, "float32", "host")
    view = np.zeros((4, 6), np.float16)[:, :3]
    assert _hsstore._roundtrip_tensor(view) == (4, 3, 6, "float16", "host")
    assert _hsstore._roundtrip_tensor(np.zeros((1, 5), np.float32)[:, ::1]) == (1, 5, 5, "float32", "host")
