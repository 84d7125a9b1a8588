"""The disk tier in stats()["tiers"]: its name, how it reads ("direct": O_DIRECT, where its
directory takes it; "buffered": through the page cache, where the file system refuses O_DIRECT,
as tmpfs does) and its counters, read after a value was served from it."""

import errno
import os

import numpy as np

from conftest import CHUNK, DIM, Fixture


def o_direct_taken(directory):
    """Whether a new file in `directory` opens with O_DIRECT (EINVAL: refused)."""
    probe = os.path.join(directory, ".read-mode-probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    os.unlink(probe)
    return True


def test_a_store_without_tiers_lists_none():
    assert Fixture().store.stats()["tiers"] == []


def test_the_disk_tier_reports_its_read_mode(tmp_path):
    f = Fixture(local_disk=str(tmp_path))
    expected = "direct" if o_direct_taken(str(tmp_path / "hsstore")) else "buffered"
    tiers = f.store.stats()["tiers"]
    assert [t["name"] for t in tiers] == ["disk"]
    assert tiers[0]["read_mode"] == expected

    # A chunk served from the disk: read in that mode, which stays.
    tokens = list(range(2 * CHUNK))
    f.mark_kv_present(f.keys_for(tokens))
    rows = np.random.default_rng(5).standard_normal((len(tokens), DIM)).astype(np.float32)
    assert f.store.store_hidden_states(tokens, rows) == 2
    f.store.flush()
    assert f.store.evict_one_lru()
    assert np.array_equal(f.store.retrieve_hidden_states(tokens, like="numpy"), rows)
    disk = f.store.stats()["tiers"][0]
    assert (disk["hits"], disk["promotions"], disk["entries_held"]) == (1, 1, 2)
    assert disk["read_mode"] == expected
