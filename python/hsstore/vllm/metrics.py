"""hsstore.vllm's counters as vLLM connector metrics: the "KV Transfer metrics" log line and
Prometheus series on ``vllm serve``'s ``/metrics`` (``hsstore:<name>_total`` counters and
``hsstore:<name>`` gauges, labelled like vLLM's own by model and engine).

How they travel (vLLM's KVConnectorStats protocol):

1. Each worker's connector answers ``get_kv_connector_stats()`` after every step; at most once per
   :data:`REPORT_INTERVAL_S` it reads its ``stats()`` (the capture's, the connector's, the store's
   and its tiers'), flattens them (:data:`COUNTERS`, :data:`GAUGES`) and returns the counters'
   growth since its last report plus the gauges now. Between reports it returns None, so the
   per-step cost is a clock read. A step that saw a prompt arrive or complete reports at once
   (a cheap check, ``token``): the figures of an engine gone idle are not left a step behind.
2. The scheduler aggregates workers and steps (:meth:`HiddenStateKVStats.aggregate`: counters
   add up, a gauge keeps each reporter's latest value) and sends ``to_dict()`` to the front end.
3. There, vLLM's logger reduces it to one line per logging interval, and
   :class:`HiddenStatePromMetrics` adds the counters and sets the gauges (the sum over reporters).

A scheduler and a worker sharing a process share one set of connector counters (connector.py);
whichever asks first reports their growth, so nothing is counted twice.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Dict, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

__all__ = ["COUNTERS", "GAUGES", "REPORT_INTERVAL_S", "HiddenStateKVStats",
           "HiddenStatePromMetrics", "StatsReporter", "flatten"]

#: Seconds between two reports of one worker (vLLM logs every 10 s; Prometheus is scraped).
REPORT_INTERVAL_S = 1.0

#: Counters: name -> what it counts. A name is its key in ``stats()`` (the capture's and the
#: connector's), ``store_<key>`` for the store's, ``<tier>_<key>`` for a tier's (each row of the
#: store's ``stats()["tiers"]``, by its name: disk, remote, any other).
COUNTERS: Dict[str, str] = {
    "requests": "prompts the capture saw",
    "prompts_completed": "prompts whose every row was restored or computed",
    "rows_computed": "prompt rows the forward pass computed and the capture kept",
    "rows_restored": "prompt rows restored from the store instead of computed",
    "rows_stored": "prompt rows written to the store",
    "recomputes": "restores that found rows missing at step time: vLLM recomputed them",
    "tokens_recomputed": "tokens those recomputes covered",
    "results_dropped_untaken": "finished prompts dropped before take() (hsstore.keep)",
    "lookups": "prefix lookups answered (KV hit capped at hidden-state coverage)",
    "lookup_hits_capped": "lookups whose KV hit was cut for missing hidden states",
    "lookup_tokens_capped": "tokens cut from those hits (computed instead)",
    "local_hits_capped": "vLLM prefix-cache hits cut for missing hidden states",
    "local_tokens_capped": "tokens cut from those hits",
    "pulls": "hsstore.nixl pulls from a producer",
    "pulled_chunks": "chunks those pulls brought",
    "pulls_missed": "pulls that brought nothing (producer down, absent, rejected)",
    "lookups_server_down": "MP lookups answered as no hit: the LMCache server was down",
    "resets": "POST /reset_prefix_cache?reset_external=true: hidden states dropped",
    "reset_keys_dropped": "hidden-state keys those resets dropped",
    "files_written": "hsstore.output_dir files written",
    "files_dropped": "output files not written (queue full, bad request id, closed, over the "
                     "directory's budget alone)",
    "files_refused": "output files refused: their name existed already (never replaced)",
    "files_evicted": "output files deleted, oldest first, to keep hsstore.output_max_bytes",
    "file_write_errors": "output files that failed to write (counted, the writer goes on)",
    "store_hit_tokens": "tokens the store's retrieves found",
    "store_miss_tokens": "tokens the store's retrieves asked for beyond the cached prefix",
    "store_hs_evictions": "keys evicted for hidden-state pool pressure (KV kept)",
    "store_coupled_evictions": "keys dropped because their KV was evicted",
    "store_allocation_failures": "stores that stopped early for want of pool space",
    "store_copy_failures": "chunks dropped because a device copy into them failed",
}
#: Per tier (``tiers[i]`` of the store's stats, by the tier's name): counters.
TIER_COUNTERS: Dict[str, str] = {
    "hits": "values the tier returned, checked",
    "misses": "values asked of the tier and not returned (absent, down, corrupt)",
    "corrupt_values": "values present but failing a check",
    "promotions": "values copied into the pool by a read-through",
    "writes_done": "writes the tier acknowledged",
    "dropped_writes": "writes dropped (queue full, tier down or failing, closed)",
    "errors": "I/O and connection failures, timeouts, error replies",
}
#: Gauges: a figure of the moment (same naming).
GAUGES: Dict[str, str] = {
    "in_flight": "prompts being captured now",
    "files_pending": "output files queued for the writer now",
    "files_pending_bytes": "bytes of the output files queued for the writer now",
    "store_keys_held": "chunk keys the store holds now",
    "store_bytes_held": "payload bytes the pool holds now",
    "store_pool_capacity_bytes": "usable pool bytes",
}
TIER_GAUGES: Dict[str, str] = {"queue_bytes": "bytes waiting to be written now"}
#: The tiers whose series /metrics shows from the start (at zero); a row of another name in
#: ``stats()["tiers"]`` gets its series when it is first reported (:func:`tier_metric`).
TIER_NAMES = ("disk", "remote")


def tier_metric(name: str, tier_keys: Dict[str, str]) -> Optional[tuple]:
    """(tier, what it counts) when ``name`` is ``<tier>_<key>`` of a key of ``tier_keys``
    (:data:`TIER_COUNTERS` or :data:`TIER_GAUGES`) and makes a Prometheus name, else None."""
    for key, doc in tier_keys.items():
        tier = name[: -len(key) - 1]
        if name.endswith("_" + key) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tier):
            return tier, doc
    return None


def flatten(stats: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """{"counters": {...}, "gauges": {...}} of a connector's stats() (names as above; a figure a
    store does not report is left out)."""
    counters: Dict[str, float] = {}
    gauges: Dict[str, float] = {}

    def take(source: Dict[str, Any], key: str, name: str, out: Dict[str, float]) -> None:
        value = source.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value

    store = stats.get("store_stats") or {}
    for name in COUNTERS:
        source, key = (store, name[6:]) if name.startswith("store_") else (stats, name)
        take(source, key, name, counters)
    for name in GAUGES:
        source, key = (store, name[6:]) if name.startswith("store_") else (stats, name)
        take(source, key, name, gauges)
    for tier in store.get("tiers") or []:
        tier_name = tier.get("name") if isinstance(tier, dict) else None
        if not isinstance(tier_name, str) or not tier_name:
            continue
        for key in TIER_COUNTERS:
            take(tier, key, f"{tier_name}_{key}", counters)
        for key in TIER_GAUGES:
            take(tier, key, f"{tier_name}_{key}", gauges)
    return {"counters": counters, "gauges": gauges}


class HiddenStateKVStats(KVConnectorStats):
    """``data = {"counters": {name: growth}, "gauges": {reporter: {name: value}}}``: counters add
    up across steps and workers; a gauge keeps each reporter's latest value (a reporter is a
    process and engine: two workers' pools add up, two reports of one pool do not)."""

    def __post_init__(self) -> None:
        self.data.setdefault("counters", {})
        self.data.setdefault("gauges", {})

    def reset(self) -> None:
        self.data = {"counters": {}, "gauges": {}}

    def aggregate(self, other: KVConnectorStats) -> "HiddenStateKVStats":
        counters = dict(self.data.get("counters", {}))
        for name, value in other.data.get("counters", {}).items():
            counters[name] = counters.get(name, 0) + value
        gauges = dict(self.data.get("gauges", {}))
        gauges.update(other.data.get("gauges", {}))
        return HiddenStateKVStats(data={"counters": counters, "gauges": gauges})

    def gauge_totals(self) -> Dict[str, float]:
        totals: Dict[str, float] = {}
        for values in self.data.get("gauges", {}).values():
            for name, value in values.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    def reduce(self) -> Dict[str, int | float]:
        out: Dict[str, int | float] = {f"hsstore_{k}": v
                                       for k, v in self.data.get("counters", {}).items() if v}
        out.update({f"hsstore_{k}": v for k, v in self.gauge_totals().items()})
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get("counters", {}).values()) and not self.data.get("gauges")


class StatsReporter:
    """One per connector role object: the growth of its stats() since its last report. The
    counters a scheduler and a worker of one process share (connector.py's per-engine set) go to
    whichever reports first: their previous values live here, shared by engine id."""

    _shared_lock = threading.Lock()
    _shared_last: Dict[str, Dict[str, float]] = {}

    def __init__(self, engine_id: str, stats: Any, token: Any, *,
                 interval_s: float = REPORT_INTERVAL_S):
        self.engine_id = engine_id
        self.stats = stats  # () -> the connector's stats() dict
        self.token = token  # () -> a cheap value that changes when a prompt arrives or completes
        self.interval_s = interval_s
        self.reporter = f"{os.getpid()}:{engine_id}"
        self._next = 0.0
        self._token: Any = None

    def report(self) -> Optional[HiddenStateKVStats]:
        now = time.monotonic()
        token = self.token()
        if now < self._next and token == self._token:
            return None
        self._next = now + self.interval_s
        self._token = token
        flat = flatten(self.stats())
        growth: Dict[str, float] = {}
        with self._shared_lock:
            last = self._shared_last.setdefault(self.engine_id, {})
            for name, value in flat["counters"].items():
                if value != last.get(name, 0):
                    # A counter that went down was reset (a store rebuilt): its new value is new.
                    growth[name] = value - last.get(name, 0) if value > last.get(name, 0) else value
                last[name] = value
        gauges = {self.reporter: flat["gauges"]} if flat["gauges"] else {}
        return HiddenStateKVStats(data={"counters": growth, "gauges": gauges})


class HiddenStatePromMetrics(KVConnectorPromMetrics):
    """hsstore's series for vLLM's Prometheus logger (one child per engine, vLLM's labels)."""

    PREFIX = "hsstore:"

    def __init__(self, vllm_config: Any, metric_types: Dict[type, type], labelnames: list,
                 per_engine_labelvalues: Dict[int, list]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from prometheus_client import Counter, Gauge

        counter_docs = dict(COUNTERS)
        gauge_docs = dict(GAUGES)
        for tier in TIER_NAMES:
            counter_docs.update({f"{tier}_{k}": f"{tier} tier: {v}"
                                 for k, v in TIER_COUNTERS.items()})
            gauge_docs.update({f"{tier}_{k}": f"{tier} tier: {v}" for k, v in TIER_GAUGES.items()})
        self.counters = {name: self._per_engine(metric_types[Counter], name, doc, labelnames)
                         for name, doc in counter_docs.items()}
        self.gauges = {name: self._per_engine(metric_types[Gauge], name, doc, labelnames)
                       for name, doc in gauge_docs.items()}

    def _per_engine(self, cls: type, name: str, doc: str, labelnames: list) -> Dict[int, Any]:
        metric = cls(name=self.PREFIX + name, documentation=f"hsstore: {doc}",
                     labelnames=labelnames)
        return {idx: metric.labels(*values) for idx, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        stats = HiddenStateKVStats(data=dict(transfer_stats_data))
        for name, value in stats.data.get("counters", {}).items():
            if self._series(self.counters, self._counter_cls, TIER_COUNTERS, name) and value > 0:
                self.counters[name][engine_idx].inc(value)
        for name, value in stats.gauge_totals().items():
            if self._series(self.gauges, self._gauge_cls, TIER_GAUGES, name):
                self.gauges[name][engine_idx].set(value)

    def _series(self, series: Dict[str, Dict[int, Any]], cls: type, tier_keys: Dict[str, str],
                name: str) -> bool:
        """Whether ``name`` has a series, making it for a tier not declared up front (the
        metric classes and label names are those KVConnectorPromMetrics keeps)."""
        if name not in series:
            found = tier_metric(name, tier_keys)
            if found is None:
                return False
            tier, doc = found
            series[name] = self._per_engine(cls, name, f"{tier} tier: {doc}", self._labelnames)
        return True
