#!/usr/bin/env python3
"""Out of the box: hsstore's default store against LMCache 0.5.6's HiddenStateStore with its
defaults (torch's default intra-op threads), as a user comparing the two libraries would run them.

    PYTHONPATH=build/python /var/cache/hsstore/vllm-venv/bin/python bench/defaults_bench.py \
        [--rounds 4] [--reps 5] [--tokens 16384] [--hidden 4096] [--json out.json]

Workloads, float32 rows stored as float32 and bfloat16 rows stored natively, chunk 256:
  store f32 / store bf16        one prefix of `tokens` rows (the keys dropped between reps)
  retrieve f32 / retrieve bf16  the cached prefix into a fresh tensor
  one chunk                     store + retrieve + drop_key of one 256 x hidden chunk (f32)
Neither side is tuned: hsstore's config names only the chunk size and the pool size, LMCache's
config the same; torch keeps its default thread count. Each round times every workload on both
sides (the order alternates by round; median of --reps after one warm-up); the figure is the
median and range over rounds of the per-round ratio LMCache seconds / hsstore seconds
(> 1: hsstore faster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

import hsstore
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.hidden_state_store import HiddenStateStore as LMCacheStore
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.token_database import ChunkedTokenDatabase as LMCacheTokenDatabase

CHUNK = 256


class AlwaysPresent:
    """A storage manager whose KV holds every chunk: the figures measure the stores alone."""

    def contains(self, key, search_range=None, pin=False):
        return "LocalCPUBackend"


def pool_gib(tokens: int, hidden: int) -> float:
    return (2 * tokens * hidden * 4 + (64 << 20)) / 2**30


def hsstore_side(tokens: int, hidden: int):
    config = hsstore.Config({"chunk_size": CHUNK, "enable_hidden_state_cache": True,
                             "max_hidden_state_cpu_size": pool_gib(tokens, hidden)})
    db = hsstore.ChunkedTokenDatabase(config)
    store = hsstore.HiddenStateStore(config, db)
    keys = [k for *_, k in db.process_tokens(list(range(1, tokens + 1)))]
    return store, keys


def lmcache_side(tokens: int, hidden: int):
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, local_disk=None,
        max_local_disk_size=0, remote_url=None, save_unfull_chunk=False,
        enable_hidden_state_cache=True, max_hidden_state_cpu_size=pool_gib(tokens, hidden))
    metadata = LMCacheMetadata(model_name="bench", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(1, 2, CHUNK, 1, hidden))
    db = LMCacheTokenDatabase(config, metadata)
    store = LMCacheStore(config, db)
    store.bind_storage_manager(AlwaysPresent())
    keys = [k for *_, k in db.process_tokens(tokens=list(range(1, tokens + 1)))]
    return store, keys


def median_seconds(fn: Callable[[], object], before: Callable[[], object], reps: int) -> float:
    before()
    fn()  # warm-up
    times = []
    for _ in range(reps):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def workloads(store, keys, rows: Dict[str, torch.Tensor], ids_of: Dict[int, List[int]]):
    """name -> (timed call, untimed reset before it)."""
    tokens = len(ids_of["bulk"])

    def drop():
        for k in keys:
            store.drop_key(k)

    def store_of(dtype):
        return lambda: store.store_hidden_states(ids_of["bulk"], rows[dtype])

    def filled(dtype):
        def before():
            drop()
            store.store_hidden_states(ids_of["bulk"], rows[dtype])
        return before

    def retrieve():
        out = store.retrieve_hidden_states(ids_of["bulk"])
        assert out is not None and out.shape[0] == tokens
        return out

    one = ids_of["one"]

    def one_chunk():
        store.store_hidden_states(one, rows["one"])
        out = store.retrieve_hidden_states(one)
        assert out is not None and out.shape[0] == CHUNK
        for k in keys[:1]:
            store.drop_key(k)

    return {
        "store f32": (store_of("f32"), drop),
        "store bf16": (store_of("bf16"), drop),
        "retrieve f32": (retrieve, filled("f32")),
        "retrieve bf16": (retrieve, filled("bf16")),
        "one chunk store+retrieve": (one_chunk, drop),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    tokens, hidden = args.tokens, args.hidden
    gen = torch.Generator().manual_seed(0)
    f32 = torch.randn(tokens, hidden, generator=gen, dtype=torch.float32)
    rows = {"f32": f32, "bf16": f32.to(torch.bfloat16), "one": f32[:CHUNK].clone()}
    ids_of = {"bulk": list(range(1, tokens + 1)), "one": list(range(1, CHUNK + 1))}

    hs, hs_keys = hsstore_side(tokens, hidden)
    lm, lm_keys = lmcache_side(tokens, hidden)
    host_copy = hs.stats()["host_copy"]
    print(f"defaults_bench: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, python {platform.python_version()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} intra-op threads), lmcache 0.5.6, hsstore copy threads "
          f"{host_copy['copy_threads']} ({host_copy['copy_threads_reason']}); "
          f"{tokens} x {hidden}, {args.rounds} rounds x {args.reps} reps", flush=True)
    sides = {"hsstore": workloads(hs, hs_keys, rows, ids_of),
             "lmcache": workloads(lm, lm_keys, rows, ids_of)}
    ratios: Dict[str, List[float]] = {name: [] for name in sides["hsstore"]}
    seconds: Dict[str, Dict[str, List[float]]] = {
        name: {"hsstore": [], "lmcache": []} for name in ratios}
    for rnd in range(args.rounds):
        order = ["hsstore", "lmcache"] if rnd % 2 == 0 else ["lmcache", "hsstore"]
        for name in ratios:
            got = {}
            for side in order:
                fn, before = sides[side][name]
                got[side] = median_seconds(fn, before, args.reps)
                seconds[name][side].append(got[side])
            ratios[name].append(got["lmcache"] / got["hsstore"])
        print(f"  round {rnd + 1}: " + ", ".join(
            f"{n} {ratios[n][-1]:.2f}x" for n in ratios), flush=True)
    print(f"{'workload':28s} {'hsstore':>10s} {'lmcache':>10s}  lmcache/hsstore median [range]")
    figures = []
    for name, r in ratios.items():
        hs_med = statistics.median(seconds[name]["hsstore"])
        lm_med = statistics.median(seconds[name]["lmcache"])
        print(f"{name:28s} {hs_med * 1e3:8.2f}ms {lm_med * 1e3:8.2f}ms  "
              f"{statistics.median(r):.2f}x [{min(r):.2f}, {max(r):.2f}]")
        figures.append({"name": name, "hsstore_s": seconds[name]["hsstore"],
                        "lmcache_s": seconds[name]["lmcache"], "ratios": r})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "host_copy": host_copy,
                       "torch_threads": torch.get_num_threads(), "figures": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
