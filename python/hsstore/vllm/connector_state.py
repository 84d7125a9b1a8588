"""What hsstore's vLLM connectors share (hsstore.vllm.connector's two, hsstore.vllm.mp_connector's
one): :class:`ConnectorState`, a connector's options, capture, caps and counters in either role
(``ConnectorState.capped`` is the one rule of every external hit's cap: min(hit, hidden-state
coverage), a cut counted); :class:`StepHooks`, the worker's and the scheduler's hooks around
vLLM's step calls (a mixin); :data:`WORKERS`, this process's worker-side states by engine id.

hsstore.vllm.connector says what the connectors guarantee (never a truncated prefix) and how each
caps a hit."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from typing import Any, Dict, List, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
)

from .capture import PromptCapture
from .connector_keys import option
from .eagle3 import EAGLE3, eagle3_layers, expand_specs
from .layers import check_specs, resolve_layers
from .metrics import HiddenStateKVStats, HiddenStatePromMetrics, StatsReporter
from .output import StateFileWriter, output_options
from ..config_env import log_level
from ..salt import RequestKeys, salted
from .identity import key_namespace
from .transfer import PRODUCER_CONFIG, HiddenStateTransfer, parse_options

__all__ = ["CLIENT_FORBIDDEN", "SALT_CONFIG", "WORKERS", "ConnectorState", "StepHooks",
           "producer_of", "salt_of", "worker_connector"]

logger = logging.getLogger("hsstore.vllm")

_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
           "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR,
           "off": logging.CRITICAL + 1}


def _log_to_stderr() -> None:
    """hsstore.vllm's lines in the engine's log: vLLM configures only its own "vllm" logger, and
    Python drops INFO lines of a logger without a handler. One stderr handler on "hsstore", at
    HSS_LOG_LEVEL (the native library's variable; info by default), unless the application
    configured "hsstore" or the root logger itself."""
    package = logging.getLogger("hsstore")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("(hsstore) %(levelname)s %(asctime)s %(message)s",
                                           "%m-%d %H:%M:%S"))
    package.addHandler(handler)
    package.setLevel(_LEVELS.get(log_level(), logging.INFO))


_log_to_stderr()

# Worker-side connectors of this process by engine_id: install()/take() find the capture here,
# and a scheduler in the same process asks the store for coverage.
WORKERS: Dict[str, "ConnectorState"] = {}
_COUNTERS: Dict[str, Any] = {}


# The request config (LMCache's, from kv_transfer_params' "lmcache.*" keys) that carries a
# request's cache_salt from the scheduler to the worker's lookup (LMCache's in-process engine
# gives its lookup no salt; not a key tag, so LMCache's KV keys stay as they are).
SALT_CONFIG = "lmcache.hsstore.cache_salt"
# The request configs only the scheduler's connector writes: a client's are dropped
# (HiddenStateLMCacheConnector._carry_request_configs, connector.py).
CLIENT_FORBIDDEN = "lmcache.hsstore."


def salt_of(request_configs: Any) -> str:
    """The cache_salt a request's LMCache request configs carry ("" for none)."""
    if isinstance(request_configs, dict):
        return str(request_configs.get(SALT_CONFIG) or "")
    return ""


def producer_of(request_configs: Any) -> Optional[str]:
    """The producer a request named (kv_transfer_params, carried to the worker's lookup in
    LMCache's request configs by the scheduler side: HiddenStateLMCacheConnector)."""
    if isinstance(request_configs, dict):
        value = request_configs.get(PRODUCER_CONFIG)
        return str(value) if value else None
    return None


def worker_connector(engine_id: Optional[str] = None) -> "ConnectorState":
    """This process's worker-side hidden-state state (the only one when engine_id is None)."""
    if engine_id is not None:
        return WORKERS[engine_id]
    if len(WORKERS) != 1:
        raise RuntimeError(f"hsstore.vllm: {len(WORKERS)} hidden-state connectors in this "
                           "process, expected exactly one")
    return next(iter(WORKERS.values()))


class ConnectorState:
    """The part both connectors share: options, the capture, the caps and their counters."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, *, lmcache: bool) -> None:
        transfer = vllm_config.kv_transfer_config
        extra = dict(transfer.kv_connector_extra_config or {})
        self.engine_id = transfer.engine_id
        self.role = role
        # The model's identity and the deployment's salt key, in every hidden-state key
        # (hsstore.vllm.identity; hsstore.model_revision, hsstore.salt_key_file).
        self.namespace = key_namespace(vllm_config, extra)
        self.tags_in_keys = lmcache  # LMCache keys a request's chunks by its lmcache.tag.*
        self.store_kind = option(extra, "hsstore.store")
        if self.store_kind not in ("hsstore", "lmcache"):
            raise ValueError(f"hsstore.store must be 'hsstore' or 'lmcache', got {self.store_kind!r}")
        specs = check_specs(option(extra, "hsstore.layers"))
        # "eagle3": vLLM's own EAGLE-3 aux layers for this config, as labels (checked again
        # against the loaded model in each worker: PromptCapture.attach).
        self.eagle3_labels = eagle3_layers(vllm_config) if EAGLE3 in specs else None
        self.layer_specs = expand_specs(specs, vllm_config)
        model_config = vllm_config.model_config
        self.labels = resolve_layers(self.layer_specs,
                                     model_config.get_num_layers(vllm_config.parallel_config))
        self.keep = bool(option(extra, "hsstore.keep"))
        self.output = output_options(extra)  # checked in every role, used by the worker's
        self.engine_config = option(extra, "hsstore.config")
        self.worker_init = option(extra, "hsstore.worker_init")
        self.block_size = vllm_config.cache_config.block_size
        self.policy = transfer.kv_load_failure_policy
        if vllm_config.parallel_config.pipeline_parallel_size != 1:
            raise ValueError("hsstore.vllm: pipeline parallelism is not supported (the final "
                             "hidden state lives on the last stage only)")
        # Checked in every role (the scheduler's too): a bad value fails at configuration time.
        self.transfer_options = parse_options(option(extra, "hsstore.nixl"), lmcache=lmcache,
                                              store=self.store_kind)
        self.store: Any = None
        self.capture: Optional[PromptCapture] = None
        self.rank: Optional[int] = None  # the worker's tensor-parallel rank (find_rank)
        # vLLM's per-request cache_salt (hsstore.salt): the scheduler's, by request id, from its
        # first lookup to request_finished; sent with each step's metadata to the worker, whose
        # copy lives until get_finished (vLLM gives a worker no request's salt).
        self.scheduler_salts: Dict[str, str] = {}
        self.worker_salts: Dict[str, str] = {}
        # LMCache's key tags of a request (its "lmcache.tag.*" kv_transfer_params, in order),
        # carried alike: the capture keys the request's hidden states as LMCache's lookup does.
        self.scheduler_tags: Dict[str, tuple] = {}
        self.worker_tags: Dict[str, tuple] = {}
        self.transfer: Optional[HiddenStateTransfer] = None
        self._async_sender: Any = None  # cap_async_lookups' response thread
        self.extra_stats: Any = None  # a connector's own entries for stats() (the MP one's)
        self._reporter: Optional[StatsReporter] = None  # vLLM's connector metrics (metrics.py)
        self._reporter_failed = False
        self._flushed = False  # flush_and_report ran
        self._reset_requested = False  # a reset_cache for the worker's next step (scheduler)
        # One set of counters per engine and process: a scheduler that shares its worker's
        # process (in-process engines, vLLM's default engine core) counts into the same one.
        self.lock, self.counters = _COUNTERS.setdefault(self.engine_id, (threading.Lock(), {
            "lookups": 0, "async_lookups": 0, "lookup_hits_capped": 0,
            "lookup_tokens_capped": 0,
            "local_hits_capped": 0, "local_tokens_capped": 0,
            # hsstore.nixl pulls (decode side): attempts, chunks brought, misses, time.
            "pulls": 0, "pulled_chunks": 0, "pulls_missed": 0, "pull_ns": 0,
            # Producers a request named off the allow-list (hsstore.nixl "producers"): not
            # connected to, the hit capped.
            "pulls_refused": 0,
            # The MP connector: lookups answered as no hit because the server was down.
            "lookups_server_down": 0,
            # vLLM's POST /reset_prefix_cache?reset_external=true: resets, keys dropped.
            "resets": 0, "reset_keys_dropped": 0}))

    def count(self, **deltas: int) -> None:
        with self.lock:
            for name, delta in deltas.items():
                self.counters[name] = self.counters.get(name, 0) + delta

    def run_worker_init(self) -> None:
        if not self.worker_init:
            return
        module, _, function = str(self.worker_init).partition(":")
        getattr(importlib.import_module(module), function)()

    @property
    def keeper(self) -> bool:
        """This worker keeps the engine's hidden states: tensor-parallel rank 0. Every rank holds
        the same final and residual states after the all-reduce, so one copy per TP group is
        the whole of them; the other ranks have no store, no capture and no pool (a rank's
        pool would be pinned memory never written), and leave their lookups uncapped (LMCache
        takes the min over ranks: rank 0's capped answer is the hit)."""
        return self.rank == 0

    def find_rank(self) -> int:
        """This worker's tensor-parallel rank (vLLM has set up its groups before it builds the
        worker's connector)."""
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        self.rank = get_tensor_model_parallel_rank()
        return self.rank

    def register_worker(self, store: Any) -> None:
        """The worker's store (None on a rank that is not the keeper) and its capture."""
        if self.rank is None:
            self.find_rank()
        self.store = store if self.keeper else None
        if self.keeper:
            writer = StateFileWriter(*self.output) if self.output is not None else None
            self.capture = PromptCapture(store, self.layer_specs, self.block_size,
                                         keep=self.keep, eagle3_labels=self.eagle3_labels,
                                         writer=writer)
            self.capture.salt_of = self.request_keys
        WORKERS[self.engine_id] = self

    def attach_to_caller(self) -> None:
        """Attaches the capture to the model runner registering its KV caches with this
        connector (vLLM calls register_kv_caches from the runner, after the model is loaded):
        under ``vllm serve`` nobody calls HiddenStates.install(), and the hooks must be there
        before the first request. install() later finds them attached (attach is idempotent)."""
        if self.capture is None:
            return
        if self.capture.model_runner is not None:
            return
        runner = _calling_model_runner()
        if runner is None:
            logger.warning("hsstore.vllm: the model runner that registered the KV caches was not "
                           "found; no hidden states are captured until HiddenStates.install(llm)")
            return
        self.capture.attach(runner)

    def start_transfer(self, lookup_timeout_ms: int) -> None:
        """hsstore.nixl: this worker's agent (rank 0, which keeps the hidden states)."""
        if self.transfer_options is not None and self.keeper:
            self.transfer = HiddenStateTransfer(self.transfer_options, self.store, self.count,
                                                lookup_timeout_ms)

    def close_transfer(self) -> None:
        """Stops serving and pulling (before the store closes: NIXL has its pool registered)."""
        transfer, self.transfer = self.transfer, None
        if transfer is not None:
            transfer.close()

    def stop_async_sender(self) -> None:
        """Answers the async lookups still queued, then stops the response thread."""
        sender, self._async_sender = self._async_sender, None
        if sender is not None:
            sender.shutdown(wait=True)

    def unregister(self) -> None:
        self.stop_async_sender()
        self.close_transfer()
        if WORKERS.get(self.engine_id) is self:
            del WORKERS[self.engine_id]
        if self.capture is not None:
            self.capture.detach()
            self.capture.close_writer()

    # -- worker steps -------------------------------------------------------------------------

    def begin_step(self) -> None:
        if self.capture is not None:
            self.capture.begin_step()

    def end_step(self) -> None:
        if self.capture is not None:
            self.capture.end_step()

    def invalid_blocks(self) -> set:
        return self.capture.take_invalid_blocks() if self.capture is not None else set()

    def stats(self) -> dict:
        out = self.capture.stats() if self.capture is not None else {}
        with self.lock:
            out.update(self.counters)
        if self.store is not None:
            out["store_stats"] = self.store.stats()
        if self.transfer is not None:
            out["nixl"] = self.transfer.stats()
        if self.extra_stats is not None:
            out.update(self.extra_stats())
        return out

    def request_reset(self) -> None:
        """vLLM's connector reset_cache (the scheduler's side): the next step's metadata tells
        the worker to drop its hidden states (the worker may live in another process)."""
        with self.lock:
            self._reset_requested = True

    def note_salt(self, request: Any) -> str:
        """The scheduler's side: remembers the request's cache_salt (and LMCache key tags)
        until request_finished."""
        salt = getattr(request, "cache_salt", None) or ""
        params = getattr(request, "kv_transfer_params", None)
        tags = tuple((key, value) for key, value in params.items()
                     if isinstance(key, str) and key.startswith("lmcache.tag.")) \
            if self.tags_in_keys and isinstance(params, dict) else ()
        if salt or tags:
            with self.lock:
                if salt:
                    self.scheduler_salts[request.request_id] = salt
                if tags:
                    self.scheduler_tags[request.request_id] = tags
        return salt

    def forget_salt(self, request_id: str) -> None:
        with self.lock:
            self.scheduler_salts.pop(request_id, None)
            self.scheduler_tags.pop(request_id, None)

    def request_keys(self, request_id: str) -> Any:
        """The worker's side: what a request's keys hold besides tokens, for store.chunks(): its
        salt, or an hsstore.salt.RequestKeys where it has LMCache key tags too."""
        salt = self.worker_salts.get(request_id, "")
        tags = self.worker_tags.get(request_id)
        return RequestKeys(salt, tags) if tags else salt

    def stamp_metadata(self, meta: Any, scheduler_output: Any) -> Any:
        """What every step's metadata carries to the worker from the scheduler."""
        # Steps without a forward (only KV transfers) must not read a stale input batch.
        meta.hsstore_forward = scheduler_output.total_num_scheduled_tokens > 0
        ids = [new.req_id for new in scheduler_output.scheduled_new_reqs]
        ids += list(getattr(scheduler_output.scheduled_cached_reqs, "req_ids", ()))
        with self.lock:
            meta.hsstore_reset, self._reset_requested = self._reset_requested, False
            meta.hsstore_salts = {request_id: self.scheduler_salts[request_id]
                                  for request_id in ids if request_id in self.scheduler_salts}
            meta.hsstore_tags = {request_id: self.scheduler_tags[request_id]
                                 for request_id in ids if request_id in self.scheduler_tags}
        return meta

    def bind_salts(self, meta: Any) -> None:
        """The worker's side of stamp_metadata: the salts of this step's requests."""
        self.worker_salts.update(getattr(meta, "hsstore_salts", None) or {})
        self.worker_tags.update(getattr(meta, "hsstore_tags", None) or {})

    def finish_salts(self, request_ids: Any) -> None:
        for request_id in request_ids or ():
            self.worker_salts.pop(request_id, None)
            self.worker_tags.pop(request_id, None)

    def drop_hidden_states(self) -> Optional[int]:
        """The worker's side of a reset: evicts every hidden state its store holds (the KV is
        not touched); the keys dropped, or None where the store cannot drop (LMCache's own)."""
        if self.store is None:
            return None
        dropped = self.store.drop_all()
        if dropped is None:
            logger.warning("hsstore.vllm: reset: the %s store cannot drop its hidden states",
                           self.store.name)
            return None
        self.count(resets=1, reset_keys_dropped=dropped)
        logger.warning("hsstore.vllm: reset: %d hidden-state keys dropped from the pool (the KV "
                       "is kept, and so are the values of the store's disk and Redis tiers, "
                       "%s: their keys name the model's identity, so other weights never read "
                       "them; a prefix hit is capped at the hidden states left, or its rows "
                       "recomputed)", dropped,
                       [tier.get("name") for tier in self.store.stats().get("tiers") or []])
        return dropped

    def flush_and_report(self) -> None:
        """At shutdown, before the store closes: waits for its write-behind to be written or
        dropped (bounded by the tiers' timeouts), then logs what every tier wrote and dropped
        over the engine's life; a warning when anything was dropped (a clean shutdown never
        loses an acknowledged write without saying so)."""
        if self.store is None or self.capture is None or self._flushed:
            return
        self._flushed = True  # vLLM and HiddenStates.shutdown() may both shut the connector down
        try:
            self.store.flush()
            tiers = self.store.stats().get("tiers") or []
        except Exception:  # noqa: BLE001 (shutdown goes on)
            logger.exception("hsstore.vllm: shutdown: flushing the hidden-state store failed")
            return
        if not tiers:
            logger.info("hsstore.vllm: shutdown: no tier behind the pool; its hidden states end "
                        "with this process")
        for tier in tiers:
            dropped = tier.get("dropped_writes", 0)
            (logger.warning if dropped else logger.info)(
                "hsstore.vllm: shutdown: %s tier: %d writes done, %d dropped, %d bytes unsent",
                tier.get("name"), tier.get("writes_done", 0), dropped, tier.get("queue_bytes", 0))

    def stats_token(self) -> tuple:
        """Changes when a prompt arrives or completes, or a lookup is answered (metrics.py)."""
        captured = self.capture.counters if self.capture is not None else {}
        return (captured.get("requests"), captured.get("prompts_completed"),
                self.counters.get("lookups"))

    def report_stats(self) -> Any:
        """vLLM's get_kv_connector_stats: the growth since the last report (metrics.py), or
        None. A failure is logged, never raised into vLLM's step."""
        if self._reporter is None:
            self._reporter = StatsReporter(self.engine_id, self.stats, self.stats_token)
        try:
            return self._reporter.report()
        except Exception:  # noqa: BLE001 (metrics must not stop a step)
            if not self._reporter_failed:
                logger.exception("hsstore.vllm: reading the stats for vLLM's metrics failed")
                self._reporter_failed = True
            return None

    # -- caps -----------------------------------------------------------------------------------

    def cap_hit(self, chunks: List[Any], hit: int, producer: Optional[str] = None) -> int:
        """min(hit, hidden-state coverage of every label) over `chunks` (LMCache's (start, end,
        key) of the request). With a producer (the request's, else hsstore.nixl's), the chunks
        of the hit the store lacks are pulled from it first."""
        if hit <= 0:
            return hit
        chunks = [chunk for chunk in chunks if chunk[0] < hit]
        covered = self.store.coverage(chunks, self.labels)
        if covered < hit and self.transfer is not None:
            self.transfer.fill(chunks, self.labels, hit, producer)
            covered = self.store.coverage(chunks, self.labels)
        return self.capped(hit, covered)

    def capped(self, hit: int, covered: int, *, counted: bool = True) -> int:
        """The cap of every connector's external hit: min(hit, covered), `covered` the tokens of
        the request's prefix whose every chunk has every required label; a cut is counted
        (lookup_hits_capped, lookup_tokens_capped) unless `counted` is False (a hit counted
        already: the MP connector answers vLLM's repeated asks of one request)."""
        if covered >= hit:
            return hit
        if counted:
            self.count(lookup_hits_capped=1, lookup_tokens_capped=hit - covered)
        return covered

    def cap_lmcache_lookups(self, engine: Any) -> None:
        """Wraps engine.lookup (LMCache's synchronous lookup server calls it, on its own thread;
        so does a scheduler-bypass lookup sharing the worker's engine): the hit is at most the
        hidden-state coverage of every label (cap_hit)."""
        original = engine.lookup
        token_database = engine.token_database

        def lookup(tokens=None, hashes=None, offsets=None, search_range=None, lookup_id=None,
                   pin=False, request_configs=None):
            hit = original(tokens=tokens, hashes=hashes, offsets=offsets,
                           search_range=search_range, lookup_id=lookup_id, pin=pin,
                           request_configs=request_configs)
            self.count(lookups=1)
            if hit <= 0:
                return hit
            salt = salt_of(request_configs) if self.store.keys_by_salt else ""
            chunks = []
            for start, end, key in token_database.process_tokens(tokens=tokens, hashes=hashes,
                                                                 offsets=offsets,
                                                                 request_configs=request_configs):
                if start >= hit:
                    break
                chunks.append((start, end, salted(key, salt)))
            return self.cap_hit(chunks, hit, producer_of(request_configs))

        engine.lookup = lookup

    def cap_async_lookups(self, engine: Any, server: Any) -> None:
        """LMCache's async lookup (``enable_async_loading``): the scheduler's
        LMCacheAsyncLookupClient sends the request's chunk hashes to every worker's
        LMCacheAsyncLookupServer, which calls engine.async_lookup_and_prefetch; the storage
        manager answers, when the prefetch is done, with server.send_response_to_scheduler(
        lookup_id, hit) from its event loop, and until then the client answers None ("not yet":
        vLLM skips the request this step). Both are wrapped: the first keeps the request's chunks
        by lookup id, the second caps the hit it sends (cap_hit) on a thread of its own, so a
        pull never stalls LMCache's event loop. Every response goes through that one thread (a
        ZMQ socket is used by one thread at a time). A capped hit leaves prefetched KV chunks
        unused: LMCache's retrieve releases those past the hit, its wait_for_save cleanup the
        rest (a hit capped to 0)."""
        from concurrent.futures import ThreadPoolExecutor

        original_lookup = engine.async_lookup_and_prefetch
        original_send = server.send_response_to_scheduler
        token_database = engine.token_database
        pending: Dict[str, Any] = {}  # lookup id -> (chunks, producer)
        pending_lock = threading.Lock()
        sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsstore-async-lookup")
        self._async_sender = sender

        def async_lookup_and_prefetch(lookup_id, tokens=None, hashes=None, offsets=None,
                                      search_range=None, pin=False, request_configs=None):
            salt = salt_of(request_configs) if self.store.keys_by_salt else ""
            chunks = [(start, end, salted(key, salt)) for start, end, key in
                      token_database.process_tokens(tokens=tokens, hashes=hashes,
                                                    offsets=offsets,
                                                    request_configs=request_configs)]
            with pending_lock:
                pending[lookup_id] = (chunks, producer_of(request_configs))
            return original_lookup(lookup_id=lookup_id, tokens=tokens, hashes=hashes,
                                   offsets=offsets, search_range=search_range, pin=pin,
                                   request_configs=request_configs)

        def respond(lookup_id, num_hit_tokens):
            with pending_lock:
                chunks, producer = pending.pop(lookup_id, (None, None))
            self.count(lookups=1, async_lookups=1)
            hit = num_hit_tokens
            if hit > 0:
                if chunks is None:  # not seen (a lookup sent before the wrap): unverifiable
                    self.count(lookup_hits_capped=1, lookup_tokens_capped=hit)
                    hit = 0
                else:
                    try:
                        hit = self.cap_hit(chunks, hit, producer)
                    except Exception:  # noqa: BLE001 (the scheduler must get an answer)
                        logger.exception("hsstore.vllm: capping async lookup %s failed; "
                                         "reporting no hit", lookup_id)
                        self.count(lookup_hits_capped=1, lookup_tokens_capped=hit)
                        hit = 0
            original_send(lookup_id, hit)

        def send_response_to_scheduler(lookup_id, num_hit_tokens):
            try:
                sender.submit(respond, lookup_id, num_hit_tokens)
            except RuntimeError:  # the sender is shut down (the connector is closing)
                original_send(lookup_id, 0)

        engine.async_lookup_and_prefetch = async_lookup_and_prefetch
        server.send_response_to_scheduler = send_response_to_scheduler

    def cap_local_hits(self, kv_cache_manager: Any, coverage) -> None:
        """Truncates vLLM's own prefix-cache hits at coverage(request) (None: unknown here, the
        worker verifies)."""
        original = kv_cache_manager.get_computed_blocks
        block_size = self.block_size

        def get_computed_blocks(request):
            blocks, hit, boundary = original(request)
            if hit <= 0:
                return blocks, hit, boundary
            covered = coverage(request)
            if covered is None or covered >= hit:
                return blocks, hit, boundary
            keep = covered // block_size * block_size
            self.count(local_hits_capped=1, local_tokens_capped=hit - keep)
            blocks = kv_cache_manager.truncate_computed_blocks(blocks, keep)
            return blocks, keep, boundary if boundary <= keep else 0

        kv_cache_manager.get_computed_blocks = get_computed_blocks


def _calling_model_runner(max_depth: int = 8) -> Any:
    """The vLLM model runner among the callers (the `self` of a frame with a model, an input
    batch and a request table), or None."""
    frame = sys._getframe(1)
    for _ in range(max_depth):
        frame = frame.f_back
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if all(hasattr(candidate, name) for name in ("model", "input_batch", "requests")):
            return candidate
    return None


class StepHooks:
    """Worker hooks around vLLM's step calls, shared by both connectors (a mixin)."""

    _hs: ConnectorState

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._hs.bind_salts(connector_metadata)
        super().bind_connector_metadata(connector_metadata)  # type: ignore[misc]
        if getattr(connector_metadata, "hsstore_reset", False):
            self._hs.drop_hidden_states()  # before this step's restores
        if getattr(connector_metadata, "hsstore_forward", True):
            self._hs.begin_step()

    def wait_for_save(self) -> None:
        super().wait_for_save()  # type: ignore[misc]
        self._hs.end_step()

    def get_block_ids_with_load_errors(self) -> set:
        return set(super().get_block_ids_with_load_errors()) | self._hs.invalid_blocks()  # type: ignore[misc]

    def get_finished(self, finished_req_ids: set):
        self._hs.finish_salts(finished_req_ids)
        return super().get_finished(finished_req_ids)  # type: ignore[misc]

    def request_finished(self, request: Any, block_ids: list):
        self._hs.forget_salt(request.request_id)
        return super().request_finished(request, block_ids)  # type: ignore[misc]

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)  # type: ignore[misc]
        return self._hs.stamp_metadata(meta, scheduler_output)

    def register_kv_caches(self, kv_caches: Any) -> None:
        super().register_kv_caches(kv_caches)  # type: ignore[misc]
        self._hs.attach_to_caller()

    def reset_cache(self) -> Optional[bool]:
        """vLLM's ``POST /reset_prefix_cache?reset_external=true`` (the scheduler's connector):
        the connector's own reset, and every hidden state of the store dropped by the worker
        before its next step's restores (the step's metadata carries it there). A request
        whose hit was looked up before the drop finds its rows missing and recomputes them
        (counted as a recompute); a later one's hit is capped. Never served short. The store's
        backing tiers (disk, Redis) keep their values: they are the same rows for the same model
        (the keys carry its identity: hsstore.vllm.identity), and the log line names them."""
        parent = super().reset_cache()  # type: ignore[misc]
        self._hs.request_reset()
        return parent

    # vLLM's connector metrics: the "KV Transfer metrics" log line and /metrics (metrics.py).
    def get_kv_connector_stats(self) -> Any:
        return self._hs.report_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: Any = None) -> HiddenStateKVStats:
        return HiddenStateKVStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: Any,
                           per_engine_labelvalues: Any) -> HiddenStatePromMetrics:
        return HiddenStatePromMetrics(vllm_config, metric_types, labelnames,
                                      per_engine_labelvalues)

    def shutdown(self) -> None:
        self._hs.stop_async_sender()  # before LMCache closes the lookup server's sockets
        self._hs.close_transfer()  # first: the store's pool goes with LMCache's engine
        self._hs.flush_and_report()
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            self._hs.unregister()
