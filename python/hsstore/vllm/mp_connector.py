"""Hidden states beside LMCache in multi-process (MP) mode: LMCache 0.5.6's own
``LMCacheMPConnector`` (a standalone ``lmcache server`` holds the KV) plus hidden states in an
hsstore store, never a truncated prefix. docs/vllm.md, "LMCache MP mode", says why it is built
this way; in short:

* The store lives in the worker that captures the hidden states (tensor-parallel rank 0), an
  hsstore ``Engine`` whose chunks are the server's chunk size (asked of the server at start-up,
  the request LMCache's adapters make). Where vLLM builds that worker in the engine-core process
  before the scheduler (one GPU: vLLM's 'uni' executor), the scheduler asks the store directly
  and caps the hit (below). Where the worker is another process (a multiprocess executor, which
  vLLM CPU picks unless VLLM_ENABLE_V1_MULTIPROCESSING=0; tensor parallelism), the scheduler
  cannot see the store: the server's hit goes to vLLM as it is, and the worker's restore check
  finds the rows it lacks at the step that needs them and reports their first block as a load
  error, from which vLLM recomputes (kv_load_failure_policy "recompute", counted as
  ``recomputes``). Never fewer rows than skipped, at the price of that recompute.
* With the store in the scheduler's process, the external hit is min(the server's lookup answer,
  the hidden-state coverage of every required layer). LMCache's ``get_num_new_matched_tokens`` answers ``(None, True)`` while the server's
  lookup is pending and the count once it is done; both come from the scheduler adapter's
  ``check_lookup_result``, which is wrapped: pending stays pending (nothing is claimed), a count
  is capped before LMCache records it, and the server's lookup locks on the chunks cut off are
  released (the chunks LMCache no longer retrieves).
* KV coupling is the server's own answer: a chunk the server no longer holds ends its lookup, so
  hidden states past it are never served. Their entries stay in the pool (lazy: a later prompt
  that stores the chunk's KV again makes them servable again, they are the same rows) until
  hidden-state pool pressure evicts them. No KV event log is needed (the server's stays empty
  for stores in the engine-driven CPU mode).
* vLLM's per-request ``cache_salt`` is part of the store's keys (the scheduler sends each
  request's salt to the worker with the step's metadata): one tenant's hidden states are never
  another's hit, as the server's lookup keeps their KV apart.
* A server that is down or restarted answers no hit (LMCache's health check), so every request
  is recomputed; the lookups answered while it was down are counted (``lookups_server_down``).
* Prefill/decode (``hsstore.nixl``, as for :mod:`hsstore.vllm.connector`): the engines share the
  server's KV; a prefill engine serves its worker's hidden states (``{"listen": ...}``) and a
  decode engine pulls the chunks of the server's hit that its store lacks from the producer the
  request names in ``kv_transfer_params`` or the configured one. The pull runs on a thread of
  its own while the scheduler answers "not yet" for that request (vLLM asks again next step;
  other requests are scheduled meanwhile), once per request and bounded by ``timeout_ms``
  (1500 by default); then the hit is capped at what the store holds. It needs the store in the
  scheduler's process (executor 'uni'); with the worker in another process, a missing chunk is
  recomputed as above.

Same ``kv_connector_extra_config`` keys as :mod:`hsstore.vllm.connector` (``hsstore.layers``,
``hsstore.keep``, ``hsstore.config``: the Engine's config, e.g. ``{"max_hidden_state_cpu_size":
2}``; its ``chunk_size``, if given, must equal the server's) plus LMCache's ``lmcache.mp.*``::

    {"kv_connector": "HiddenStateLMCacheMPConnector",
     "kv_connector_module_path": "hsstore.vllm.mp_connector", "kv_role": "kv_both",
     "kv_load_failure_policy": "recompute",
     "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 5555,
                                   "hsstore.layers": [-1, 2]}}

This module imports LMCache: vLLM imports it when it builds the connector (not before: LMCache
imported before vLLM has set its worker up breaks vLLM's kernel dispatcher).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, Optional

from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from .connector_state import WORKERS, ConnectorState, StepHooks
from .transfer import request_producer

logger = logging.getLogger("hsstore.vllm")

# The nominal lookup bound of an MP worker's hsstore.nixl agent: its default pull timeout is half.
_DEFAULT_PULL_BOUND_MS = 3000

__all__ = ["HiddenStateLMCacheMPConnector"]


class HiddenStateLMCacheMPConnector(StepHooks, LMCacheMPConnector):
    """LMCache's MP connector with hidden states that are never a truncated prefix."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        self._hs = ConnectorState(vllm_config, role, lmcache=True)
        if self._hs.store_kind != "hsstore":
            raise ValueError("hsstore.store: LMCache's own hidden-state store exists only in its "
                             "in-process engine; MP mode keeps hidden states in hsstore "
                             f"(got {self._hs.store_kind!r})")
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if role == KVConnectorRole.WORKER:
            self._start_worker(vllm_config)
        else:
            self._start_scheduler()

    # -- worker: the store, with the server's chunks ----------------------------------------------

    def _start_worker(self, vllm_config: Any) -> None:
        from .stores import engine_store

        chunk_size = int(self.worker_adapter.lmcache_tokens_per_chunk)
        user = dict(self._hs.engine_config or {})
        if "chunk_size" in user and int(user["chunk_size"]) != chunk_size:
            raise ValueError(f"hsstore.config: chunk_size {user['chunk_size']} differs from the "
                             f"LMCache server's chunk size {chunk_size}: hidden-state chunks must "
                             "be the server's (leave chunk_size out to take the server's)")
        self._hs.run_worker_init()
        # Keyed chunks (the server's), salted with each request's cache_salt (the scheduler
        # sends it with the step's metadata: ConnectorState.stamp_metadata). Tensor-parallel
        # ranks > 0 keep nothing (ConnectorState.keeper): every rank sees the same rows.
        if self._hs.find_rank() == 0:
            self._hs.register_worker(engine_store(vllm_config, chunk_size, user, keyed=True,
                                                   namespace=self._hs.namespace))
            # No LMCache lookup waits on a pull here (the scheduler answers "not yet" while one
            # runs): the nominal bound only sets the default pull timeout (half of it).
            options = self._hs.transfer_options
            wanted = options.timeout_ms if options is not None and options.timeout_ms else 0
            self._hs.start_transfer(max(_DEFAULT_PULL_BOUND_MS, wanted + 1))
        else:
            self._hs.register_worker(None)
        adapter = self.worker_adapter
        self._hs.extra_stats = lambda: {"mp_server_healthy": bool(adapter.is_healthy),
                                        "mp_chunk_size": chunk_size}

    # -- scheduler: the server's answer capped at the store's coverage -----------------------------

    def _start_scheduler(self) -> None:
        # The worker's store when the worker lives in this process (executor 'uni'); None when
        # it is another process: the hit is then not capped here, the worker verifies.
        self._store_of = WORKERS.get(self._hs.engine_id)
        if self._store_of is None:
            logger.info("hsstore.vllm: the worker runs in another process: LMCache's hits are "
                        "not capped at hidden-state coverage by the scheduler; the worker "
                        "recomputes from the first chunk whose hidden states it lacks "
                        "(counted as recomputes)")
        self._chunk_size = int(self.scheduler_adapter.lmcache_tokens_per_chunk)
        self._capped: Dict[str, int] = {}  # request id -> capped hit (locks past it released)
        self._capped_lock = threading.Lock()
        # hsstore.nixl pulls, one per request at most: request id -> its future (running) or
        # None (done, or nothing to pull); the producer each request names.
        self._pulls: Dict[str, Any] = {}
        self._producers: Dict[str, str] = {}
        self._puller = None  # a one-thread executor, made at the first pull
        adapter = self.scheduler_adapter
        original_check = adapter.check_lookup_result
        original_cleanup = adapter.cleanup_lookup_result

        def check_lookup_result(request_id: str) -> Optional[int]:
            hit = original_check(request_id)
            if hit is None:
                return None  # the server's lookup is pending: nothing is claimed yet
            if self._pulling(request_id, int(hit)):
                return None  # hidden states on their way from the producer: ask again
            return self._cap(request_id, int(hit))

        def cleanup_lookup_result(request_id: str) -> None:
            self._forget(request_id)
            original_cleanup(request_id)

        adapter.check_lookup_result = check_lookup_result
        adapter.cleanup_lookup_result = cleanup_lookup_result

    def _coverage(self, tokens, salt: str, chunks: Any = None) -> int:
        """Tokens of the prefix of `tokens` whose every chunk has every required layer, under the
        request's cache_salt (`chunks`: the store's chunk list of `tokens`, when already made)."""
        worker = self._store_of
        if worker is None or worker.store is None:
            return 0
        if chunks is None:
            chunks = worker.store.chunks(list(tokens), salt or "")
        covered = worker.store.coverage(chunks, self._hs.labels)
        return covered // self._chunk_size * self._chunk_size

    def _forget(self, request_id: str) -> None:
        with self._capped_lock:
            self._capped.pop(request_id, None)
            self._pulls.pop(request_id, None)
            self._producers.pop(request_id, None)

    def _pulling(self, request_id: str, hit: int) -> bool:
        """hsstore.nixl: whether a pull for this request runs (started here at its first answer,
        when the store lacks chunks of the server's hit and a producer is known). True until it
        is done; once per request."""
        worker = self._store_of
        transfer = None if worker is None else worker.transfer
        if transfer is None or hit <= 0:
            return False
        with self._capped_lock:
            if request_id in self._pulls:
                future = self._pulls[request_id]
                if future is None:
                    return False
                if not future.done():
                    return True
                self._pulls[request_id] = None
                return False
            self._pulls[request_id] = None  # decided below, once
            producer = self._producers.get(request_id)
        tracker = self.request_trackers.get(request_id)
        if tracker is None or (producer or transfer.producer) is None:
            return False
        tokens = tracker.get_token_ids()[:hit]
        chunks = worker.store.chunks(list(tokens), tracker.cache_salt or "")
        whole = hit // self._chunk_size * self._chunk_size
        if self._coverage(tokens, tracker.cache_salt, chunks) >= whole:
            return False
        if self._puller is None:
            from concurrent.futures import ThreadPoolExecutor

            self._puller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsstore-mp-pull")
        future = self._puller.submit(transfer.fill, chunks, self._hs.labels, hit, producer)
        with self._capped_lock:
            if request_id in self._pulls:  # not forgotten meanwhile
                self._pulls[request_id] = future
        return True

    def _cap(self, request_id: str, hit: int) -> int:
        """min(the server's hit, hidden-state coverage), asked on every answer (vLLM may ask
        again): once capped, never higher again; the lookup locks past the cap are released."""
        with self._capped_lock:
            previous = self._capped.get(request_id)
        first = previous is None
        if first:
            self._hs.count(lookups=1)
            if hit == 0 and not self.scheduler_adapter.is_healthy:
                self._hs.count(lookups_server_down=1)
                logger.warning("hsstore.vllm: the LMCache server is unreachable; request %s is "
                               "recomputed", request_id)
        held = hit if first else min(hit, previous)
        if held <= 0 or self._store_of is None:  # nothing to cap, or nothing to cap it with
            with self._capped_lock:
                self._capped[request_id] = held
            return held
        tracker = self.request_trackers.get(request_id)
        if tracker is None:  # unknown request: nothing can be vouched for
            covered = 0
            tokens = None
        else:
            tokens = tracker.get_token_ids()
            covered = self._coverage(tokens[:held], tracker.cache_salt)
        capped = self._hs.capped(held, covered, counted=first)
        with self._capped_lock:
            self._capped[request_id] = capped
        if capped == held:
            return held
        if tokens is not None:
            try:
                self.scheduler_adapter.free_lookup_locks(
                    token_ids=tokens, start=covered, end=held, request_id=request_id,
                    cache_salt=tracker.cache_salt, request_configs=tracker.request_configs)
            except Exception:  # noqa: BLE001 (the locks expire on the server's TTL)
                logger.exception("hsstore.vllm: releasing the server's lookup locks of request "
                                 "%s failed", request_id)
        return covered

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """vLLM's own prefix-cache hits (enable_prefix_caching) are capped at the same
        coverage."""
        super().bind_kv_cache_manager(kv_cache_manager)
        self._hs.cap_local_hits(kv_cache_manager, lambda request: None if self._store_of is None
                                else self._coverage(request.all_token_ids,
                                                    getattr(request, "cache_salt", None)))

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        self._hs.note_salt(request)  # sent to the worker with the step's metadata
        producer = request_producer(getattr(request, "kv_transfer_params", None),
                                    self._hs.transfer_options)
        if producer is not None:
            with self._capped_lock:
                self._producers[request.request_id] = producer
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def shutdown(self) -> None:
        """Once: LMCache's adapters close their message-queue clients, and a second close waits
        forever on the shared polling loop the first one stopped (HiddenStates.shutdown() and
        vLLM's own teardown both shut the connector down)."""
        if getattr(self, "_hs_shut_down", False):
            return
        self._hs_shut_down = True
        puller, self._puller = getattr(self, "_puller", None), None
        if puller is not None:
            puller.shutdown(wait=True)  # a running pull ends within its timeout
        super().shutdown()

    def request_finished(self, request: Any, block_ids: list):
        self._forget(request.request_id)
        return super().request_finished(request, block_ids)
