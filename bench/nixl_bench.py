"""hsstore.nixl against raw NIXL READs, two processes on loopback (UCX over TCP on lo).

    PYTHONPATH=build/python UCX_TLS=tcp,self UCX_NET_DEVICES=lo \
        $(scripts/nixl_venv) bench/nixl_bench.py [--reps 7] [--mac] [--quick]

Figures (docs/perf.md), each rep interleaving the candidate with its reference in the same run:
  bulk   pull of a 16K x 4096 float32 prompt (256 MiB, 64 chunks) from the producer's pool into
         the consumer's (export + lease, READ, release, xxHash3 check [+ MAC], publish), against
         one raw NIXL READ of the same bytes between two registered buffers;
  small  256 one-chunk pulls (256 x 4096 float32, 4 MiB each; 32 distinct prompts, each dropped
         on the consumer after its pull), per-request latency, against a raw 4 MiB READ.
--mac gives both stores the same hidden_state_mac_key (HMAC-SHA256 on export and on publish).
The producer exports each entry's digest once (cached), so repeated pulls pay the consumer's
verification only; the first pull's extra cost is reported apart ("cold").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CHUNK = 256
KEY = "benchmark-shared-mac-key-0123456789"


def config(pool_mib, mac):
    c = {"chunk_size": CHUNK, "enable_hidden_state_cache": True,
         "max_hidden_state_cpu_size": pool_mib / 1024.0, "hidden_state_transfer": "nixl",
         "hidden_state_transfer_timeout_ms": 60000}
    if mac:
        c["hidden_state_mac_key"] = KEY
    else:  # values unauthenticated: the control channel runs without a key (loopback only)
        c["hidden_state_transfer_trusted_network"] = True
    return c


def tokens_for(seed, n):
    return list(np.random.default_rng(seed).integers(0, 50000, size=n))


def producer_main(args):
    import hsstore
    import hsstore.nixl

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # UCX prints to stdout
    engine = hsstore.Engine(config(args.tokens * args.hidden * 4 // (1 << 20) + 32 * 4 + 16, args.mac))
    agent = hsstore.nixl.NixlAgent(engine)
    store = engine.hidden_state_store
    store.bind_storage_manager(None)  # no KV in this benchmark: every chunk's KV counts as present
    rows = np.random.default_rng(1).standard_normal((args.tokens, args.hidden), dtype=np.float32)
    store.store_hidden_states(tokens_for(1, args.tokens), rows, layer_idx=0)
    for p in range(args.prompts):
        small = np.random.default_rng(100 + p).standard_normal((CHUNK, args.hidden), dtype=np.float32)
        store.store_hidden_states(tokens_for(100 + p, CHUNK), small, layer_idx=0)
    raw = np.ones(args.tokens * args.hidden, dtype=np.float32)
    agent._agent.register_memory([(raw.ctypes.data, raw.nbytes, 0, "")], "DRAM")
    replies.write(json.dumps({"address": agent.address, "raw": raw.ctypes.data}) + "\n")
    replies.flush()
    sys.stdin.readline()
    agent.close()


def read_raw(agent, remote_agent, local_addr, remote_addr, nbytes):
    local = agent.get_xfer_descs(np.array([[local_addr, nbytes, 0]], dtype=np.uint64), "DRAM")
    remote = agent.get_xfer_descs(np.array([[remote_addr, nbytes, 0]], dtype=np.uint64), "DRAM")
    t0 = time.perf_counter()
    handle = agent.initialize_xfer("READ", local, remote, remote_agent)
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    dt = time.perf_counter() - t0
    agent.release_xfer_handle(handle)
    assert state == "DONE", state
    return dt


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="consumer")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--small", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--mac", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.hidden, args.reps, args.small, args.prompts = 2048, 1024, 2, 16, 4
    if args.role == "producer":
        return producer_main(args)

    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp,self")
    env.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.update({k: env[k] for k in ("UCX_TLS", "UCX_NET_DEVICES")})
    producer = subprocess.Popen(  # the process exists before any agent (NIXL's rule)
        [sys.executable, os.path.abspath(__file__), "--role", "producer", "--tokens", str(args.tokens),
         "--hidden", str(args.hidden), "--prompts", str(args.prompts)] + (["--mac"] if args.mac else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        hello = json.loads(producer.stdout.readline())
        import hsstore
        import hsstore.nixl

        engine = hsstore.Engine(config(args.tokens * args.hidden * 4 // (1 << 20) + 32, args.mac))
        store = engine.hidden_state_store
        store.bind_storage_manager(None)
        agent = hsstore.nixl.NixlAgent(engine, serve=False)
        raw_dst = np.full(args.tokens * args.hidden, 2.0, dtype=np.float32)  # touched, like the pool
        agent._agent.register_memory([(raw_dst.ctypes.data, raw_dst.nbytes, 0, "")], "DRAM")
        bulk_tokens = tokens_for(1, args.tokens)
        bulk_keys = [k for (_s, _e, k) in engine.token_database.process_tokens(bulk_tokens)]
        bulk_bytes = args.tokens * args.hidden * 4
        chunk_bytes = CHUNK * args.hidden * 4

        def drop(keys):
            for k in keys:
                store.drop_key(k)

        t0 = time.perf_counter()
        cold = agent.pull(hello["address"], bulk_tokens, [0])
        cold_s = time.perf_counter() - t0
        assert cold.missed is None and cold.tokens == args.tokens, cold
        remote_agent = agent._peers[next(iter(agent._peers))].remote_agent
        drop(bulk_keys)
        bulk, raw, ratios = [], [], []
        for _ in range(args.reps):
            r = read_raw(agent._agent, remote_agent, raw_dst.ctypes.data, hello["raw"], bulk_bytes)
            t0 = time.perf_counter()
            res = agent.pull(hello["address"], bulk_tokens, [0])
            b = time.perf_counter() - t0
            assert res.missed is None and res.tokens == args.tokens, res
            drop(bulk_keys)
            bulk.append(bulk_bytes / b / 1e9)
            raw.append(bulk_bytes / r / 1e9)
            ratios.append(r / b)
        small_prompts = [tokens_for(100 + p, CHUNK) for p in range(args.prompts)]
        small_keys = [engine.token_database.process_tokens(t)[0][2] for t in small_prompts]
        small, small_raw = [], []
        for i in range(args.small):
            p = i % args.prompts
            small_raw.append(read_raw(agent._agent, remote_agent, raw_dst.ctypes.data, hello["raw"],
                                      chunk_bytes) * 1e3)
            t0 = time.perf_counter()
            res = agent.pull(hello["address"], small_prompts[p], [0])
            small.append((time.perf_counter() - t0) * 1e3)
            assert res.missed is None and res.tokens == CHUNK, res
            store.drop_key(small_keys[p])
        out = {
            "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "mac": args.mac, "tokens": args.tokens, "hidden": args.hidden,
            "bulk_GBps": summary(bulk), "raw_read_GBps": summary(raw),
            "bulk_vs_raw": summary(ratios), "cold_first_pull_s": cold_s,
            "small_ms": {**summary(small), "p90": float(np.percentile(small, 90))},
            "small_raw_ms": {**summary(small_raw), "p90": float(np.percentile(small_raw, 90))},
            "small_vs_raw_latency": statistics.median(small) / statistics.median(small_raw),
            "agent": agent.stats(), "transfer": store.stats()["transfer"],
        }
        print(json.dumps(out, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        agent.close()
    finally:
        try:
            producer.stdin.write("exit\n")
            producer.stdin.flush()
            producer.wait(timeout=30)
        except Exception:  # noqa: BLE001
            producer.kill()


if __name__ == "__main__":
    main()
