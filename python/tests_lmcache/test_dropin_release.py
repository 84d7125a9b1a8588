"""At interpreter exit hsstore.lmcache closes and releases every drop-in store still alive.
LMCache 0.5.6 keeps a closed engine (and so its store) reachable from its lookup server's thread
and its thread registry until the interpreter stops; the native store then outlived the
interpreter's last collection (nanobind's "leaked instance" lines at the end of some
`make test-vllm` runs, depending on thread timing) and a store never closed lost its write-behind.
The exit hook is called directly here, on a store only a reference cycle and a thread keep."""

import threading

import pytest
import torch

import hsstore.lmcache
from test_engine_dropin import CHUNK, DIM, RealEngine


@pytest.fixture(autouse=True)
def dropin_installed():
    hsstore.lmcache.install()
    yield
    hsstore.lmcache.uninstall()


def test_the_exit_hook_closes_and_releases_a_live_store():
    eng = RealEngine(instance="hsstore_release")
    store = eng.store
    tokens = list(range(10, 10 + 4 * CHUNK))
    rows = torch.randn(4 * CHUNK, DIM)
    assert store.store_hidden_states(tokens, rows) == 4
    stop = threading.Event()
    holder = threading.Thread(target=lambda e=eng: stop.wait(), daemon=True)  # LMCache's thread
    holder.start()
    native = store.native
    assert store in hsstore.lmcache._live

    hsstore.lmcache._release_live_stores()

    assert store not in hsstore.lmcache._live
    assert isinstance(store.native, hsstore.lmcache._ReleasedStore)
    with pytest.raises(RuntimeError, match="released the store"):
        store.retrieve_hidden_states(tokens)
    with pytest.raises(Exception):  # the native store was closed before it was let go
        native.retrieve_chunks(store.chunks(tokens), layer_idx=0)
    store.close()  # LMCache's engine.close() after the hook: a no-op, never an error
    eng.engine.close()
    stop.set()
    holder.join()


def test_a_store_released_once_is_not_released_again():
    eng = RealEngine(instance="hsstore_release2")
    store = eng.store
    hsstore.lmcache._release_live_stores()
    released = store.native
    hsstore.lmcache._release_live_stores()
    assert store.native is released
    eng.engine.close()
