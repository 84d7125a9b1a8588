"""One engine process of the prefill/decode test (test_vllm_pd_nixl.py): a real vLLM engine (one
process: engine core and worker in it) with hsstore.vllm and LMCache, its KV written to and read
from LMCache's Redis remote backend, its hidden states served or pulled over NIXL. Driven by JSON
lines on stdin, one reply line per command on a private copy of stdout (vLLM and UCX print to
fd 1, which goes to stderr here). Also the driver's side, for the test and bench/vllm_pd_bench.py:
EngineProcess (one such process), Redis (a throw-away redis-server) and pd_engines (both, for a
test's fixture).

    python pd_engine.py '{"model": DIR, "redis_port": P, "nixl": {...}, "layers": [...],
                          "step_tokens": N, "lookup_timeout_ms": MS,
                          "lmcache_extra": {...}}'      (optional: LMCache's extra_config)
    (LMCache's MP mode: "mp": {"mp.host": ..., "mp.port": ...} instead of "redis_port")

Commands: {"cmd": "generate", "prompt": [...], "skip_prefix_cache": bool, "save": PATH,
"kv_transfer_params": {...}} (the request's kv_transfer_params, optional; the
prompt's hidden states go to PATH with torch.save; the reply has the output, num_cached_tokens,
the seconds from generate() to take() returning the whole prompt's rows, the request's counter
deltas, the LMCache chunk keys and the NIXL agent's stats), {"cmd": "stats"},
{"cmd": "exit"}.
"""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
REPLY_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A throw-away redis-server (scripts/bootstrap installs it), no persistence."""

    def __init__(self, directory: pathlib.Path) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing (scripts/bootstrap installs it)"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while self.command("PING") != b"+PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)

    def command(self, *args: str) -> bytes:
        request = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(request.encode())
                return s.recv(4096).strip()
        except OSError:
            return b""

    def has(self, key: str) -> bool:
        return self.command("EXISTS", key) == b":1"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class EngineProcess:
    """A pd_engine.py process: send() a command, get its JSON reply (bounded by a timeout)."""

    def __init__(self, role: str, spec: dict, log: pathlib.Path) -> None:
        env = dict(os.environ)
        env.update(UCX_TLS="tcp,self", UCX_NET_DEVICES="lo", NIXL_LOG_LEVEL="WARN",
                   PYTHONHASHSEED=os.environ.get("PYTHONHASHSEED", "0"))
        env["PYTHONPATH"] = str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
        self.role = role
        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "pd_engine.py"), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log_file, text=True, env=env)

    def read(self, timeout: float = REPLY_TIMEOUT_S) -> dict:
        result = {}
        reader = threading.Thread(target=lambda: result.update(line=self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        tail = self.log.read_text()[-3000:]
        assert "line" in result, f"{self.role}: no reply in {timeout} s\n{tail}"
        assert result["line"], f"{self.role} exited ({self.proc.poll()})\n{tail}"
        reply = json.loads(result["line"])
        assert "error" not in reply, f"{self.role}: {reply['error']}\n{reply.get('trace', '')}"
        return reply

    def send(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def generate(self, prompt, path: pathlib.Path, skip_prefix_cache: bool = False,
                 kv_transfer_params: dict = None) -> dict:
        reply = self.send(cmd="generate", prompt=prompt, save=str(path),
                          skip_prefix_cache=skip_prefix_cache,
                          kv_transfer_params=kv_transfer_params)
        import torch

        reply["states"] = torch.load(path)
        return reply

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGCONT)
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@contextlib.contextmanager
def pd_engines(directory: pathlib.Path, model, *, prefill: list, layers: list, step_tokens: int,
               lookup_timeout_ms: int, pull_timeout_ms: int, lmcache_extra: dict = None,
               mp: dict = None, decode_nixl: dict = None, **spec):
    """A redis-server, the named prefill engines (each serving its hidden states over NIXL on a
    free port) and a decode engine pulling from the first by default. Every process is started
    before any makes its NIXL agent; all are stopped on the way out. Yields a dict: "redis", the
    engines by name ("decode" and the `prefill` names) and "ports" (prefill name -> NIXL port).
    `mp`: LMCache's MP mode instead, the KV in the `lmcache server` of this client config (its
    "mp.*" keys), shared by every engine; no redis-server then ("redis" is None).
    `decode_nixl`: further "hsstore.nixl" keys of the decode engine ("producers": the producers
    a request may name; "trusted_network": true where no MAC key is configured).
    `spec`: further keys of every engine's spec (max_model_len)."""
    redis = Redis(directory) if mp is None else None
    ports = {name: free_port() for name in prefill}
    common = {"model": str(model), "layers": layers, "step_tokens": step_tokens,
              "lookup_timeout_ms": lookup_timeout_ms, **spec}
    if mp is None:
        common["redis_port"] = redis.port
    else:
        common["mp"] = dict(mp)
    if lmcache_extra:
        common["lmcache_extra"] = lmcache_extra
    # Peers authenticate under the MAC key (hsstore.nixl's handshake); engines given none run on a
    # network the test declares trusted (loopback, every process its own).
    keyed = bool(lmcache_extra) and any(k.startswith("hidden_state_mac_key") for k in lmcache_extra)
    trust = {} if keyed else {"trusted_network": True}
    engines = {name: EngineProcess(name, {**common, "nixl": {"listen": f"127.0.0.1:{port}", **trust}},
                                   directory / f"{name}.log")
               for name, port in ports.items()}
    engines["decode"] = EngineProcess(
        "decode", {**common, "nixl": {"producer": f"127.0.0.1:{ports[prefill[0]]}",
                                      "timeout_ms": pull_timeout_ms, **trust,
                                      **(decode_nixl or {})}},
        directory / "decode.log")
    try:
        started = time.monotonic()
        ready = {name: engine.read() for name, engine in engines.items()}
        for name, port in ports.items():
            assert ready[name]["nixl"]["address"] == f"127.0.0.1:{port}", name
        assert ready["decode"]["nixl"]["address"] is None  # the decode side only pulls
        print(f"pd: {len(engines)} engines ready in {time.monotonic() - started:.1f} s")
        yield {"redis": redis, "ports": ports, **engines}
    finally:
        for engine in engines.values():
            engine.close()
        if redis is not None:
            redis.close()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = json.loads(sys.argv[1])

    import torch

    import engines
    import hsstore.vllm

    mp = spec.get("mp")
    if mp is not None:  # LMCache's MP mode: the KV in the shared lmcache server
        import hsstore.vllm.mp_connector  # noqa: F401 (LMCache first, then vLLM's patch)

        hs = hsstore.vllm.HiddenStates(layers=spec["layers"], nixl=spec["nixl"], lmcache="mp")
        lmcache = dict(mp)
    else:
        hs = hsstore.vllm.HiddenStates(layers=spec["layers"], nixl=spec["nixl"],
                                       worker_init="hsstore.vllm.testing:install_cpu_kv_connector")
        lmcache = engines.lmcache_config(remote_url=f"redis://127.0.0.1:{spec['redis_port']}",
                                         remote_serde="naive",
                                         lookup_timeout_ms=spec["lookup_timeout_ms"])
        if spec.get("lmcache_extra"):
            lmcache["extra_config"] = spec["lmcache_extra"]

    def reply(obj) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    def counters():
        return {k: v for k, v in hs.stats()[0].items() if isinstance(v, int)}

    # The context manager is never left: LMCache 0.5.6's RedisConnector.close() deadlocks on its
    # own event loop (LMCache#4489), so "exit" ends the process with os._exit instead.
    context = engines.engine(pathlib.Path(spec["model"]), hs, lmcache=lmcache,
                             max_num_batched_tokens=spec["step_tokens"],
                             max_model_len=spec.get("max_model_len", 4096))
    llm = context.__enter__()
    engine_id = llm.llm_engine.vllm_config.kv_transfer_config.engine_id
    reply({"ready": True, "pid": os.getpid(), "nixl": hs.stats()[0].get("nixl")})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "generate":
                before = counters()
                started = time.perf_counter()
                out = engines.generate(llm, [cmd["prompt"]],
                                       skip_prefix_cache=cmd.get("skip_prefix_cache", False),
                                       kv_transfer_params=cmd.get("kv_transfer_params"))[0]
                states = hs.take(out)
                seconds = time.perf_counter() - started
                after = counters()
                torch.save({label: t.clone() for label, t in states.items()}, cmd["save"])
                keys = ([] if mp is not None  # the server keys the KV
                        else engines.rpc(llm, engines.worker_chunk_keys, cmd["prompt"]))
                reply({"num_cached_tokens": out.num_cached_tokens, "seconds": seconds,
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
