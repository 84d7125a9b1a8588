#!/usr/bin/env python3
"""FP8 storage's error and host cost through the real store (docs/perf.md, "FP8 storage").

Stores random-normal rows (tokens x hidden, float32, or --bf16 rounded first) in a host store
per hidden_state_storage_dtype and retrieves them as float32; prints, per storage, the error
relative to each row's amax (max, mean), the per-element relative error where |x| >= amax / 64,
the per-row cosine similarity (min, mean), the chunks a pool holds, and the median host store and
retrieve seconds. Run:
    PYTHONPATH=<build>/python <build>/../build/pyenv/bin/python scripts/fp8_error.py
"""

import argparse
import json
import statistics
import time

import numpy as np

import hsstore


class _AllPresent:
    def contains(self, key, search_range=None, pin=False):
        return "LocalCPUBackend"


def measure(storage, data, chunk, repeats):
    pool_gib = 2 * data.nbytes / 2**30 + 0.01
    config = hsstore.Config({
        "chunk_size": chunk,
        "enable_hidden_state_cache": True,
        "max_hidden_state_cpu_size": pool_gib,
        "max_local_cpu_size": 0.01,
        "hidden_state_storage_dtype": storage,
        "hidden_state_copy_threads": 1,
    })
    db = hsstore.ChunkedTokenDatabase(config, hsstore.Metadata(model_name="m"))
    store_s, retrieve_s = [], []
    out = None
    for r in range(repeats):
        store = hsstore.HiddenStateStore(config, db)
        store.bind_storage_manager(_AllPresent())
        tokens = list(range(r * 10**6, r * 10**6 + data.shape[0]))
        t0 = time.perf_counter()
        store.store_hidden_states(tokens, data)
        t1 = time.perf_counter()
        out = store.retrieve_hidden_states(tokens, like="numpy")
        t2 = time.perf_counter()
        store_s.append(t1 - t0)
        retrieve_s.append(t2 - t1)
        held = store.stats()["bytes_held"]
        store.close()
    x = data.astype(np.float64)
    y = out.astype(np.float64)
    amax = np.abs(x).max(axis=1, keepdims=True)
    err = np.abs(y - x)
    big = np.abs(x) >= amax / 64
    cos = (x * y).sum(axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return {
        "storage": storage,
        "max_err_over_amax": float((err / amax).max()),
        "mean_err_over_amax": float((err / amax).mean()),
        "max_rel_err_where_x_ge_amax_over_64": float((err[big] / np.abs(x[big])).max()),
        "mean_rel_err_where_x_ge_amax_over_64": float((err[big] / np.abs(x[big])).mean()),
        "min_cosine": float(cos.min()),
        "mean_cosine": float(cos.mean()),
        "bytes_held": int(held),
        "store_s_median": statistics.median(store_s),
        "retrieve_s_median": statistics.median(retrieve_s),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--float16", action="store_true", help="store float16 input")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = rng.standard_normal((args.tokens, args.hidden), dtype=np.float32)
    if args.float16:
        data = data.astype(np.float16)
    for storage in ("float32", "native", "fp8_e4m3", "fp8_e5m2"):
        print(json.dumps(measure(storage, data, args.chunk, args.repeats)))


if __name__ == "__main__":
    main()
