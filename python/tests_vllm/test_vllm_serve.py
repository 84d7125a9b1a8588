"""Hidden states for a serving client (hsstore.vllm.output, ``hsstore.output_dir``): the writer on
its own, then a real ``vllm serve`` (OpenAI-compatible HTTP API, LMCache in-process, the engine
core in its own process) whose client names its requests and reads each prompt's hidden states
from the directory: whole prompts, a cached prefix's rows equal to the request that computed
them, nothing left half-written; two tenants sending one request id each read their own file,
and the same id again in one tenant never replaces the first's. A serving engine connects to no
address a client writes into its kv_transfer_params."""

import json
import time
import urllib.request

import pytest
import torch
from safetensors import safe_open

import engines
from conftest import CPU_KV, STEP_TOKENS
from hsstore.vllm.output import StateFileWriter, file_name, tenant_digest
from lmcache_server import free_ports
from serving import Listener, complete, metrics, post, vllm_serve

HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 1]
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
                              "files_refused": 0, "files_evicted": 0, "files_pending": 0,
                              "files_pending_bytes": 0}
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
                              "files_refused": 0, "files_evicted": 0, "files_pending": 0,
                              "files_pending_bytes": 0}
    assert [p.name for p in directory.iterdir()] == ["b.safetensors"]  # no partial file left


# -- vllm serve ---------------------------------------------------------------------------------


def serve_config(out_dir):
    return {"hsstore.layers": LAYERS, "hsstore.keep": False, "hsstore.output_dir": str(out_dir),
            "hsstore.worker_init": CPU_KV,
            **{f"lmcache.{k}": v for k, v in engines.lmcache_config().items()}}


def wait_for(path):
    deadline = time.monotonic() + FILE_TIMEOUT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.2)
    return read(path)


def wait_for_metrics(base, expected):
    """/metrics once its hsstore series reach `expected` (a worker reports after the step that
    completed the prompt; the front end records it just after answering)."""  # noqa: D401
    deadline = time.monotonic() + FILE_TIMEOUT_S
    while True:
        got = metrics(base)
        if all(got.get(name) == value for name, value in expected.items()):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def test_vllm_serve_client_reads_whole_prompts_hidden_states(tiny_model, tokens, tmp_path):
    out_dir = tmp_path / "states"
    prefix = tokens(768)
    a, b, c = prefix + tokens(100), prefix + tokens(100), prefix + tokens(50)
    with vllm_serve(tiny_model, serve_config(out_dir), tmp_path / "serve.log",
                    step_tokens=STEP_TOKENS,
                    env={"VLLM_SERVER_DEV_MODE": "1", "HSS_LOG_LEVEL": "info"}) as server:
        base = server.base
        models = json.loads(urllib.request.urlopen(f"{base}/v1/models").read())
        complete_a = complete(base, a, "first")
        states_a, meta_a = wait_for(out_dir / "cmpl-first-0.safetensors")
        complete_b = complete(base, b, "second")
        states_b, meta_b = wait_for(out_dir / "cmpl-second-0.safetensors")
        # hsstore's counters on vLLM's /metrics: A computed its 868 rows, B restored 768.
        got = wait_for_metrics(base, {"requests_total": 2, "prompts_completed_total": 2,
                                      "rows_computed_total": 868 + 100,
                                      "rows_restored_total": 768})
        assert got["store_keys_held"] == 3 and got["store_bytes_held"] == 3 * 2 * 256 * HIDDEN * 4
        assert got["lookup_hits_capped_total"] == 0
        # An operator's reset drops every hidden state (the KV stays in LMCache) before the next
        # step: C's KV hit, looked up before, finds its rows gone and is recomputed, not served
        # short.
        assert post(base, "/reset_prefix_cache?reset_external=true") == {"success": True}
        complete(base, c, "third")
        states_c, meta_c = wait_for(out_dir / "cmpl-third-0.safetensors")
        got = wait_for_metrics(base, {"resets_total": 1, "reset_keys_dropped_total": 3,
                                      "prompts_completed_total": 3,
                                      "rows_computed_total": 868 + 100 + 818})
        assert got["rows_restored_total"] == 768 and got["recomputes_total"] == 1
        assert got["tokens_recomputed_total"] == 768
        # The writer's counters are read at a step: A's and B's files were written before C ran
        # (the client read them), C's may be written after its last step.
        assert got["files_written_total"] in (2, 3)
    assert server.exit_code == 0, server.log()[-3000:]
    assert models["data"] and complete_a["usage"]["prompt_tokens"] == len(a)
    assert meta_a == {"request_id": "cmpl-first-0", "prompt_tokens": str(len(a)),
                      "labels": ",".join(map(str, LAYERS)), "rows_restored": "0"}
    assert meta_b["rows_restored"] == "768" and meta_c["rows_restored"] == "0"
    # B's prefix came from LMCache (KV) and hsstore (hidden states): the file still holds the
    # whole prompt, and the prefix rows are the ones A's prefill computed, bit for bit; C's
    # prefix was recomputed after the reset, from the same KV steps: the same rows again.
    assert complete_b["usage"]["prompt_tokens"] == len(b)
    for label in LAYERS:
        assert states_a[label].shape == (len(a), HIDDEN)
        assert states_b[label].shape == (len(b), HIDDEN)
        assert torch.equal(states_b[label][:768], states_a[label][:768])
        assert torch.equal(states_c[label][:768], states_a[label][:768])
        assert not torch.equal(states_b[label][768:], states_a[label][768:])
        assert states_b[label].abs().mean() > 0.1
    assert not [p for p in out_dir.iterdir() if not p.name.endswith(".safetensors")]
    log = server.log()
    assert "LMCache hit tokens: 768" in log  # the KV of B's prefix came from LMCache
    assert "hsstore.vllm: reset: 3 hidden-state keys dropped" in log
    assert "hsstore.output_dir: closed: 3 files written, 0 dropped, 0 failed" in log
    # The shutdown says what happens to the pool's hidden states (no tier keeps them here).
    assert "hsstore.vllm: shutdown: no tier behind the pool" in log


def complete_salted(base, prompt, request_id, salt):
    """/v1/completions as complete() sends it, with vLLM's per-request cache_salt (a tenant)."""
    body = {"model": None, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "request_id": request_id}
    if salt is not None:
        body["cache_salt"] = salt
    return post(base, "/v1/completions", body)


def test_vllm_serve_tenants_sending_one_request_id_each_read_their_own_file(tiny_model, tokens,
                                                                           tmp_path):
    out_dir = tmp_path / "states"
    prompt_a, prompt_b, prompt_again = tokens(300), tokens(200), tokens(100)
    name_a = f"cmpl-same-0@{tenant_digest('tenant-a')}.safetensors"
    name_b = f"cmpl-same-0@{tenant_digest('tenant-b')}.safetensors"
    with vllm_serve(tiny_model, serve_config(out_dir), tmp_path / "serve.log",
                    step_tokens=STEP_TOKENS, env={"HSS_LOG_LEVEL": "info"}) as server:
        base = server.base
        complete_salted(base, prompt_a, "same", "tenant-a")
        states_a, meta_a = wait_for(out_dir / name_a)
        complete_salted(base, prompt_b, "same", "tenant-b")
        states_b, meta_b = wait_for(out_dir / name_b)
        complete_salted(base, prompt_again, "same", None)
        states_none, _ = wait_for(out_dir / "cmpl-same-0.safetensors")
        # Tenant A again under the same id: its first file stays, the new one is refused (the
        # worker logs it; its counters reach /metrics only at a later step).
        complete_salted(base, prompt_again, "same", "tenant-a")
        refused = f"{name_a} exists already: the new file is refused"
        deadline = time.monotonic() + FILE_TIMEOUT_S
        while refused not in server.log():
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.2)
    assert server.exit_code == 0, server.log()[-3000:]
    assert ("hsstore.output_dir: closed: 3 files written, 0 dropped, 0 failed, 1 refused"
            in server.log())
    assert meta_a["prompt_tokens"] == str(len(prompt_a))
    assert meta_b["prompt_tokens"] == str(len(prompt_b))
    for label in LAYERS:
        assert states_a[label].shape == (len(prompt_a), HIDDEN)
        assert states_b[label].shape == (len(prompt_b), HIDDEN)
        assert states_none[label].shape == (len(prompt_again), HIDDEN)
    again_a, _ = read(out_dir / name_a)
    assert all(torch.equal(again_a[label], states_a[label]) for label in LAYERS)
    for path in out_dir.iterdir():
        assert (path.stat().st_mode & 0o777) == 0o600, path
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        [name_a, name_b, "cmpl-same-0.safetensors"])


def test_vllm_serve_connects_to_no_producer_a_client_names(tiny_model, tokens, tmp_path):
    # A serve-only engine (hsstore.nixl "listen", no pull) whose hidden states were dropped while
    # LMCache keeps the KV: each later request's KV hit lacks its hidden states, where a pulling
    # worker would pull. Its client names an address of its own in kv_transfer_params, in every
    # form a producer can be named: the engine connects to none of them, and each response's
    # hidden states are recomputed, equal to the first computation's.
    pytest.importorskip("nixl", reason="the nixl package is not in this venv")
    out_dir = tmp_path / "states"
    attacker = Listener()
    attacker_port = attacker.address.rpartition(":")[2]
    forms = ({"lmcache.hsstore.producer": attacker.address},
             {"hsstore.producer": attacker.address},
             {"remote_host": "127.0.0.1", "hsstore.producer_port": int(attacker_port)})
    prefixes = [tokens(768) for _ in forms]
    config = {**serve_config(out_dir),
              "hsstore.nixl": {"listen": f"127.0.0.1:{free_ports(1)[0]}",
                               "trusted_network": True}}
    try:
        with vllm_serve(tiny_model, config, tmp_path / "serve.log", step_tokens=STEP_TOKENS,
                        env={"VLLM_SERVER_DEV_MODE": "1", "HSS_LOG_LEVEL": "info"}) as server:
            base = server.base
            first = []
            for i, prefix in enumerate(prefixes):
                complete(base, prefix + tokens(10), f"first-{i}")
                first.append(wait_for(out_dir / f"cmpl-first-{i}-0.safetensors")[0])
            # The hidden states go (the KV stays in LMCache); the drop runs at the next step.
            assert post(base, "/reset_prefix_cache?reset_external=true") == {"success": True}
            complete(base, tokens(20), "drop")
            wait_for(out_dir / "cmpl-drop-0.safetensors")
            answers, states = [], []
            for i, (prefix, params) in enumerate(zip(prefixes, forms)):
                prompt = prefix + tokens(50)
                answers.append((len(prompt), complete(base, prompt, f"named-{i}",
                                                      kv_transfer_params=params)))
                states.append(wait_for(out_dir / f"cmpl-named-{i}-0.safetensors")[0])
            got = wait_for_metrics(base, {"prompts_completed_total": 2 * len(forms) + 1,
                                          "resets_total": 1,
                                          "reset_keys_dropped_total": 3 * len(forms)})
        assert server.exit_code == 0, server.log()[-3000:]
        assert attacker.accepted == 0
        assert got.get("pulls_total", 0) == 0 and got.get("pulls_missed_total", 0) == 0
        # Each named request's KV hit was capped at its (dropped) hidden states: recomputed.
        assert got["lookup_hits_capped_total"] == len(forms)
        assert got["lookup_tokens_capped_total"] == 768 * len(forms)
        for (prompt_len, answer), named, computed in zip(answers, states, first):
            assert answer["usage"]["prompt_tokens"] == prompt_len
            assert len(answer["choices"]) == 1
            for label in LAYERS:
                assert named[label].shape == (prompt_len, HIDDEN)
                assert torch.equal(named[label][:768], computed[label][:768])
    finally:
        attacker.close()
