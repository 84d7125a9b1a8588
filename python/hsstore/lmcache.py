"""Drop-in replacement for LMCache's ``lmcache.v1.hidden_state_store.HiddenStateStore``.

:class:`HiddenStateStore` has the exact constructor and public methods of LMCache 0.5.6's class,
but keeps the hidden states in hsstore's native store. Chunks are keyed by LMCache's own token
database (``process_tokens`` gives ``(start, end, key)``), so hidden-state keys equal LMCache's KV
keys, and KV presence is answered per chunk by LMCache's own storage manager
(``contains(key) is not None``, as in LMCache), called back from the native store.

Making a real ``LMCacheEngine`` use it::

    import hsstore.lmcache
    hsstore.lmcache.install()      # before the engine is built
    # ... build LMCacheEngine as usual (LMCacheEngineBuilder, vLLM's connector, ...);
    # engine.hidden_state_store is now an hsstore.lmcache.HiddenStateStore.

``install()`` replaces ``lmcache.v1.cache_engine.HiddenStateStore``, the name ``LMCacheEngine``
constructs when ``enable_hidden_state_cache`` is true; ``uninstall()`` puts LMCache's class back.
Engines built before ``install()`` keep the store they have. It acts in the calling process only:
where the engine lives in worker processes (vLLM), call it there, e.g. from a ``sitecustomize.py``
on the workers' ``PYTHONPATH``.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

from . import _hsstore
from .salt import (NO_NAMESPACE, KeyNamespace, SaltedKey, namespace_fmt, salted,
                   split_request_keys)

__all__ = ["HiddenStateStore", "install", "install_none", "uninstall", "installed"]

_GIB = 1024**3


class _ReleasedStore:
    """What a drop-in store holds after interpreter exit released its native store: every call
    says so (a daemon thread of LMCache's may still call in while the interpreter stops)."""

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"hsstore.lmcache: {name}() after the interpreter's exit released the store")


# Every drop-in store alive, closed and released at interpreter exit: LMCache 0.5.6 keeps its
# engine (and so the store) reachable from threads and registries it never stops (its lookup
# server's thread, PeriodicThreadRegistry), so without this the native store outlived the
# interpreter's last collection (nanobind's "leaked instance" warnings) and its write-behind
# was never finished.
_live: "weakref.WeakSet[HiddenStateStore]" = weakref.WeakSet()


@atexit.register
def _release_live_stores() -> None:
    for store in list(_live):
        _live.discard(store)
        store._release()


def _native_key(key: Any, namespace: KeyNamespace = NO_NAMESPACE) -> _hsstore.CacheEngineKey:
    """hsstore's key for an LMCache CacheEngineKey, or for a SaltedKey: LMCache's key tags, the
    request's cache_salt and the store's `namespace` (model identity, salt key) folded into fmt
    by an injective encoding (hsstore.salt.namespace_fmt), so no two of them share keys."""
    salt = None
    if isinstance(key, SaltedKey):
        key, salt = key.key, key.salt
    fields = namespace.fields(salt, getattr(key, "tags", None) or ())
    return _hsstore.CacheEngineKey(
        model_name=key.model_name,
        world_size=key.world_size,
        worker_id=key.worker_id,
        chunk_hash=key.chunk_hash,
        kv_dtype=key.dtype,
        fmt=namespace_fmt("lmcache", fields),
    )


def _kv_key(key: Any) -> Any:
    """The LMCache key its storage manager knows the chunk's KV by (a salt is hidden states'
    only: LMCache's in-process KV keys have none)."""
    return key.key if isinstance(key, SaltedKey) else key


def _native_config(config: Any) -> _hsstore.Config:
    """hsstore's config of the drop-in: every hsstore key LMCache's config has as an attribute
    (chunk_size, max_hidden_state_cpu_size, ...), then hsstore keys LMCache has no attribute for
    (hidden_state_mac_key_file, hidden_state_remote_url, ...) from its ``extra_config`` (LMCache's
    free-form dict: ``extra_config:`` in its YAML, ``LMCACHE_EXTRA_CONFIG``, or
    ``"lmcache.extra_config": {...}`` in vLLM's kv_connector_extra_config). An attribute wins over
    an extra_config entry of the same name. Validated as any hsstore config (ConfigError)."""
    if isinstance(config, (dict, str, _hsstore.Config)) or config is None:
        return _hsstore.Config(config)
    values: Dict[str, Any] = {}
    found_any = False
    for key in _hsstore.Config.keys():
        if hasattr(config, key):
            found_any = True
            value = getattr(config, key)
            if value is not None:
                values[key] = value
    extra = getattr(config, "extra_config", None)
    if isinstance(extra, dict):
        for key in _hsstore.Config.keys():
            if key not in values and not hasattr(config, key) and extra.get(key) is not None:
                values[key] = extra[key]
                found_any = True
    if not found_any:
        return _hsstore.Config(config)  # its error message names what was expected
    return _hsstore.Config(values)


class _KVPresence:
    """What the native store calls for KV presence: LMCache's storage manager, asked with
    LMCache's own key for the chunk."""

    def __init__(self, owner: "HiddenStateStore", storage_manager: Any) -> None:
        self._owner = weakref.ref(owner)  # the owner holds the native store, which holds us
        self._storage_manager = storage_manager

    def contains(self, key, search_range=None, pin=False) -> bool:
        owner = self._owner()
        lmcache_key = owner._lmcache_key(key) if owner is not None else None
        if lmcache_key is None:  # a key this store never saw: no KV can be vouched for
            return False
        return self._storage_manager.contains(lmcache_key) is not None


class HiddenStateStore:
    """LMCache's HiddenStateStore API over hsstore's native store.

    Args:
        config: LMCache engine config (LMCacheEngineConfig or anything with its attributes).
            Reads enable_hidden_state_cache, max_hidden_state_cpu_size (GB),
            hidden_state_layers and chunk_size, and hsstore's own keys from its extra_config
            (``{"hidden_state_mac_key_file": "/etc/hss/mac.key"}``, say: _native_config).
        token_database: the engine's TokenDatabase, so chunk boundaries and keys match KV.
    """

    def __init__(self, config: Any, token_database: Any) -> None:
        self._config = config
        self._token_database = token_database
        self._storage_manager: Optional[Any] = None

        size_bytes = int(config.max_hidden_state_cpu_size * _GIB)
        if size_bytes <= 0:
            raise ValueError(
                "max_hidden_state_cpu_size must be > 0 when enable_hidden_state_cache=True"
            )
        native_config = _native_config(config)
        # The native store needs a token database of its own; this one is only a formality,
        # every call below passes LMCache's chunks.
        self._native_token_database = _hsstore.ChunkedTokenDatabase(native_config)
        self._store = _hsstore.HiddenStateStore(native_config, self._native_token_database)
        self._allocator = self._store  # LMCache's tests compare pools by identity

        allowlist = config.hidden_state_layers
        self._layer_allowlist: Optional[set] = set(allowlist) if allowlist is not None else None

        # Native key -> LMCache key, for storage-manager calls and _lru: the chunks of the call
        # in progress (per thread), and the keys stored (pruned against the store's own index).
        self._call = threading.local()
        self._stored_keys: Dict[_hsstore.CacheEngineKey, Any] = {}
        self._stored_keys_lock = threading.Lock()
        # What the keys depend on besides LMCache's key (set_namespace).
        self._namespace = NO_NAMESPACE
        _live.add(self)

    # -- wiring --------------------------------------------------------------------------------

    def set_namespace(self, namespace: KeyNamespace) -> None:
        """The model identity and salt key every later key of this store is in (hsstore.salt;
        hsstore.vllm sets it before the first request). Keys stored before are not seen
        afterwards: call it before storing."""
        self._namespace = namespace

    @property
    def namespace(self) -> KeyNamespace:
        return self._namespace

    def bind_storage_manager(self, storage_manager: Any) -> None:
        """Attach the engine's StorageManager (None: KV treated as present for every chunk)."""
        self._storage_manager = storage_manager
        if storage_manager is None:
            self._store.bind_storage_manager(None)
        else:
            self._store.bind_storage_manager(_KVPresence(self, storage_manager))

    # -- public API (LMCache 0.5.6) ------------------------------------------------------------

    def store_hidden_states(
        self, token_ids, hidden_states, *, layer_idx: int = 0, token_offset: int = 0
    ) -> int:
        """Store hidden_states ([len(token_ids) - token_offset, hidden_dim]) under KV's chunk
        keys. Returns the chunks newly written (0 when the layer is filtered out)."""
        if self._layer_allowlist is not None and layer_idx not in self._layer_allowlist:
            return 0
        ndim = getattr(hidden_states, "ndim", None)
        if ndim != 2:
            shape = tuple(getattr(hidden_states, "shape", ()))
            raise ValueError(
                f"hidden_states must be 2-D [num_tokens, hidden_dim], got shape {shape}"
            )
        n_toks = len(token_ids) if isinstance(token_ids, list) else int(token_ids.shape[0])
        if not (0 <= token_offset <= n_toks):
            raise ValueError(
                f"token_offset ({token_offset}) must be in [0, len(token_ids) ({n_toks})]"
            )
        expected_rows = n_toks - token_offset
        if hidden_states.shape[0] != expected_rows:
            raise ValueError(
                f"hidden_states first dim ({hidden_states.shape[0]}) must equal "
                f"len(token_ids) - token_offset ({expected_rows})"
            )
        lmcache_chunks = self._chunk(token_ids)
        if not lmcache_chunks or lmcache_chunks[-1][1] <= token_offset:
            return 0
        # Rows past the last chunk (an unsaved partial chunk) are not part of any key.
        covered = hidden_states[: lmcache_chunks[-1][1] - token_offset]
        return self.store_chunks(
            lmcache_chunks, covered, layer_idx=layer_idx, token_offset=token_offset
        )

    def retrieve_hidden_states(self, token_ids, *, layer_idx: int = 0):
        """The cached prefix for layer_idx as a CPU float32 torch tensor, or None. Stops at the
        first chunk whose KV is gone (dropping its hidden states) or whose layer is missing."""
        lmcache_chunks = self._chunk(token_ids)
        if not lmcache_chunks:
            return None
        chunks = self._begin_call(lmcache_chunks)
        try:
            return self._store.retrieve_chunks(chunks, layer_idx=layer_idx)
        finally:
            self._end_call()

    def num_cached_chunks(self) -> int:
        """The number of distinct chunk keys cached."""
        return self._store.num_cached_chunks()

    def has_chunk(self, key, layer_idx: int = 0) -> bool:
        return self._store.has_chunk(self._native_key(key), layer_idx)

    def drop_key(self, key) -> bool:
        """Drop every layer of key (test/admin use); KV is not touched."""
        return self._store.drop_key(self._native_key(key))

    def close(self) -> None:
        self._store.close()
        with self._stored_keys_lock:
            self._stored_keys.clear()

    def _release(self) -> None:
        """Closes the store (its tiers finish their write-behind) and drops the native objects,
        so nothing native outlives the interpreter; later calls raise RuntimeError."""
        with contextlib.suppress(Exception):
            self._store.bind_storage_manager(None)
        with contextlib.suppress(Exception):
            self._store.close()
        with self._stored_keys_lock:
            self._stored_keys.clear()
        released = _ReleasedStore()
        self._store = released
        self._allocator = released
        self._native_token_database = None
        self._storage_manager = None

    # -- LMCache's private helpers that its tests use -------------------------------------------

    @property
    def _lru(self) -> "OrderedDict[Any, None]":
        """LMCache's LRU view: keys least recently used first (a snapshot)."""
        out: "OrderedDict[Any, None]" = OrderedDict()
        for native in self._store.lru_keys():
            key = self._stored_keys.get(native)
            if key is not None:
                out[key] = None
        return out

    def _evict_one_lru(self) -> bool:
        return self._store.evict_one_lru()

    def _free_key(self, key) -> None:
        self._store.drop_key(self._native_key(key))

    def _chunk(self, token_ids, request_configs: Optional[dict] = None
               ) -> List[Tuple[int, int, Any]]:
        if request_configs:
            return list(self._token_database.process_tokens(tokens=token_ids,
                                                            request_configs=request_configs))
        return list(self._token_database.process_tokens(tokens=token_ids))

    def _native_key(self, key) -> _hsstore.CacheEngineKey:
        return _native_key(key, self._namespace)

    def _kv_present(self, key) -> bool:
        if self._storage_manager is None:
            return True
        return self._storage_manager.contains(key) is not None

    # -- beyond LMCache --------------------------------------------------------------------------

    @property
    def native(self) -> _hsstore.HiddenStateStore:
        """The hsstore store underneath (stats(), coverage(), retrieve_layers(), ...)."""
        return self._store

    def stats(self) -> dict:
        return self._store.stats()

    def chunks(self, token_ids, salt: Any = None) -> List[Tuple[int, int, Any]]:
        """LMCache's (start, end, key) chunks of token_ids, for the calls below (hash once per
        request, use for every layer and step). `salt`: the request's cache_salt (vLLM's), or
        an hsstore.salt.RequestKeys with its salt and LMCache key tags (``lmcache.tag.*``
        request configs: the keys are then LMCache's tagged keys, as its lookup makes them).
        Salted keys are SaltedKeys, whose hidden states no other salt sees (hsstore.salt),
        while KV presence is still asked of LMCache with the plain key."""
        salt, request_configs = split_request_keys(salt)
        chunks = self._chunk(token_ids, request_configs)
        if salt:
            chunks = [(start, end, salted(key, salt)) for start, end, key in chunks]
        return chunks

    def coverage(self, chunks, layer_idxs=(0,), *, scope=None) -> int:
        """Tokens of the prefix whose every chunk has KV (LMCache's storage manager) and every
        layer of layer_idxs: what retrieve_layers_into would restore. `chunks` from chunks().
        `scope`: ``CoverageScope.local_and_remote`` counts what the backing tiers (disk, Redis)
        hold too, which a retrieve reads through (waits on them: one round trip per server)."""
        if not chunks:
            return 0
        native = self._begin_call(chunks)
        try:
            if scope is not None:
                return self._store.coverage(native, list(layer_idxs), scope=scope)
            return self._store.coverage(native, list(layer_idxs))
        finally:
            self._end_call()

    def retrieve_layers_into(self, chunks, layer_idxs, outs, *, row_begin: int = 0) -> int:
        """All-or-nothing restore of several layers of `chunks` into `outs` (one tensor per
        layer, rows [row_begin, prefix end)); the rows written to each, 0 on a miss."""
        if not chunks:
            return 0
        native = self._begin_call(chunks)
        try:
            return self._store.retrieve_layers_into(
                native, list(layer_idxs), list(outs), row_begin=row_begin
            )
        finally:
            self._end_call()

    def store_chunks(self, chunks, hidden_states, *, layer_idx: int = 0, token_offset: int = 0):
        """store_hidden_states with the chunks of chunks() (no re-hashing): hidden_states has
        chunks[-1][1] - token_offset rows. Returns the chunks newly written."""
        if self._layer_allowlist is not None and layer_idx not in self._layer_allowlist:
            return 0
        if not chunks or chunks[-1][1] <= token_offset:
            return 0
        native = self._begin_call(chunks)
        try:
            written = self._store.store_chunks(
                native, hidden_states, layer_idx=layer_idx, token_offset=token_offset
            )
        finally:
            self._end_call()
        if written:
            self._remember_keys(native, chunks)
        return written

    @contextlib.contextmanager
    def native_chunks(self, chunks, *, remember: bool = False):
        """hsstore's (start, end, key) list for LMCache's `chunks`, for native calls made inside
        the block (an hsstore.nixl pull into :attr:`native`, say): KV presence asked meanwhile on
        this thread goes to LMCache's storage manager with each chunk's LMCache key.
        `remember`: keep the key mapping afterwards, for entries the block added (an import), so
        later presence checks and the ``_lru`` view know their LMCache keys."""
        native = self._begin_call(chunks)
        try:
            yield native
        finally:
            self._end_call()
            if remember:
                self._remember_keys(native, chunks)

    # -- internals ---------------------------------------------------------------------------------

    def _begin_call(self, lmcache_chunks):
        mapping = {}
        chunks = []
        for start, end, key in lmcache_chunks:
            native = self._native_key(key)
            mapping[native] = _kv_key(key)
            chunks.append((start, end, native))
        self._call.keys = mapping
        return chunks

    def _end_call(self) -> None:
        self._call.keys = None

    def _lmcache_key(self, native):
        mapping = getattr(self._call, "keys", None)
        if mapping is not None:
            key = mapping.get(native)
            if key is not None:
                return key
        return self._stored_keys.get(native)

    def _remember_keys(self, native, lmcache_chunks) -> None:
        # Writers and the prune under a lock (a pull, hsstore.vllm, records keys on LMCache's lookup
        # thread while the worker's thread stores; the prune iterates the mapping). Readers use
        # single dict.get calls, atomic under the GIL.
        with self._stored_keys_lock:
            for (_, _, key), (_, _, lmcache_key) in zip(native, lmcache_chunks):
                self._stored_keys[key] = _kv_key(lmcache_key)
            if len(self._stored_keys) <= 2 * self._store.num_cached_chunks() + 1024:
                return
            held = set(self._store.lru_keys())
            self._stored_keys = {k: v for k, v in self._stored_keys.items() if k in held}


_original: Optional[type] = None


def _no_hidden_state_store(config: Any, token_database: Any) -> None:
    """What LMCacheEngine builds as its hidden-state store under install_none(): nothing."""
    return None


def _remember_original(cache_engine: Any) -> None:
    global _original
    if cache_engine.HiddenStateStore not in (HiddenStateStore, _no_hidden_state_store):
        _original = cache_engine.HiddenStateStore


def install() -> None:
    """Make every LMCacheEngine built from now on use hsstore's HiddenStateStore."""
    import lmcache.v1.cache_engine as cache_engine

    _remember_original(cache_engine)
    cache_engine.HiddenStateStore = HiddenStateStore


def install_none() -> None:
    """Make every LMCacheEngine built from now on build no hidden-state store, whatever its
    config says (``engine.hidden_state_store is None``): a tensor-parallel rank whose hidden
    states another rank keeps (hsstore.vllm) reserves no pool. uninstall() undoes it."""
    import lmcache.v1.cache_engine as cache_engine

    _remember_original(cache_engine)
    cache_engine.HiddenStateStore = _no_hidden_state_store


def uninstall() -> None:
    """Put LMCache's own HiddenStateStore back."""
    import lmcache.v1.cache_engine as cache_engine

    _remember_original(cache_engine)
    if _original is not None:
        cache_engine.HiddenStateStore = _original


def installed() -> bool:
    """True while LMCacheEngine builds hsstore's HiddenStateStore."""
    import lmcache.v1.cache_engine as cache_engine

    return cache_engine.HiddenStateStore is HiddenStateStore
