"""The hidden-state stores a vLLM capture writes to and restores from, behind one small interface.

* :class:`DropInStore`: hsstore's LMCache drop-in (``hsstore.lmcache.HiddenStateStore``) inside a
  real LMCache engine. Chunks and keys are LMCache's, KV presence is LMCache's storage manager.
  The only one that pulls from another process's pool (``pull``, hsstore.vllm.transfer).
* :class:`LMCacheStore`: LMCache's own ``HiddenStateStore``, through its public API only (the
  reference the tests and the benchmark compare against).
* :class:`EngineStore`: an hsstore ``Engine``'s store, without LMCache: the KV is vLLM's own
  prefix cache, which a worker cannot ask per chunk, so KV presence is not checked here (the
  scheduler caps vLLM's hits at this store's coverage instead).

Coverage counts what the store's backing tiers hold (``TIERED``: the disk and Redis tiers, whose
values a restore reads through into the pool); without it a capped hit would never reach them.

Every store works on a request's chunk list (``chunks(tokens, salt)``, computed once per request;
`salt` is vLLM's per-request cache_salt, whose hidden states no other salt sees: hsstore.salt) and
labels (``hsstore.vllm.layers``). Restores are all or nothing across labels and report the prefix
end they reached; stores take rows [token_offset, end) of a request's prompt buffers. Both take
the capture's own tensors (on the engine's device) and its stream (``stream=``, :func:`on_stream`).
Thread safety: what the underlying store offers (hsstore's: any thread; LMCache's: one thread).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..salt import (NO_NAMESPACE, KeyNamespace, namespace_fmt, salted_native_key,
                    split_request_keys)

logger = logging.getLogger("hsstore.vllm")

__all__ = ["DropInStore", "EngineStore", "LMCacheStore", "engine_store",
           "store_for_lmcache_engine"]


def _tiered() -> Any:
    """CoverageScope.local_and_remote: a (chunk, layer) a backing tier holds counts as present
    (one round trip per server, bounded by its timeout; with no tier, the local walk)."""
    import hsstore

    return hsstore.CoverageScope.local_and_remote


def on_stream(method):
    """A restore or store_rows that runs on `stream` (the engine's current stream, where the
    capture's device tensors are ordered): the store's copies read or write them after the
    forward that produced them, with no host wait. None (a CPU tensor): as it is."""

    def call(self, *args: Any, stream: Any = None) -> int:
        if stream is None or not isinstance(stream, torch.cuda.Stream):
            return method(self, *args)
        with torch.cuda.stream(stream):
            return method(self, *args)

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


def _complete_end(chunks: Sequence[Any], have: int) -> int:
    """The end of the last chunk that rows [0, have) fill completely (0 if none)."""
    end = 0
    for _, chunk_end, _ in chunks:
        if chunk_end > have:
            break
        end = chunk_end
    return end


def _chunk_count_before(chunks: Sequence[Any], end: int) -> int:
    """Chunks that start before `end` (the ones a restore of [.., end) needs)."""
    count = 0
    for start, _, _ in chunks:
        if start >= end:
            break
        count += 1
    return count


class DropInStore:
    """hsstore's LMCache drop-in, as LMCacheEngine built it (hsstore.lmcache.install())."""

    name = "hsstore"
    keys_by_salt = True  # a salted request's chunk keys are SaltedKeys (hsstore.salt)

    def __init__(self, store: Any) -> None:
        self.store = store

    def chunks(self, tokens: List[int], salt: Optional[str] = None) -> List[Any]:
        return self.store.chunks(tokens, salt)

    def coverage(self, chunks: List[Any], labels: Sequence[int]) -> int:
        return self.store.coverage(chunks, labels, scope=_tiered())

    complete_end = staticmethod(_complete_end)

    @on_stream
    def restore(self, tokens, chunks, labels, outs: Dict[int, torch.Tensor], row_begin, end) -> int:
        need = chunks[: _chunk_count_before(chunks, end)]
        rows = self.store.retrieve_layers_into(
            need, labels, [outs[label][row_begin:] for label in labels], row_begin=row_begin
        )
        return row_begin + rows if rows else 0

    @on_stream
    def store_rows(self, tokens, chunks, labels, outs, token_offset: int, end: int) -> int:
        upto = chunks[: _chunk_count_before(chunks, end)]
        written = 0
        for label in labels:
            written += self.store.store_chunks(
                upto, outs[label][token_offset:end], layer_idx=label, token_offset=token_offset
            )
        return written

    @property
    def native(self) -> Any:
        """The hsstore store underneath (its pool is what hsstore.nixl registers and serves)."""
        return self.store.native

    def pull(self, agent: Any, producer: str, chunks, labels: Sequence[int], timeout: float) -> Any:
        """Pulls the chunks this store lacks (KV present here) from `producer` over NIXL
        (hsstore.nixl.NixlAgent over :attr:`native`) within `timeout` seconds; the PullResult."""
        with self.store.native_chunks(chunks, remember=True) as native:
            return agent.pull(producer, native, list(labels), timeout=timeout)

    def stats(self) -> dict:
        return dict(self.store.stats())

    def drop_all(self) -> int:
        """Evicts every hidden state the pool holds (as pool pressure would, LRU first; KV and
        the backing tiers are not touched); the keys evicted."""
        return _evict_all(self.store.native)

    def flush(self) -> None:
        """Waits until the write-behind queues are written or dropped (hsstore's flush())."""
        self.store.native.flush()


class LMCacheStore:
    """LMCache's own HiddenStateStore (its public API: store/retrieve per layer, has_chunk)."""

    name = "lmcache"
    keys_by_salt = False  # LMCache's store keys by tokens only: a salt is not applied

    def __init__(self, store: Any, engine: Any) -> None:
        self.store = store
        self.engine = engine  # its storage manager exists from post_init() on
        self.token_database = engine.token_database
        self._salt_warned = False

    def chunks(self, tokens: List[int], salt: Any = None) -> List[Any]:
        salt, _ = split_request_keys(salt)
        if salt and not self._salt_warned:
            self._salt_warned = True
            logger.warning("hsstore.vllm: LMCache's own hidden-state store keys by tokens only: "
                           "requests with a cache_salt share its hidden states across tenants "
                           "(hsstore's store, the default, keeps them apart)")
        # Untagged too: LMCache's store API (store/retrieve by tokens) keys without request
        # configs, so a tagged request's lookup never finds its rows there (a recompute).
        return list(self.token_database.process_tokens(tokens=tokens))

    complete_end = staticmethod(_complete_end)

    def coverage(self, chunks: List[Any], labels: Sequence[int]) -> int:
        # LMCache's own walk, read through its public methods: KV first, then every layer.
        end = 0
        storage_manager = self.engine.storage_manager
        for _, chunk_end, key in chunks:
            if storage_manager is not None and storage_manager.contains(key) is None:
                break
            if not all(self.store.has_chunk(key, label) for label in labels):
                break
            end = chunk_end
        return end

    @on_stream
    def restore(self, tokens, chunks, labels, outs: Dict[int, torch.Tensor], row_begin, end) -> int:
        need = chunks[: _chunk_count_before(chunks, end)]
        if not need:
            return 0
        prefix = tokens[: need[-1][1]]
        restored = {}
        for label in labels:
            rows = self.store.retrieve_hidden_states(prefix, layer_idx=label)
            if rows is None:
                return 0
            restored[label] = rows
        reached = min(rows.shape[0] for rows in restored.values())  # all or nothing
        if reached <= row_begin:
            return 0
        for label, rows in restored.items():
            outs[label][row_begin:reached].copy_(rows[row_begin:reached])
        return reached

    @on_stream
    def store_rows(self, tokens, chunks, labels, outs, token_offset: int, end: int) -> int:
        written = 0
        for label in labels:
            written += self.store.store_hidden_states(
                tokens[:end], outs[label][token_offset:end], layer_idx=label,
                token_offset=token_offset,
            )
        return written

    def stats(self) -> dict:
        return {"keys_held": self.store.num_cached_chunks()}

    def drop_all(self) -> Optional[int]:
        return None  # LMCache's store has no eviction in its public API

    def flush(self) -> None:
        return None  # nothing queued behind LMCache's store


class EngineStore:
    """An hsstore Engine's store, without LMCache. Two kinds of chunk list, by request:

    * token ids (a tensor), hsstore's own chunk keys: an unsalted request of the connector
      without LMCache (vLLM's prefix cache holds the KV);
    * (start, end, key) lists of full chunks from the Engine's token database, keys salted with
      the request's cache_salt (hsstore.salt): a salted request, and every request where the
      chunks must be a server's (``keyed=True``: the MP connector, the server's chunk size).
    """

    name = "hsstore-engine"
    keys_by_salt = True

    def __init__(self, engine: Any, *, keyed: bool = False,
                 namespace: KeyNamespace = NO_NAMESPACE) -> None:
        self.engine = engine
        # The salt key (hsstore.salt); the model identity is in the Engine's Metadata.fmt.
        self.namespace = KeyNamespace(salt_key=namespace.salt_key)
        self.store = engine.hidden_state_store
        if self.store is None:
            raise ValueError("hsstore.config: enable_hidden_state_cache must be true")
        # vLLM's prefix cache (or the MP server) holds the KV: treat KV as present here.
        self.store.bind_storage_manager(None)
        self.chunk_size = engine.config.chunk_size
        self.keyed = keyed

    def chunks(self, tokens: List[int], salt: Any = None) -> Any:
        salt, _ = split_request_keys(salt)  # no LMCache here: no key tags
        if not salt and not self.keyed:
            return torch.tensor(tokens, dtype=torch.int64)  # token ids are the chunk list here
        out = []
        for start, end, key in self.engine.token_database.process_tokens(list(tokens)):
            if end - start < self.chunk_size:
                break
            out.append((start, end, salted_native_key(key, salt, self.namespace)))
        return out

    def coverage(self, chunks: Any, labels: Sequence[int]) -> int:
        if isinstance(chunks, list) and not chunks:
            return 0
        return self.store.coverage(chunks, list(labels), scope=_tiered())

    def complete_end(self, chunks: Any, have: int) -> int:
        if isinstance(chunks, list):
            return _complete_end(chunks, have)
        return have // self.chunk_size * self.chunk_size

    @on_stream
    def restore(self, tokens, chunks, labels, outs: Dict[int, torch.Tensor], row_begin, end) -> int:
        if isinstance(chunks, list):
            need = chunks[: _chunk_count_before(chunks, end)]
        else:
            need = chunks[: -(-end // self.chunk_size) * self.chunk_size]
        if len(need) == 0:
            return 0
        rows = self.store.retrieve_layers_into(
            need, list(labels), [outs[label][row_begin:] for label in labels], row_begin=row_begin
        )
        return row_begin + rows if rows else 0

    @on_stream
    def store_rows(self, tokens, chunks, labels, outs, token_offset: int, end: int) -> int:
        if isinstance(chunks, list):
            upto = chunks[: _chunk_count_before(chunks, end)]
            if not upto:
                return 0
            return sum(self.store.store_chunks(upto, outs[label][token_offset:end],
                                               layer_idx=label, token_offset=token_offset)
                       for label in labels)
        ids = chunks[:end]
        written = self.store.store_batch(
            [(ids, outs[label][token_offset:end], label, token_offset) for label in labels]
        )
        return sum(written)

    @property
    def native(self) -> Any:
        """The hsstore store (its pool is what hsstore.nixl registers and serves)."""
        return self.store

    def pull(self, agent: Any, producer: str, chunks, labels: Sequence[int], timeout: float) -> Any:
        """Pulls the chunks (this store's own (start, end, key) chunks, ``keyed=True``) that it
        lacks from `producer` over NIXL within `timeout` seconds; the PullResult. The producer
        keys its chunks alike (the same model, chunk size and salt)."""
        return agent.pull(producer, chunks, list(labels), timeout=timeout)

    def stats(self) -> dict:
        return dict(self.store.stats())

    def drop_all(self) -> int:
        return _evict_all(self.store)

    def flush(self) -> None:
        self.store.flush()


def _evict_all(native: Any) -> int:
    """evict_one_lru until nothing is evictable (entries a call holds stay: they are in use)."""
    evicted = 0
    while native.evict_one_lru():
        evicted += 1
    return evicted


def engine_store(vllm_config: Any, chunk_size: int, user_config: Any = None, *,
                 keyed: bool = False, namespace: KeyNamespace = NO_NAMESPACE) -> EngineStore:
    """An EngineStore for a vLLM worker: an hsstore Engine whose chunks are `chunk_size` tokens
    (vLLM's block size without LMCache, the MP server's chunk size with it), `user_config`
    (hsstore.config) over a 1 GB hidden-state pool, its keys in `namespace` (the model's
    identity folded into the keys' fmt, salts digested under its salt key)."""
    import hsstore

    config = {"chunk_size": chunk_size, "enable_hidden_state_cache": True,
              "max_hidden_state_cpu_size": 1.0, "max_local_cpu_size": 0.001}
    config.update(user_config or {})
    metadata = hsstore.Metadata(model_name=vllm_config.model_config.model,
                                kv_dtype=str(vllm_config.model_config.dtype),
                                fmt=namespace_fmt("vllm", namespace.fields()))
    return EngineStore(hsstore.Engine(config, metadata), keyed=keyed, namespace=namespace)


def store_for_lmcache_engine(engine: Any):
    """The adapter for the hidden-state store an LMCacheEngine built (drop-in or LMCache's)."""
    store = engine.hidden_state_store
    if store is None:
        raise ValueError(
            "LMCache's config has enable_hidden_state_cache=false (or "
            "max_hidden_state_cpu_size=0): there is no hidden-state store to capture into"
        )
    from .. import lmcache as dropin

    if isinstance(store, dropin.HiddenStateStore):
        return DropInStore(store)
    return LMCacheStore(store, engine)
