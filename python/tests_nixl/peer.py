"""One process of a NIXL test: a producer or a consumer with its own engine and NIXL agent,
driven by JSON lines on stdin (one reply line on stdout per command). Started by conftest.Peer.

Rows are a function of (seed, layer), so every process can check what it restores bit for bit.
"""

import ctypes
import json
import os
import signal
import sys
import time

import numpy as np

import hsstore
import hsstore.nixl
from hsstore.salt import salted_native_key


def rows_for(seed, layer, n, cols):
    return np.random.default_rng(seed * 1009 + layer + 7).standard_normal((n, cols), dtype=np.float32)


def tokens_for(seed, n):
    return list(np.random.default_rng(seed).integers(0, 50000, size=n))


def prompt_for(engine, cmd):
    """The prompt a command names: its token ids, or with "salt" (a vLLM cache_salt) its chunks
    under salted keys, as hsstore.vllm keys a salted request's hidden states (hsstore.salt)."""
    tokens = tokens_for(cmd["seed"], cmd["n"])
    if not cmd.get("salt"):
        return tokens
    return [(start, end, salted_native_key(key, cmd["salt"]))
            for start, end, key in engine.token_database.process_tokens(tokens)]


def restored(store, prompt, layers, n, cols):
    """The rows the store restores of `prompt` for `layers` (all or nothing), as numpy arrays."""
    outs = [np.zeros((n, cols), dtype=np.float32) for _ in layers]
    rows = store.retrieve_layers_into(prompt, layers, outs)
    return [out[:rows] for out in outs] if rows else None


class KvGaps:
    """KV presence on this side: every chunk but those listed (by chunk hash)."""

    def __init__(self):
        self.gone = set()

    def contains(self, key, search_range=None, pin=False):
        return key.chunk_hash not in self.gone


def main():
    # Replies go to a private copy of stdout; fd 1 becomes stderr, because UCX prints its errors
    # (a refused connect to a killed peer) to stdout and would break the JSON lines.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    config = json.loads(sys.argv[1])
    role = sys.argv[2]
    engine = hsstore.Engine(config)
    store = engine.hidden_state_store
    kv = KvGaps()
    store.bind_storage_manager(kv)
    agent = None
    out = replies

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def wait_go():
        line = sys.stdin.readline()
        assert json.loads(line)["cmd"] == "go", line

    for line in sys.stdin:
        cmd = json.loads(line)
        c = cmd["cmd"]
        try:
            if c == "init":  # every process exists before any agent (NIXL's rule)
                agent = hsstore.nixl.NixlAgent(engine, serve=(role == "producer"))
                reply({"address": agent.address if role == "producer" else None, "pid": os.getpid()})
            elif c == "store":
                prompt = prompt_for(engine, cmd)
                for layer in cmd["layers"]:
                    rows = rows_for(cmd["seed"], layer, cmd["n"], cmd["cols"])
                    if cmd.get("salt"):
                        store.store_chunks(prompt, rows, layer_idx=layer)
                    else:
                        store.store_hidden_states(prompt, rows, layer_idx=layer)
                reply({"stats": store.stats(), "entries": store.num_entries()})
            elif c == "pull":
                tokens = tokens_for(cmd["seed"], cmd["n"])
                for chunk in cmd.get("kv_gone", []):
                    kv.gone.add(engine.token_database.process_tokens(tokens)[chunk][2].chunk_hash)
                hooks = {}
                if cmd.get("pause_after_lease"):
                    def leased():
                        reply({"event": "leased"})
                        wait_go()
                    hooks["leased"] = leased
                if cmd.get("sleep_after_lease"):
                    hooks["leased"] = lambda: time.sleep(cmd["sleep_after_lease"])
                if cmd.get("kill_after_post"):
                    hooks["posted"] = lambda: os.kill(cmd["kill_after_post"], signal.SIGKILL)
                if cmd.get("stop_after_post"):  # the producer hangs with the READ in flight
                    hooks["posted"] = lambda: os.kill(cmd["stop_after_post"], signal.SIGSTOP)
                if cmd.get("corrupt_at") is not None:
                    def corrupt(pull, first, count):
                        # Flips one bit at a byte offset of the reservation (entries in order:
                        # chunk-major, layer-minor) as its batch lands, as a bad link would.
                        at = cmd["corrupt_at"]
                        for index, size in enumerate(pull.entry_bytes()):
                            if at < size:
                                break
                            at -= size
                        if not first <= index < first + count:
                            return
                        local = np.frombuffer(pull.descriptors(index, 1)[0], dtype=np.uint64).reshape(-1, 3)
                        for addr, size, _ in local:
                            if at < int(size):
                                ctypes.c_uint8.from_address(int(addr) + at).value ^= 0x10
                                return
                            at -= int(size)
                    hooks["landed"] = corrupt
                t0 = time.monotonic()
                prompt = prompt_for(engine, cmd)
                result = agent.pull(cmd["address"], prompt, cmd["layers"], timeout=cmd.get("timeout"), _hooks=hooks)
                elapsed = time.monotonic() - t0
                got = restored(store, prompt, cmd["layers"], cmd["n"], cmd["cols"])
                equal = True
                rows_got = 0
                if got:
                    rows_got = got[0].shape[0]
                    for layer, tensor in zip(cmd["layers"], got):
                        want = rows_for(cmd["seed"], layer, cmd["n"], cmd["cols"])
                        equal = equal and np.array_equal(np.asarray(tensor).view(np.uint32), want[:rows_got].view(np.uint32))
                store.check_invariants()
                reply({"result": result.__dict__, "rows": rows_got, "equal": bool(equal),
                       "elapsed": elapsed, "stats": store.stats(), "agent": agent.stats(),
                       "entries": store.num_entries()})
            elif c == "check":  # this store's rows of a prompt against what was stored
                got = restored(store, prompt_for(engine, cmd), cmd["layers"], cmd["n"], cmd["cols"])
                rows_got = got[0].shape[0] if got else 0
                equal = all(np.array_equal(np.asarray(t).view(np.uint32), rows_for(
                    cmd["seed"], layer, cmd["n"], cmd["cols"])[:rows_got].view(np.uint32))
                    for layer, t in zip(cmd["layers"], got or []))
                store.check_invariants()
                reply({"rows": rows_got, "equal": bool(equal), "stats": store.stats(),
                       "agent": agent.stats() if agent else None})
            elif c == "has":
                tokens = tokens_for(cmd["seed"], cmd["n"])
                chunks = engine.token_database.process_tokens(tokens)
                reply({"has": [store.has_chunk(k, cmd["layer"]) for (_s, _e, k) in chunks]})
            elif c == "stats":
                reply({"stats": store.stats(), "agent": agent.stats() if agent else None})
            elif c == "exit":
                if agent:
                    agent.close()
                reply({"bye": True})
                return
            else:
                reply({"error": "unknown command " + c})
        except Exception as e:  # reported to the test, which fails with the message
            import traceback

            reply({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})


if __name__ == "__main__":
    main()
