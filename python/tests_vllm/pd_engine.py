"""One engine process of the prefill/decode test (test_vllm_pd_nixl.py): a real vLLM engine (one
process: engine core and worker in it) with hsstore.vllm and LMCache, its KV written to and read
from LMCache's Redis remote backend, its hidden states served or pulled over NIXL. Driven by JSON
lines on stdin, one reply line per command on a private copy of stdout (vLLM and UCX print to
fd 1, which goes to stderr here).

    python pd_engine.py '{"model": DIR, "redis_port": P, "nixl": {...}, "layers": [...]}'

Commands: {"cmd": "generate", "prompt": [...], "skip_prefix_cache": bool, "save": PATH} (the
prompt's hidden states go to PATH with torch.save; the reply has the output, num_cached_tokens,
the request's counter deltas, the LMCache chunk keys and the NIXL agent's stats), {"cmd": "stats"},
{"cmd": "exit"}.
"""

import json
import os
import sys
import traceback


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = json.loads(sys.argv[1])

    import pathlib

    import torch

    import engines
    import hsstore.vllm

    hs = hsstore.vllm.HiddenStates(layers=spec["layers"], nixl=spec["nixl"],
                                   worker_init="hsstore.vllm.testing:install_cpu_kv_connector")
    lmcache = engines.lmcache_config(remote_url=f"redis://127.0.0.1:{spec['redis_port']}",
                                     remote_serde="naive",
                                     lookup_timeout_ms=spec["lookup_timeout_ms"])

    def reply(obj) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    def counters():
        return {k: v for k, v in hs.stats()[0].items() if isinstance(v, int)}

    # The context manager is never left: LMCache 0.5.6's RedisConnector.close() deadlocks on its
    # own event loop (LMCache#4489), so "exit" ends the process with os._exit instead.
    context = engines.engine(pathlib.Path(spec["model"]), hs, lmcache=lmcache,
                             max_num_batched_tokens=spec["step_tokens"])
    llm = context.__enter__()
    engine_id = llm.llm_engine.vllm_config.kv_transfer_config.engine_id
    reply({"ready": True, "pid": os.getpid(), "nixl": hs.stats()[0].get("nixl")})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "generate":
                before = counters()
                out = engines.generate(llm, [cmd["prompt"]],
                                       skip_prefix_cache=cmd.get("skip_prefix_cache", False))[0]
                after = counters()
                states = hs.take(out)
                torch.save({label: t.clone() for label, t in states.items()}, cmd["save"])
                keys = engines.rpc(llm, engines.worker_chunk_keys, cmd["prompt"])
                reply({"num_cached_tokens": out.num_cached_tokens,
                       "output": list(out.outputs[0].token_ids),
                       "delta": {k: after.get(k, 0) - before.get(k, 0) for k in after},
                       "keys": [key.to_string() for key in keys],
                       "nixl": hs.stats()[0].get("nixl")})
            elif cmd["cmd"] == "stats":
                stats = hs.stats()[0]
                reply({"counters": counters(), "nixl": stats.get("nixl"), "engine_id": engine_id})
            elif cmd["cmd"] == "exit":
                reply({"bye": True})
                os._exit(0)
            else:
                reply({"error": f"unknown command {cmd['cmd']!r}"})
        except Exception as e:  # reported to the test, which fails with it
            reply({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})


if __name__ == "__main__":
    main()
