"""The soak's server side (bench/soak.py): the test model, a restartable redis-server, the
``vllm serve`` configuration, and the readings of its processes and log."""

from __future__ import annotations

import contextlib
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import time
from typing import Any, Dict, Iterator, List, Optional

import engines
from conftest import CPU_KV, STEP_TOKENS
from lmcache_server import free_ports
from serving import complete, metrics, post, vllm_serve

__all__ = ["CHUNK", "HIDDEN", "LAYERS", "Producer", "RedisServer", "check_log", "complete", "cpu_model",
           "describe", "metrics", "misses_by_cause", "post", "rss_bytes", "serve", "write_model"]

CHUNK = STEP_TOKENS  # LMCache's chunk: every prefill step starts on a chunk boundary
HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 1]
# Small pools, so that pressure never stops: a (chunk, layer) entry is 256 KiB, a chunk's KV
# 2 MiB. 16 chunks' hidden states (of the 17 the shared prefixes span) and 64 chunks' KV.
HS_POOL_GB = 8 / 1024
KV_POOL_GB = 128 / 1024
REDIS_TIMEOUT_MS = 500


def write_model(directory: pathlib.Path) -> pathlib.Path:
    return engines.write_llama(directory)


def describe(pd: bool) -> Dict[str, Any]:
    out = {"model": engines.TINY, "layers": LAYERS, "chunk": CHUNK,
           "hidden_state_pool_gb": HS_POOL_GB, "kv_pool_gb": KV_POOL_GB}
    if pd:
        out.update(pd={"kv": "LMCache's Redis remote backend", "hidden_states": "NIXL (UCX, tcp)",
                       "pull_timeout_ms": PD_PULL_TIMEOUT_MS,
                       "lookup_timeout_ms": PD_LOOKUP_TIMEOUT_MS,
                       "producer_hidden_state_pool_gb": PRODUCER_HS_POOL_GB,
                       "worker_cpus": pd_cpu_sets() or "vLLM's auto binding (one CPU)"})
    else:
        out.update(hidden_state_tier="Redis", redis_timeout_ms=REDIS_TIMEOUT_MS)
    return out


class RedisServer:
    """A throw-away redis-server on one loopback port for the whole run (no persistence):
    restart() kills it (SIGKILL) and starts an empty one on the same port."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.binary = shutil.which("redis-server")
        assert self.binary, "redis-server is missing (scripts/bootstrap installs it)"
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: Any = None
        self.restarts = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.accepts():
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def accepts(self) -> bool:
        import socket

        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                    timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
        return False

    def restart(self, down_s: float) -> None:
        self.proc.kill()
        self.proc.wait()
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    def __enter__(self) -> "RedisServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# P/D (--pd): the KV crosses through LMCache's Redis remote backend, the hidden states over NIXL
# from the producer. A pull is bounded below LMCache's lookup timeout (the lookup waits for it).
PD_PULL_TIMEOUT_MS = 3000
PD_LOOKUP_TIMEOUT_MS = 20000
PRODUCER_HS_POOL_GB = 32 / 1024  # the producer keeps more: a pull usually finds the prompt
PRODUCER_STARTUP_TIMEOUT_S = 900.0
# NIXL's UCX backend over loopback TCP (the machine has no RDMA device).
NIXL_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "NIXL_LOG_LEVEL": "WARN"}


def pd_cpu_sets() -> Dict[str, str]:
    """The CPUs of each P/D engine: the CPUs this process may run on, split in two halves of the
    same length, the decode engine's first. Each engine's processes run there only (taskset) and
    its worker's OpenMP threads are bound there (``VLLM_CPU_OMP_THREADS_BIND``). Empty (vLLM's
    "auto", no taskset) on one CPU.

    Why: a vLLM CPU worker's main thread, and every thread it starts (LMCache's, hsstore's), is
    bound to one CPU (libgomp, preloaded, binds it to the first CPU of GOMP_CPU_AFFINITY, which
    vLLM sets); and every process that imports torch walks its main thread over each CPU of its
    affinity mask (MKL counting cores: sched_setaffinity to each CPU in turn, in
    at::init_num_threads). A restarted producer whose mask includes the decode worker's CPU steps
    onto it and waited there, runnable, for minutes beside the decode worker's threads (watched:
    /proc, strace, gdb): the producer never came back (docs/reliability.md, "The soak"). Disjoint
    CPU sets are what a P/D deployment has anyway (its engines on separate hosts or sockets). The
    halves have the same length: the OpenMP thread count sets the order of a matmul's sums, and
    rows are compared bit for bit."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {}
    half = len(cpus) // 2
    return {"decode": ",".join(map(str, cpus[:half])),
            "producer": ",".join(map(str, cpus[half:2 * half]))}


def _bind_env(role: str) -> Dict[str, str]:
    cpus = pd_cpu_sets().get(role)
    return {"VLLM_CPU_OMP_THREADS_BIND": cpus} if cpus else {}


def _cpus(role: str) -> Optional[str]:
    return pd_cpu_sets().get(role)


def reference_env(pd: bool) -> Dict[str, str]:
    """The recompute's engine (soak_reference.py) computes with as many OpenMP threads as the
    engines it checks: with P/D, the decode engine's CPUs (it runs after the load)."""
    cpus = pd_cpu_sets().get("decode") if pd else None
    if not cpus:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": cpus, "OMP_NUM_THREADS": str(len(cpus.split(",")))}


def _extra(out_dir: Any, lmcache: Dict[str, Any], **hsstore_keys: Any) -> Dict[str, Any]:
    extra = {"hsstore.layers": LAYERS, "hsstore.keep": False, "hsstore.worker_init": CPU_KV,
             **{f"hsstore.{k}": v for k, v in hsstore_keys.items()},
             **{f"lmcache.{k}": v for k, v in lmcache.items()}}
    if out_dir is not None:
        extra["hsstore.output_dir"] = str(out_dir)
    return extra


def _pd_lmcache(redis_url: str, hs_gb: float) -> Dict[str, Any]:
    return engines.lmcache_config(kv_gb=KV_POOL_GB, hs_gb=hs_gb, remote_url=redis_url,
                                  remote_serde="naive", lookup_timeout_ms=PD_LOOKUP_TIMEOUT_MS)


@contextlib.contextmanager
def serve(model_dir: pathlib.Path, out_dir: pathlib.Path, redis_url: str,
          log_path: pathlib.Path, *, engine_seqs: int,
          producer: Optional[str] = None) -> Iterator[Any]:
    """The server the load is checked against. Alone: hidden states in a small pool with the
    Redis tier behind it. With `producer` (P/D, the decode engine): KV from LMCache's Redis remote
    backend, hidden states pulled over NIXL from `producer`, no hidden-state tier."""
    if producer is None:
        lmcache = engines.lmcache_config(kv_gb=KV_POOL_GB, hs_gb=HS_POOL_GB, extra_config={
            "hidden_state_remote_url": redis_url,
            "hidden_state_remote_timeout_ms": REDIS_TIMEOUT_MS})
        extra = _extra(out_dir, lmcache)
    else:
        extra = _extra(out_dir, _pd_lmcache(redis_url, HS_POOL_GB),
                       nixl={"producer": producer, "timeout_ms": PD_PULL_TIMEOUT_MS,
                             "trusted_network": True})  # loopback, no MAC key
    with vllm_serve(model_dir, extra, log_path, step_tokens=STEP_TOKENS,
                    args=["--max-num-seqs", str(engine_seqs)],
                    env={"VLLM_SERVER_DEV_MODE": "1", "HSS_LOG_LEVEL": "info",
                         **({**NIXL_ENV, **_bind_env("decode")} if producer else {})},
                    cpus=_cpus("decode") if producer else None) as server:
        yield server


class Producer:
    """The P/D producer (prefill engine): a ``vllm serve`` that computes each prompt, writes its KV
    to Redis through LMCache and serves its hidden states over NIXL on a fixed port. kill() is
    SIGKILL of its whole process group (API server and engine core); start() brings up a new one
    on the same HTTP and NIXL ports, as a restarted prefill host would."""

    def __init__(self, model_dir: pathlib.Path, redis_url: str, log_dir: pathlib.Path, *,
                 engine_seqs: int) -> None:
        self.model_dir, self.redis_url, self.log_dir = model_dir, redis_url, log_dir
        self.engine_seqs = engine_seqs
        self.http_port, nixl_port = free_ports(2)
        self.address = f"127.0.0.1:{nixl_port}"
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.starts = 0
        self.server: Any = None
        self.logs: List[pathlib.Path] = []
        self._stack: Optional[contextlib.ExitStack] = None

    def start(self) -> None:
        extra = _extra(None, _pd_lmcache(self.redis_url, PRODUCER_HS_POOL_GB),
                       nixl={"listen": self.address})
        log = self.log_dir / f"producer-{self.starts}.log"
        self.logs.append(log)
        self._stack = contextlib.ExitStack()
        self.server = self._stack.enter_context(vllm_serve(
            self.model_dir, extra, log, step_tokens=STEP_TOKENS, port=self.http_port,
            args=["--max-num-seqs", str(self.engine_seqs)],  # the rows it serves: as the decode's
            env={"HSS_LOG_LEVEL": "info", **NIXL_ENV, **_bind_env("producer")},
            cpus=_cpus("producer"),
            # A restart competes with the running decode server (and, in a loaded machine, with
            # everything else): minutes on two busy cores.
            startup_timeout_s=PRODUCER_STARTUP_TIMEOUT_S))
        self.starts += 1

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.process.pid, signal.SIGKILL)
        self.server.process.wait()
        self._stack.close()
        self._stack = None

    def restart(self, down_s: float) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()

    def __enter__(self) -> "Producer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()  # SIGTERM, as the decode server gets


def rss_bytes(pid: int) -> Dict[str, int]:
    """Resident bytes of the server ("api") and of every process under it (the engine core,
    vLLM's helpers), and their "total"."""
    import psutil

    out = {"api": 0, "children": 0}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        out["api"] = root.memory_info().rss
        for process in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                out["children"] += process.memory_info().rss
    out["total"] = out["api"] + out["children"]
    return out


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


# Tracebacks vLLM 0.32 logs whatever the connector: at start, its chat template warm-up needs a
# tokenizer (a warning); at a clean shutdown, the API server's output handler reports the engine
# core it stopped as dead (EngineDeadError, also with no KV connector at all).
_STARTUP_TRACEBACK = "Chat template warmup failed"
_SHUTDOWN_STARTED = "[shutdown] API server: shutdown triggered"


def _expected_traceback(lines: list, i: int, shutdown_at: int) -> bool:
    if any(_STARTUP_TRACEBACK in lines[j] for j in range(max(0, i - 2), i)):
        return True
    return 0 <= shutdown_at < i and any("EngineDeadError" in lines[j]
                                        for j in range(i, min(len(lines), i + 12)))


def check_log(log: str, exit_code: Any, tally: Any, *, name: str = "server",
              writer: bool = True) -> Dict[str, Any]:
    """A server's exit and log: SIGTERM exits 0, no traceback but vLLM's expected ones, no
    nanobind leak report, hsstore's shutdown lines (the file writer's where it has one)."""
    lines = log.splitlines()
    shutdown_at = next((i for i, line in enumerate(lines) if _SHUTDOWN_STARTED in line), -1)
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line
                  and not _expected_traceback(lines, i, shutdown_at)]
    leaks = [line for line in lines if "nanobind: leaked" in line]
    shutdown = [line[line.index("hsstore"):] for line in lines
                if "hsstore.vllm: shutdown:" in line or "hsstore.output_dir: closed:" in line]
    errors = [line for line in lines if re.search(r"\bERROR\b", line)]
    out = {"exit_code": exit_code, "tracebacks": len(tracebacks), "nanobind_leaks": len(leaks),
           "error_lines": len(errors), "shutdown_lines": shutdown,
           "recompute_lines": sum("recomputing from token" in line for line in lines),
           # vLLM 0.32's LMCacheConnectorV1 has no shutdown: LMCache's threads keep the worker
           # until vLLM kills it, after hsstore's shutdown has flushed (docs/reliability.md).
           "worker_killed_by_vllm": any("workers still running" in line for line in lines)}
    if exit_code != 0:
        tally.fail(f"the {name} exited {exit_code} on SIGTERM (0 expected)")
    for i in tracebacks[:3]:
        tally.fail(f"traceback in the {name} log:\n" + "\n".join(lines[i:i + 25]))
    if leaks:
        tally.fail(f"{len(leaks)} nanobind leak lines at the {name}'s exit: {leaks[:3]}")
    if writer and not any("hsstore.output_dir: closed:" in line for line in shutdown):
        tally.fail(f"no 'hsstore.output_dir: closed' line: the {name}'s writer was not closed "
                   "on SIGTERM")
    if not any("hsstore.vllm: shutdown:" in line for line in shutdown):
        tally.fail(f"no 'hsstore.vllm: shutdown' line: the {name}'s store was not flushed on "
                   "SIGTERM")
    return out


def misses_by_cause(final: Dict[str, float]) -> Dict[str, float]:
    """What the counters say about every prompt row not restored, by cause (hsstore's /metrics
    at the end of the run)."""
    names = {
        "kv_hit_capped_hidden_states_missing": "lookup_hits_capped_total",
        "kv_hit_tokens_capped": "lookup_tokens_capped_total",
        "rows_missing_at_step_recomputed": "recomputes_total",
        "tokens_recomputed": "tokens_recomputed_total",
        "evicted_pool_pressure": "store_hs_evictions_total",
        "dropped_kv_evicted": "store_coupled_evictions_total",
        "dropped_by_reset": "reset_keys_dropped_total",
        "remote_misses": "remote_misses_total",
        "remote_errors": "remote_errors_total",
        "remote_dropped_writes": "remote_dropped_writes_total",
        "store_miss_tokens": "store_miss_tokens_total",
        "pulls_missed": "pulls_missed_total",
    }
    return {cause: final.get(name, 0.0) for cause, name in names.items()}
