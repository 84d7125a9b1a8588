#!/usr/bin/env python3
"""hss-bench's Python counterpart: the hsstore Python package against the same calls from C++
(timed in C++ in this process by hsstore._hsstore._cpp_bench) and, when `lmcache` is importable,
against LMCache's own HiddenStateStore and hsstore's drop-in for it, in the same run.

    PYTHONPATH=build/python build/pyenv/bin/python bench/py_bench.py [--quick] [--json out.json]
    /var/cache/hsstore/lmcache-venv/bin/python bench/py_bench.py     # with LMCache side by side

Workloads (float32 rows, chunk 256):
  small     one chunk (256 x 1024): store + retrieve + drop_key, Python vs C++ (+ LMCache)
  overhead  a one-chunk retrieve that misses: the per-call cost of the binding itself
  store     bulk store of `tokens` rows (hidden 1024)
  retrieve  bulk retrieve of the same
  tail8     the last 8 rows of the cached prefix (hsstore: row_begin; LMCache: retrieve + [-8:])
  keys      chunk keys of `tokens` token ids (process_tokens)
  batch     an engine step (256 requests x 3 layers, 32 tokens, hidden 16) as store_batch /
            retrieve_batch_into against the same 768 calls; the retrieve again with a Python
            storage manager bound (and the contains() calls it got per step)
Every figure is the median (and min/max/p25/p75) over --reps repetitions after one warm-up;
Python-side references are interleaved with the candidate rep by rep and their ratio is the median
of per-rep ratios; the C++ reference is timed just before (ratio of medians).
ratio = reference seconds / candidate seconds (> 1: the candidate is faster).
The JSON has hss-bench's layout: {"command", "figures": [...], "skipped", "notes", "targets"}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

import hsstore
from hsstore import _hsstore

try:
    import torch

    torch.set_num_threads(1)  # LMCache's copies on one thread, like the C++ store's calls
except ImportError:  # pragma: no cover - NumPy-only environments
    torch = None

try:
    import lmcache  # noqa: F401
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.hidden_state_store import HiddenStateStore as LMCacheStore
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.token_database import ChunkedTokenDatabase as LMCacheTokenDatabase

    import hsstore.lmcache as dropin
except Exception as e:  # noqa: BLE001 - any import failure means "no LMCache here"
    LMCacheStore = None
    LMCACHE_ERROR = repr(e)

CHUNK = 256


def stats(values: List[float]) -> Dict[str, float]:
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "p25": q[0], "p75": q[2]}


class Timed:
    """One side of a figure: `run` does one call and returns its seconds."""

    def __init__(self, name: str, run: Callable[[], float], nbytes: float = 0.0) -> None:
        self.name, self.run, self.bytes = name, run, nbytes


def timed(fn: Callable[[], object], before: Optional[Callable[[], object]] = None):
    def run() -> float:
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


class Report:
    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.figures: List[dict] = []
        self.skipped: List[dict] = []
        self.notes: List[dict] = []
        self.targets: List[dict] = []

    def measure(self, workload, name, params, candidate: Timed, refs: List[Timed],
                cpp: Optional[List[float]] = None, cpp_name: str = "c++ same calls"):
        # Warm-up, then interleaved repetitions.
        candidate.run()
        for r in refs:
            r.run()
        cand_s: List[float] = []
        ref_s: List[List[float]] = [[] for _ in refs]
        for _ in range(self.reps):
            cand_s.append(candidate.run())
            for i, r in enumerate(refs):
                ref_s[i].append(r.run())
        fig = {
            "workload": workload, "name": name,
            "params": {"chunk_size": CHUNK, "hidden_dim": params.get("hidden_dim", 0),
                       "tokens": params.get("tokens", 0), "layers": 1, "threads": 1,
                       "dtype": "float32", "storage": "float32",
                       "output": params.get("output", "")},
            "reps": self.reps, "bytes": candidate.bytes, "tokens": params.get("tokens", 0),
            "seconds": stats(cand_s),
            "gbps": candidate.bytes / statistics.median(cand_s) / 1e9 if candidate.bytes else 0,
            "tokens_per_s": params.get("tokens", 0) / statistics.median(cand_s),
            "refs": [],
        }
        if cpp is not None:  # timed in C++ just before: a ratio of medians
            ratio = statistics.median(cpp) / statistics.median(cand_s)
            fig["refs"].append({"name": cpp_name, "bytes": candidate.bytes, "seconds": stats(cpp),
                                "ratio": {"median": ratio, "min": ratio, "max": ratio,
                                          "p25": ratio, "p75": ratio}})
        for r, secs in zip(refs, ref_s):  # interleaved: the median of per-rep ratios
            fig["refs"].append({"name": r.name, "bytes": r.bytes, "seconds": stats(secs),
                                "ratio": stats([a / b for a, b in zip(secs, cand_s)])})
        self.figures.append(fig)
        self.print_figure(fig)
        return fig

    @staticmethod
    def print_figure(fig):
        med = fig["seconds"]["median"]
        line = f"{fig['workload']:9s} {fig['name']:34s} {med * 1e6:10.1f} us"
        for r in fig["refs"]:
            line += f" | {r['name']}: {r['seconds']['median'] * 1e6:.1f} us (x{r['ratio']['median']:.2f})"
        print(line, flush=True)


def make_rows(n: int, hidden: int, seed: int = 0):
    rows = np.random.default_rng(seed).standard_normal((n, hidden)).astype(np.float32)
    return torch.from_numpy(rows) if torch is not None else rows


def hs_store(tokens: int, hidden: int) -> hsstore.HiddenStateStore:
    gib = (2 * tokens * hidden * 4 + (64 << 20)) / 2**30
    config = hsstore.Config({"chunk_size": CHUNK, "enable_hidden_state_cache": True,
                             "max_hidden_state_cpu_size": gib})
    return hsstore.HiddenStateStore(config, hsstore.ChunkedTokenDatabase(config))


class KeySet:
    """LMCache's test pattern for a storage manager: the keys whose KV is held; counts questions."""

    def __init__(self, keys):
        self.present = set(keys)
        self.calls = 0

    def contains(self, key, search_range=None, pin=False):
        self.calls += 1
        return "LocalCPUBackend" if key in self.present else None


class AlwaysPresent:
    def contains(self, key, search_range=None, pin=False):
        return "LocalCPUBackend"


def lmcache_pair(tokens: int, hidden: int):
    """LMCache's own store and hsstore's drop-in, on one LMCache config and token database."""
    gib = (2 * tokens * hidden * 4 + (64 << 20)) / 2**30
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, local_disk=None,
        max_local_disk_size=0, remote_url=None, save_unfull_chunk=False,
        enable_hidden_state_cache=True, max_hidden_state_cpu_size=gib)
    metadata = LMCacheMetadata(model_name="bench", world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(1, 2, CHUNK, 1, hidden))
    db = LMCacheTokenDatabase(config, metadata)
    stores = []
    for cls in (LMCacheStore, dropin.HiddenStateStore):
        s = cls(config, db)
        s.bind_storage_manager(AlwaysPresent())
        stores.append(s)
    return db, stores[0], stores[1]


def drop_all(store, keys):
    for k in keys:
        store.drop_key(k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer reps, 4096-token bulk")
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=0, help="bulk tokens (default 16384)")
    ap.add_argument("--json", default="", help="write the figures here")
    ap.add_argument("--no-lmcache", action="store_true")
    args = ap.parse_args()
    reps = args.reps or (15 if args.quick else 41)
    bulk = args.tokens or (4096 if args.quick else 16384)
    hidden = 1024
    use_lmcache = LMCacheStore is not None and not args.no_lmcache
    report = Report(reps)
    print(f"py_bench: python {platform.python_version()}, torch "
          f"{torch.__version__ if torch else 'absent'}, lmcache "
          f"{'0.5.6 side by side' if use_lmcache else 'absent'}; reps {reps}", flush=True)
    if not use_lmcache:
        report.skipped.append({"workload": "*", "what": "lmcache",
                               "reason": "lmcache not importable" if LMCacheStore is None
                               else "--no-lmcache"})

    # small: one chunk store + retrieve + drop_key.
    ids = [i * 7 + 1 for i in range(CHUNK)]
    rows = make_rows(CHUNK, hidden)
    nbytes = 2.0 * CHUNK * hidden * 4
    s = hs_store(CHUNK, hidden)
    db = hsstore.ChunkedTokenDatabase(hsstore.Config({"chunk_size": CHUNK}))
    keys = [k for *_, k in db.process_tokens(ids)]

    def one_chunk_native():
        s.store_hidden_states(ids, rows)
        s.retrieve_hidden_states(ids)
        drop_all(s, keys)

    # Timed alone, like the C++ figure (interleaving LMCache's copies would cool the caches).
    cpp = _hsstore._cpp_bench("one_chunk", CHUNK, hidden, CHUNK, reps)
    fig = report.measure("small", "one-chunk store+retrieve (python)",
                         {"hidden_dim": hidden, "tokens": CHUNK},
                         Timed("python", timed(one_chunk_native), nbytes), [], cpp)
    if use_lmcache:
        ldb, lm, di = lmcache_pair(CHUNK, hidden)
        lkeys = [k for *_, k in ldb.process_tokens(tokens=ids)]

        def one_chunk(store):
            def run():
                store.store_hidden_states(ids, rows)
                store.retrieve_hidden_states(ids)
                drop_all(store, lkeys)
            return run

        report.measure("small", "one-chunk vs lmcache (python)",
                       {"hidden_dim": hidden, "tokens": CHUNK},
                       Timed("python", timed(one_chunk_native), nbytes),
                       [Timed("lmcache one-chunk", timed(one_chunk(lm)), nbytes),
                        Timed("hsstore.lmcache drop-in", timed(one_chunk(di)), nbytes)])
    py_med = fig["seconds"]["median"]
    cpp_med = statistics.median(cpp)
    limit = 1.3 * cpp_med + 10e-6
    report.targets.append({
        "text": "one-chunk store+retrieve from Python within 1.3x of C++ + 10 us",
        "figure": "small/one-chunk store+retrieve (python)", "reference": "c++ same calls",
        "threshold": limit, "at_most": True, "measured": py_med,
        "status": "PASS" if py_med <= limit else "MISS"})

    # overhead: a retrieve that misses (no rows copied): the binding's own cost per call.
    miss_store = hs_store(CHUNK, hidden)
    cpp = _hsstore._cpp_bench("miss", CHUNK, hidden, CHUNK, reps)
    fig = report.measure("overhead", "one-chunk retrieve miss (python)",
                         {"hidden_dim": hidden, "tokens": CHUNK},
                         Timed("python", timed(lambda: miss_store.retrieve_hidden_states(ids))),
                         [], cpp)
    overhead = fig["seconds"]["median"] - statistics.median(cpp)
    report.notes.append({"workload": "overhead",
                         "text": f"per-call overhead (python - c++, miss): {overhead * 1e6:.2f} us"})
    print(f"overhead  per-call binding overhead: {overhead * 1e6:.2f} us", flush=True)

    # Bulk store / retrieve / tail8 / keys.
    bids = [i * 7 + 1 for i in range(bulk)]
    brows = make_rows(bulk, hidden, seed=1)
    bbytes = float(bulk * hidden * 4)
    bs = hs_store(bulk, hidden)
    bkeys = [k for *_, k in db.process_tokens(bids)]
    lm_refs = {}
    if use_lmcache:
        ldb, lm, di = lmcache_pair(bulk, hidden)
        lkeys = [k for *_, k in ldb.process_tokens(tokens=bids)]
        lm_refs = {"lmcache": lm, "hsstore.lmcache drop-in": di}

    def store_refs():
        return [Timed(f"{n} store", timed(lambda st=st: st.store_hidden_states(bids, brows),
                                          lambda st=st: drop_all(st, lkeys)), bbytes)
                for n, st in lm_refs.items()]

    report.measure("store", f"store {bulk} tokens (python)", {"hidden_dim": hidden, "tokens": bulk},
                   Timed("python", timed(lambda: bs.store_hidden_states(bids, brows),
                                         lambda: drop_all(bs, bkeys)), bbytes),
                   store_refs(), _hsstore._cpp_bench("store", CHUNK, hidden, bulk, reps))
    bs.store_hidden_states(bids, brows)
    for st in lm_refs.values():
        st.store_hidden_states(bids, brows)
    report.measure("retrieve", f"retrieve {bulk} tokens (python)",
                   {"hidden_dim": hidden, "tokens": bulk},
                   Timed("python", timed(lambda: bs.retrieve_hidden_states(bids)), bbytes),
                   [Timed(f"{n} retrieve", timed(lambda st=st: st.retrieve_hidden_states(bids)),
                          bbytes) for n, st in lm_refs.items()],
                   _hsstore._cpp_bench("retrieve", CHUNK, hidden, bulk, reps))
    tail_refs = []
    if use_lmcache:
        tail_refs = [Timed("lmcache retrieve + [-8:]",
                           timed(lambda: lm.retrieve_hidden_states(bids)[-8:].clone()), 8 * hidden * 4)]
    report.measure("tail8", "8-row tail, row_begin (python)", {"hidden_dim": hidden, "tokens": bulk},
                   Timed("python", timed(lambda: bs.retrieve_hidden_states(bids, row_begin=bulk - 8)),
                         8.0 * hidden * 4),
                   tail_refs, _hsstore._cpp_bench("tail8", CHUNK, hidden, bulk, reps))
    # The same two with the token ids as a NumPy array: borrowed, not converted element by element.
    nids = np.array(bids, np.int64)
    report.measure("tail8", "8-row tail, NumPy ids (python)", {"hidden_dim": hidden, "tokens": bulk},
                   Timed("python", timed(lambda: bs.retrieve_hidden_states(nids, row_begin=bulk - 8)),
                         8.0 * hidden * 4),
                   [], _hsstore._cpp_bench("tail8", CHUNK, hidden, bulk, reps))
    report.measure("keys", f"keys of {bulk} tokens, NumPy ids (python)", {"tokens": bulk},
                   Timed("python", timed(lambda: db.process_tokens(nids))), [],
                   _hsstore._cpp_bench("keys", CHUNK, hidden, bulk, reps))
    key_refs = []
    if use_lmcache:
        key_refs = [Timed("lmcache keys", timed(lambda: list(ldb.process_tokens(tokens=bids))))]
    report.measure("keys", f"keys of {bulk} tokens (python)", {"tokens": bulk},
                   Timed("python", timed(lambda: db.process_tokens(bids))), key_refs,
                   _hsstore._cpp_bench("keys", CHUNK, hidden, bulk, reps))

    # batch: an engine step (256 requests x 3 layers, 32 tokens of chunk 16, hidden 16: copies
    # negligible) as one store_batch / retrieve_batch_into against the same 768 calls from Python.
    bcfg = hsstore.Config({"chunk_size": 16, "enable_hidden_state_cache": True,
                           "max_hidden_state_cpu_size": 8 / 1024, "hidden_state_block_bytes": 1024})
    bdb = hsstore.ChunkedTokenDatabase(bcfg)
    step = hsstore.HiddenStateStore(bcfg, bdb)
    prompts = [np.arange(1000 * r, 1000 * r + 32, dtype=np.int64) for r in range(256)]
    step_keys = [k for p in prompts for *_, k in bdb.process_tokens(p)]
    # One tensor per item (an engine passes a slice per request and layer).
    step_rows = np.random.default_rng(3).standard_normal((768, 32, 16)).astype(np.float32)
    store_items = [(p, step_rows[layer * 256 + r], layer) for layer in range(3)
                   for r, p in enumerate(prompts)]
    outs = [np.empty((32, 16), np.float32) for _ in store_items]
    read_items = [(p, o, layer) for (p, _, layer), o in zip(store_items, outs)]

    def store_singles():
        for p, h, layer in store_items:
            step.store_hidden_states(p, h, layer_idx=layer)

    def read_singles():
        for p, o, layer in read_items:
            step.retrieve_hidden_states_into(p, o, layer_idx=layer)

    step_bytes = float(len(store_items) * 32 * 16 * 4)
    reset = lambda: drop_all(step, step_keys)  # noqa: E731
    figs = [report.measure("batch", "store_batch 768 items (python)",
                           {"hidden_dim": 16, "tokens": 32},
                           Timed("python", timed(lambda: step.store_batch(store_items), reset),
                                 step_bytes),
                           [Timed("768 store_hidden_states calls", timed(store_singles, reset),
                                  step_bytes)])]
    step.store_batch(store_items)

    def measure_reads(name):
        return report.measure("batch", name, {"hidden_dim": 16, "tokens": 32},
                              Timed("python", timed(lambda: step.retrieve_batch_into(read_items)),
                                    step_bytes),
                              [Timed("768 retrieve_hidden_states_into calls", timed(read_singles),
                                     step_bytes)])

    figs.append(measure_reads("retrieve_batch_into 768 items (python)"))
    # The same reads with a Python storage manager bound (LMCache's pattern: a set of the keys
    # whose KV is held), as in an engine: contains() re-acquires the GIL for every question.
    kv = KeySet(step_keys)
    step.bind_storage_manager(kv)
    kv.calls = 0
    step.retrieve_batch_into(read_items)
    batch_calls = kv.calls
    kv.calls = 0
    read_singles()
    single_calls = kv.calls
    figs.append(measure_reads("retrieve_batch_into 768 items, Python KV bound (python)"))
    step.bind_storage_manager(None)
    kv_text = (f"contains() calls per step with the Python KV bound: {batch_calls} in one batch, "
               f"{single_calls} in the single calls")
    report.notes.append({"workload": "batch", "text": kv_text})
    print(f"batch     {kv_text}", flush=True)
    for f in figs:
        text = (f"{f['name']}: {f['seconds']['median'] / 768 * 1e6:.2f} us per item in one batch, "
                f"{f['refs'][0]['seconds']['median'] / 768 * 1e6:.2f} us per single call, batch "
                f"{f['refs'][0]['ratio']['median']:.2f}x faster")
        report.notes.append({"workload": "batch", "text": text})
        print(f"batch     {text}", flush=True)

    for t in report.targets:
        print(f"target: {t['text']}: measured {t['measured'] * 1e6:.1f} us, limit "
              f"{t['threshold'] * 1e6:.1f} us -> {t['status']}")
    if args.json:
        command = " ".join([os.path.basename(sys.executable), *sys.argv])
        with open(args.json, "w") as f:
            json.dump({"command": command, "figures": report.figures, "skipped": report.skipped,
                       "notes": report.notes, "targets": report.targets}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
