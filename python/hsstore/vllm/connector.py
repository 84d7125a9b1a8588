"""vLLM KV connectors that keep hidden states beside the KV cache and never hand a consumer a
truncated prefix.

* :class:`HiddenStateLMCacheConnector`: vLLM's ``LMCacheConnectorV1`` (real LMCache 0.5.6 moves the
  KV) plus hidden states in the LMCache engine's ``hidden_state_store`` (hsstore's drop-in, or
  LMCache's own with ``"hsstore.store": "lmcache"``).
* :class:`HiddenStateConnector`: no LMCache; the KV is vLLM's own prefix cache and the hidden
  states live in an hsstore ``Engine`` in each worker.

Both cap every prefix hit at the chunk-aligned hidden-state coverage of every required layer:

* LMCache's hit (``get_num_new_matched_tokens``): the worker's ``LMCacheEngine.lookup``, which
  LMCache's lookup server calls, answers min(KV hit, hidden-state coverage) (LMCache#4824). With
  ``enable_async_loading``, the async lookup server's answer is capped the same way when the
  prefetch is done (``cap_async_lookups``); until then LMCache answers None and vLLM waits.
* vLLM's own prefix-cache hit: the scheduler's ``KVCacheManager.get_computed_blocks`` (bound to
  the connector by vLLM) is truncated at the same coverage, asked through LMCache's lookup, or of
  the worker's store when it shares the scheduler's process.
* Whatever a scheduler could not see (evictions between lookup and step, a store in another
  process), the worker finds at restore time and reports as invalid blocks: vLLM recomputes them
  (``kv_load_failure_policy="recompute"``) or fails the request (``"fail"``). Never fewer rows.

Configuration is ``kv_connector_extra_config`` (hsstore.vllm.HiddenStates writes it): its
``hsstore.*`` keys, and those a request's ``kv_transfer_params`` may carry, are the table of
hsstore.vllm.connector_keys (README, "vLLM connector keys"): each key's default and meaning.

hsstore's own store keys (a MAC key, a Redis tier) come from LMCache's config for the drop-in:
``"lmcache.extra_config": {"hidden_state_mac_key_file": ...}`` (hsstore.lmcache).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

from .connector_state import (CLIENT_FORBIDDEN, SALT_CONFIG, WORKERS, ConnectorState, StepHooks,
                              worker_connector)
from .transfer import PRODUCER_CONFIG, request_producer

__all__ = ["HiddenStateConnector", "HiddenStateLMCacheConnector", "worker_connector"]

logger = logging.getLogger("hsstore.vllm")


class HiddenStateLMCacheConnector(StepHooks, LMCacheConnectorV1):
    """LMCache's connector with hidden states that are never a truncated prefix."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        self._hs = ConnectorState(vllm_config, role, lmcache=True)
        if role == KVConnectorRole.WORKER:
            # LMCache is first imported here, after vLLM set the worker up (earlier breaks vLLM).
            self._hs.run_worker_init()
            import hsstore.lmcache as dropin

            if self._hs.find_rank() != 0:
                dropin.install_none()  # a rank that keeps no hidden states builds no store
            elif self._hs.store_kind == "hsstore":
                dropin.install()
            else:
                dropin.uninstall()
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if role == KVConnectorRole.WORKER:
            from .stores import store_for_lmcache_engine

            engine = self._lmcache_engine.lmcache_engine
            if engine is None:
                raise RuntimeError("hsstore.vllm: LMCache built no engine in this worker")
            if not self._hs.keeper:
                # LMCache asks every rank's lookup and takes the least: this rank's KV answer
                # stands, rank 0 caps it at the hidden states.
                self._hs.register_worker(None)
                return
            adapter = store_for_lmcache_engine(engine)
            if hasattr(adapter.store, "set_namespace"):  # hsstore's drop-in (keys by namespace)
                adapter.store.set_namespace(self._hs.namespace)
            self._hs.register_worker(adapter)
            self._hs.start_transfer(int(engine.config.lookup_timeout_ms))
            self._hs.cap_lmcache_lookups(engine)
            server = getattr(self._lmcache_engine, "lookup_server", None)
            if engine.config.enable_async_loading and server is not None:
                self._hs.cap_async_lookups(engine, server)

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._hs.cap_local_hits(kv_cache_manager, self._lmcache_coverage)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        self._carry_request_configs(request)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def _carry_request_configs(self, request: Any) -> None:
        """What the worker's lookup needs of the request, put where LMCache carries it there:
        its request configs, from the "lmcache.*" keys of kv_transfer_params (not key tags):
        the request's cache_salt (lmcache.hsstore.cache_salt: its hidden-state keys) and, for
        hsstore.nixl, the producer its kv_transfer_params name (lmcache.hsstore.producer).

        kv_transfer_params come from the HTTP client (vLLM's OpenAI server passes them through):
        every "lmcache.hsstore.*" key a client wrote is dropped, and only what this side decided
        is carried: the salt, always vLLM's own for the request (so no request reads another
        tenant's keys), and the producer, only one on hsstore.nixl's allow-list (request_producer:
        a name off it is carried as REFUSED, a worker that does not pull carries none).
        The dicts are replaced, never changed in place: a request's sampling params may be a
        shallow copy sharing its extra_args with other requests (vLLM's skip_clone)."""
        params = getattr(request, "kv_transfer_params", None)
        carried = {key: value for key, value in params.items()
                   if not (isinstance(key, str) and key.startswith(CLIENT_FORBIDDEN))} \
            if isinstance(params, dict) else {}
        salt = self._hs.note_salt(request)
        if salt:
            carried[SALT_CONFIG] = salt
        producer = request_producer(params, self._hs.transfer_options)
        if producer is not None:
            carried[PRODUCER_CONFIG] = producer
        if carried == (params if isinstance(params, dict) else {}):
            return
        request.kv_transfer_params = carried
        # LMCache reads sampling_params.extra_args["kv_transfer_params"] (vLLM's Request starts
        # with the same dict as request.kv_transfer_params).
        sampling = getattr(request, "sampling_params", None)
        if sampling is not None:
            sampling.extra_args = {**(sampling.extra_args or {}), "kv_transfer_params": carried}

    def _lmcache_coverage(self, request: Any) -> Optional[int]:
        """The capped LMCache lookup (KV and hidden states both present), primed for LMCache's
        own get_num_new_matched_tokens of the same request (its lookup cache, by request id)."""
        self._carry_request_configs(request)
        impl = self._lmcache_engine
        client = getattr(impl, "lookup_client", None)
        if client is None:
            return 0
        cached = client.lookup_cache(lookup_id=request.request_id)
        if cached != -1:
            return cached  # int, or None while an async lookup runs (unknown)
        from lmcache.integration.vllm.vllm_v1_adapter import extract_request_configs

        token_ids = request.all_token_ids
        if impl.skip_last_n_tokens > 0:
            token_ids = token_ids[: -impl.skip_last_n_tokens]
        return client.lookup(token_ids, lookup_id=request.request_id,
                             request_configs=extract_request_configs(request.sampling_params))


class HiddenStateConnector(StepHooks, KVConnectorBase_V1):
    """Hidden states without LMCache: vLLM's own prefix cache holds the KV, an hsstore Engine in
    each worker the hidden states (its chunk_size defaults to vLLM's block size, so hits align)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._hs = ConnectorState(vllm_config, role, lmcache=False)
        if role == KVConnectorRole.WORKER:
            from .stores import engine_store

            self._hs.run_worker_init()
            if self._hs.find_rank() == 0:  # ranks > 0 keep nothing (ConnectorState.keeper)
                store = engine_store(vllm_config, self._hs.block_size, self._hs.engine_config,
                                     namespace=self._hs.namespace)
                self._engine = store.engine
                self._hs.register_worker(store)
            else:
                self._hs.register_worker(None)

    # -- scheduler: no external KV; vLLM's own hits are capped at the store's coverage ----------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._hs.cap_local_hits(kv_cache_manager, self._local_coverage)

    def _local_coverage(self, request: Any) -> Optional[int]:
        worker = WORKERS.get(self._hs.engine_id)
        if worker is None:
            return None  # the store lives in another process: the worker verifies instead
        chunks = worker.store.chunks(list(request.all_token_ids), self._hs.note_salt(request))
        return worker.store.coverage(chunks, self._hs.labels)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        self._hs.note_salt(request)  # for the worker's keys (stamp_metadata)
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return self._hs.stamp_metadata(KVConnectorMetadata(), scheduler_output)

    def request_finished(self, request: Any, block_ids: list):
        self._hs.forget_salt(request.request_id)
        return False, None

    # -- worker: nothing to load or save for KV -------------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any):
        return None

    def wait_for_save(self) -> None:
        self._hs.end_step()

    def get_block_ids_with_load_errors(self) -> set:
        return self._hs.invalid_blocks()

    def shutdown(self) -> None:
        self._hs.flush_and_report()
        self._hs.unregister()
