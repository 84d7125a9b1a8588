"""coverage_by_tier through the Python API: the prefix a retrieve would return (the pool and the
disk tier) and, per chunk, the tier it is read from."""

import numpy as np

from conftest import CHUNK, DIM, Fixture


def test_coverage_by_tier_names_host_and_disk_chunks(tmp_path):
    f = Fixture(local_disk=str(tmp_path))
    tokens = list(range(4 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    assert f.store.coverage_by_tier(tokens) == (0, [])
    rows = np.random.default_rng(3).standard_normal((len(tokens), DIM)).astype(np.float32)
    assert f.store.store_hidden_states(tokens, rows) == 4
    f.store.flush()  # every chunk is on disk too
    assert f.store.coverage_by_tier(tokens) == (4 * CHUNK, ["host"] * 4)
    # Pool pressure: the least recently used chunk (the first) leaves the pool, not the disk.
    assert f.store.evict_one_lru()
    f.store.flush()
    assert f.store.coverage_by_tier(tokens) == (4 * CHUNK, ["disk", "host", "host", "host"])
    assert f.store.coverage(tokens) == 0  # the pool alone no longer starts the prefix
    # A retrieve promotes it back, bit-exact.
    out = f.store.retrieve_hidden_states(tokens, like="numpy")
    assert np.array_equal(out, rows)
    assert f.store.coverage_by_tier(tokens) == (4 * CHUNK, ["host"] * 4)
    # KV evicted at the third chunk: the prefix ends there in every tier.
    f.sm.present.discard(f.keys_for(tokens)[2])
    assert f.store.coverage_by_tier(tokens) == (2 * CHUNK, ["host"] * 2)
    # A layer never stored: nothing.
    assert f.store.coverage_by_tier(tokens, [5]) == (0, [])
