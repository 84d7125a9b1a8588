"""hsstore._hsstore.PoolTransfer from Python, no transport needed: a consumer's begin_pull over token
ids or over a caller's (start, end, key) chunk list (hsstore.vllm keys chunks with LMCache's keys,
not the store's token database), starting at the first chunk not held for every layer and ending
at the first chunk whose KV this side lacks."""

import numpy as np
import pytest

import hsstore
from hsstore import _hsstore

CHUNK = 4
CONFIG = {"chunk_size": CHUNK, "enable_hidden_state_cache": True, "max_hidden_state_cpu_size": 0.01}


class KvPresence:
    """KV on this side for every chunk but those whose chunk_hash is in `gone`."""

    def __init__(self):
        self.gone = set()

    def contains(self, key, search_range=None, pin=False):
        return key.chunk_hash not in self.gone


def keyed(n, base):
    return [(CHUNK * i, CHUNK * (i + 1), hsstore.CacheEngineKey(model_name="m", chunk_hash=base + i))
            for i in range(n)]


def rows(n):
    return np.arange(n * 16, dtype=np.float32).reshape(n, 16)


def test_begin_pull_over_a_callers_chunk_list():
    engine = hsstore.Engine(CONFIG)
    store = engine.hidden_state_store
    kv = KvPresence()
    store.bind_storage_manager(kv)
    transfer = _hsstore.PoolTransfer(store)
    chunks = keyed(4, 7000)

    pull = transfer.begin_pull(chunks, [0, 1])
    assert (pull.first_chunk, pull.end_chunk) == (0, 4)
    # Chunks 0-1 held for both layers, chunk 2 for layer 0 only: the pull starts at chunk 2.
    for layer in (0, 1):
        store.store_chunks(chunks[:2], rows(2 * CHUNK), layer_idx=layer)
    store.store_chunks(chunks[:3], rows(CHUNK), layer_idx=0, token_offset=2 * CHUNK)
    pull = transfer.begin_pull(chunks, [0, 1])
    assert (pull.first_chunk, pull.end_chunk) == (2, 4)
    assert transfer.begin_pull(chunks, [0]).first_chunk == 3
    # Chunk 3's KV is gone on this side: not worth pulling.
    kv.gone.add(7003)
    pull = transfer.begin_pull(chunks, [0, 1])
    assert (pull.first_chunk, pull.end_chunk) == (2, 3)
    # The same chunk list as a tuple, and held throughout: nothing to pull.
    assert transfer.begin_pull(tuple(chunks), [0]) is None


def test_begin_pull_over_token_ids_uses_the_stores_token_database():
    engine = hsstore.Engine(CONFIG)
    store = engine.hidden_state_store
    store.bind_storage_manager(None)
    transfer = _hsstore.PoolTransfer(store)
    tokens = list(range(3 * CHUNK))
    store.store_hidden_states(tokens[:CHUNK], rows(CHUNK), layer_idx=0)
    pull = transfer.begin_pull(tokens, [0])
    assert (pull.first_chunk, pull.end_chunk) == (1, 3)
    # The store's own chunks for those tokens are the same pull.
    same = transfer.begin_pull(engine.token_database.process_tokens(tokens), [0])
    assert (same.first_chunk, same.end_chunk, same.request) == (1, 3, pull.request)


@pytest.mark.parametrize("bad", [[(0, 4, "not a key")], [(0, 4)], "tokens"])
def test_begin_pull_refuses_a_malformed_chunk_list_naming_it(bad):
    engine = hsstore.Engine(CONFIG)
    transfer = _hsstore.PoolTransfer(engine.hidden_state_store)
    with pytest.raises(hsstore.InvalidArgument, match="token_ids"):
        transfer.begin_pull(bad, [0])
