"""The soak: a real ``vllm serve`` with hsstore under load and faults, checked for wrong hidden
states, a stalled engine and memory growth (issue 34; docs/reliability.md, "The soak").

    scripts/vllm_venv --python bench/soak.py [--minutes 3] [--concurrency 8] [--report FILE]

What runs (soak_server.py starts the server):
  * ``vllm serve`` (vLLM CPU, the test Llama, LMCache in-process + ``hsstore.vllm``): a small
    hidden-state pool (pressure all the time), a Redis tier on a real local ``redis-server``,
    ``hsstore.output_dir`` (how a serving client gets hidden states: one file per request id).
  * A load generator over the OpenAI-compatible HTTP API, ``--concurrency`` clients: prompts from
    a few shared prefixes of different lengths plus random suffixes, and unique prompts, so hits,
    partial hits, misses and evictions all happen.
  * Faults, in turn, each several times: the Redis server killed (SIGKILL) and restarted empty;
    every hidden state dropped (vLLM's ``POST /reset_prefix_cache?reset_external=true``); an
    eviction storm (a burst of long unique prompts); and clients that disconnect mid-request.
  * ``--pd``: prefill/decode. A second ``vllm serve``, the producer, computes each prompt first
    (the client acts as the router) and serves its hidden states over NIXL; the server under
    test is the decode engine: its KV comes from LMCache's Redis remote backend, the hidden
    states its pool lacks are pulled from the producer the request names in its
    kv_transfer_params. The faults add the producer killed (SIGKILL of its process group) and
    restarted on the same ports; while it is down, requests go to the decode engine alone.

What is checked:
  * every answered request's file: whole prompt, both layers, finite, the metadata's counts; the
    rows of each shared prefix's chunks identical in every request (a digest per chunk);
  * 1 request in ``--sample-every`` (and every prefix) against an offline recompute of the same
    prompt with the same prefill step boundaries, bit for bit (soak_reference.py: a process of its
    own, after the load);
  * the server answers every request but the disconnected ones; it exits 0 on SIGTERM, its log has
    no traceback and no nanobind leak; every output file is accounted for;
  * host RSS of the server's processes and the pool's bytes, sampled every ``--sample-s``: after
    the warm-up (the first ``--warmup`` of the run, and at least ``--warmup-requests`` answered)
    RSS grows by at most ``--rss-bound-mib``.

Prefill steps: ``--max-num-seqs 1`` by default, so that every prefill step starts on a chunk
boundary whatever the load (vLLM CPU's attention rounds differently when a step starts elsewhere:
python/tests_vllm/conftest.py). The clients are concurrent; the engine runs one prompt's step at
a time. ``--engine-seqs N`` batches N prompts per step: the check then holds rows to 1e-4 of their
row's largest value instead of bit for bit, and says how many were bit-exact.

Writes ``--report`` (JSON: requests, hits, misses by cause, faults, mismatches, memory, the
timeline) and exits 1 when anything failed; bench/soak_plot.py draws the timeline.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import pathlib
import platform
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
from typing import Any, Dict, List, Optional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python" / "tests_vllm"))
sys.path.insert(0, str(HERE))

import soak_server  # noqa: E402
from soak_reference import ReferenceChecker, relative_difference  # noqa: E402

CHUNK = soak_server.CHUNK
LAYERS = soak_server.LAYERS
PREFIX_LENGTHS = (256, 768, 1280, 2048)  # the shared prefixes: 1, 3, 5 and 8 chunks
SUFFIX_MAX = 400
UNIQUE_LENGTHS = (300, 1500)
STORM_PROMPTS, STORM_LENGTHS = 16, (1500, 2500)
FILE_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0
TOLERANCE = 1e-4  # --engine-seqs > 1: vLLM CPU's attention rounds by step start (1e-6 seen)
REFERENCE_TIMEOUT_S = 900.0  # the recompute of what is still queued when the load ends


class Tally:
    """Counters and lists shared by the threads, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Dict[str, int] = {}
        self.failures: List[str] = []
        self.samples: List[Dict[str, Any]] = []
        self.prefix_digests: Dict[tuple, str] = {}  # (prefix, chunk, label): first seen
        self.prefix_rows: Dict[tuple, Any] = {}  # and its rows (the difference, when not equal)
        self.completed_at: List[float] = []
        self.restored_at: List[tuple] = []  # (time, rows restored > 0)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def fail(self, message: str) -> None:
        with self.lock:
            self.failures.append(message)
        print(f"soak: FAILURE: {message}", flush=True)


def digest(tensor: Any) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()[:24]


class Load:
    """The clients: draw a prompt, send it, check the answer and the file."""

    def __init__(self, args: argparse.Namespace, server: Any, out_dir: pathlib.Path,
                 samples_dir: pathlib.Path, tally: Tally) -> None:
        self.args = args
        self.server = server
        self.out_dir = out_dir
        self.samples_dir = samples_dir
        self.tally = tally
        rng = random.Random(args.seed)
        self.prefixes = [[rng.randrange(3, 1000) for _ in range(n)] for n in PREFIX_LENGTHS]
        self.next_id = 0
        self.id_lock = threading.Lock()
        self.stop = threading.Event()
        self.pending_disconnects: List[tuple] = []  # (request id, prompt): files may come
        self.producer: Optional[soak_server.Producer] = None  # --pd

    def new_id(self) -> int:
        with self.id_lock:
            self.next_id += 1
            return self.next_id

    def draw(self, rng: random.Random) -> tuple:
        """(kind, prefix index or None, prompt)."""
        roll = rng.random()
        if roll < self.args.unique_share:
            n = rng.randrange(*UNIQUE_LENGTHS)
            return "unique", None, [rng.randrange(3, 1000) for _ in range(n)]
        index = rng.randrange(len(self.prefixes))
        suffix = [rng.randrange(3, 1000) for _ in range(rng.randrange(1, SUFFIX_MAX))]
        return "shared", index, self.prefixes[index] + suffix

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            kind, index, prompt = self.draw(rng)
            disconnect = rng.random() < self.args.disconnect_share
            self.send(kind, index, prompt, disconnect)

    def send(self, kind: str, index: Optional[int], prompt: List[int], disconnect: bool) -> None:
        number = self.new_id()
        request_id = f"soak-{number}"
        self.tally.add("sent")
        started = time.monotonic()
        kv_transfer_params = self.prefill(request_id, prompt) if self.producer else None
        try:
            answer = soak_server.complete(self.server.base, prompt, request_id, max_tokens=2,
                                          timeout=(rng_disconnect_s(number) if disconnect
                                                   else REQUEST_TIMEOUT_S),
                                          kv_transfer_params=kv_transfer_params)
        except (socket.timeout, TimeoutError, urllib.error.URLError) as error:
            if disconnect and "timed out" in str(error):
                self.tally.add("disconnected")  # the client hung up; vLLM aborts the request
                with self.tally.lock:
                    self.pending_disconnects.append((f"cmpl-{request_id}-0", prompt, index))
                return
            self.tally.add("request_errors")
            self.tally.fail(f"{request_id} ({kind}, {len(prompt)} tokens): {error!r}")
            return
        if disconnect:
            self.tally.add("disconnect_too_late")  # answered before the client hung up
        if answer.get("usage", {}).get("prompt_tokens") != len(prompt):
            self.tally.fail(f"{request_id}: usage {answer.get('usage')} for {len(prompt)} tokens")
        with self.tally.lock:
            self.tally.completed_at.append(time.monotonic())
        self.tally.add(f"completed_{kind}")
        self.tally.add("latency_ms", int((time.monotonic() - started) * 1000))
        self.check_file(f"cmpl-{request_id}-0", prompt, index, number, wait=True)

    def keep_failed(self, path: pathlib.Path, engine_id: str, problems: List[str]) -> None:
        """A file that failed a check is kept (work dir, failed/) for a post-mortem."""
        kept = self.samples_dir.parent / "failed" / path.name
        kept.parent.mkdir(exist_ok=True)
        path.replace(kept)
        self.tally.fail(f"{engine_id} (kept: {kept}): " + "; ".join(problems))

    def prefill(self, request_id: str, prompt: List[int]) -> Optional[Dict[str, Any]]:
        """P/D: the producer computes the prompt first, as a router sends it to a prefill host,
        and the decode request names that producer in its kv_transfer_params. A producer that is
        down (killed, restarting) answers nothing: the request goes to the decode engine alone,
        which pulls what it can and computes the rest."""
        try:
            soak_server.complete(self.producer.base, prompt, f"{request_id}-prefill",
                                 max_tokens=1, timeout=REQUEST_TIMEOUT_S)
        except (OSError, http.client.HTTPException):  # refused, reset, timed out
            self.tally.add("prefill_failed")
            return None
        self.tally.add("prefilled")
        return {"hsstore.producer": self.producer.address}

    def check_file(self, engine_id: str, prompt: List[int], index: Optional[int], number: int,
                   *, wait: bool) -> None:
        from safetensors import safe_open

        path = self.out_dir / f"{engine_id}.safetensors"
        deadline = time.monotonic() + FILE_TIMEOUT_S
        while not path.exists():
            if not wait or time.monotonic() > deadline:
                if wait:
                    self.tally.fail(f"{engine_id}: no hidden-state file after {FILE_TIMEOUT_S} s")
                return
            time.sleep(0.05)
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            states = {int(k): f.get_tensor(k) for k in f.keys()}
        self.tally.add("files_checked")
        restored = int(meta.get("rows_restored", "-1"))
        problems = []
        if meta.get("prompt_tokens") != str(len(prompt)) or not 0 <= restored <= len(prompt):
            problems.append(f"metadata {meta}")
        if sorted(states) != sorted(LAYERS):
            problems.append(f"labels {sorted(states)}")
        for label, rows in states.items():
            if tuple(rows.shape) != (len(prompt), soak_server.HIDDEN):
                problems.append(f"layer {label} shape {tuple(rows.shape)}")
            elif not bool(rows.isfinite().all()) or float(rows.abs().mean()) < 0.05:
                problems.append(f"layer {label}: non-finite or near-zero rows")
        if problems:
            self.keep_failed(path, engine_id, problems)
            return
        with self.tally.lock:
            self.tally.restored_at.append((time.monotonic(), restored > 0))
        if index is not None:  # the shared prefix's chunks: the same rows in every request
            full = len(self.prefixes[index]) // CHUNK
            self.tally.add("hit_full" if restored >= full * CHUNK
                           else "hit_partial" if restored > 0 else "hit_none")
            exact = self.args.engine_seqs == 1
            for chunk in range(full):
                for label in LAYERS:
                    rows = states[label][chunk * CHUNK:(chunk + 1) * CHUNK]
                    # Bit for bit with one prompt per step; else within TOLERANCE of the first.
                    key = (index, chunk, label)
                    with self.tally.lock:
                        seen_digest = self.tally.prefix_digests.setdefault(key, digest(rows))
                        seen = self.tally.prefix_rows.setdefault(key, rows.clone())
                    worst = relative_difference(rows, seen)
                    if (seen_digest != digest(rows)) if exact else worst > TOLERANCE:
                        problems.append(f"prefix {index} chunk {chunk} layer {label} differs "
                                        f"from an earlier request's (largest difference "
                                        f"{worst:.3g} of its row's largest value; restored rows: "
                                        f"{restored})")
            if problems:
                self.keep_failed(path, engine_id, problems)
                return
        else:
            self.tally.add("unique_restored_rows" if restored else "unique_cold")
        if number % self.args.sample_every == 0:
            kept = self.samples_dir / path.name
            path.replace(kept)
            sample = {"id": engine_id, "prompt": prompt, "path": str(kept), "restored": restored}
            with self.tally.lock:
                self.tally.samples.append(sample)
        else:
            path.unlink()


def rng_disconnect_s(number: int) -> float:
    """How long a disconnecting client waits: mostly while queued, sometimes mid-prefill."""
    return 0.05 + (number % 7) * 0.1


class Faults:
    """Redis killed and restarted, every hidden state dropped, an eviction storm: in turn."""

    KINDS = ("redis_restart", "reset", "storm")
    PD_KINDS = KINDS + ("producer_restart",)

    def __init__(self, args: argparse.Namespace, server: Any, redis: Any, load: Load,
                 tally: Tally, sampler: "Sampler") -> None:
        self.args, self.server, self.redis, self.load = args, server, redis, load
        self.tally, self.sampler = tally, sampler
        self.events: List[Dict[str, Any]] = []

    def run(self, deadline: float, started: float) -> None:
        turn = 0
        while not self.load.stop.wait(self.args.fault_every_s):
            if time.monotonic() > deadline - self.args.fault_every_s / 2:
                return
            kinds = self.PD_KINDS if self.load.producer else self.KINDS
            kind = kinds[turn % len(kinds)]
            turn += 1
            before = self.sampler.counters()
            event: Dict[str, Any] = {"kind": kind, "t": round(time.monotonic() - started, 1)}
            try:
                getattr(self, kind)(event)
            except Exception as error:  # noqa: BLE001 (a fault that could not be made fails)
                self.tally.fail(f"fault {kind} at {event['t']} s: {error!r}")
                return
            self.tally.add(f"fault_{kind}")
            event["counters_before"] = before
            self.events.append(event)
            print(f"soak: fault {kind} at {event['t']} s: {event.get('detail', '')}", flush=True)

    def redis_restart(self, event: Dict[str, Any]) -> None:
        self.redis.restart(down_s=self.args.redis_down_s)
        event["detail"] = f"killed, down {self.args.redis_down_s} s, restarted empty"

    def reset(self, event: Dict[str, Any]) -> None:
        answer = soak_server.post(self.server.base, "/reset_prefix_cache?reset_external=true")
        event["detail"] = f"reset_prefix_cache answered {answer}"

    def producer_restart(self, event: Dict[str, Any]) -> None:
        started = time.monotonic()
        self.load.producer.restart(down_s=self.args.producer_down_s)
        event["detail"] = (f"producer killed (SIGKILL), down {self.args.producer_down_s} s, "
                           f"serving again after {time.monotonic() - started:.1f} s")

    def storm(self, event: Dict[str, Any]) -> None:
        rng = random.Random(len(self.events))
        prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(*STORM_LENGTHS))]
                   for _ in range(STORM_PROMPTS)]
        threads = [threading.Thread(target=self.load.send, args=("unique", None, p, False))
                   for p in prompts]
        for thread in threads:
            thread.start()
        event["detail"] = f"{STORM_PROMPTS} unique prompts of {STORM_LENGTHS} tokens at once"
        event["threads"] = threads


class Sampler:
    """Every few seconds: RSS of the server's processes, hsstore's /metrics, requests done."""

    def __init__(self, server: Any, tally: Tally, every_s: float,
                 producer: Optional[soak_server.Producer]) -> None:
        self.server, self.tally, self.every_s, self.producer = server, tally, every_s, producer
        self.timeline: List[Dict[str, Any]] = []
        self.stop = threading.Event()
        self._last: Dict[str, float] = {}

    def counters(self) -> Dict[str, float]:
        return dict(self._last)

    def sample(self, started: float) -> None:
        try:
            metrics = soak_server.metrics(self.server.base)
        except OSError as error:
            self.tally.fail(f"/metrics did not answer: {error!r}")
            return
        self._last = metrics
        now = time.monotonic()
        with self.tally.lock:
            done = len(self.tally.completed_at)
            recent = [hit for t, hit in self.tally.restored_at if t > now - 10]
        rss = soak_server.rss_bytes(self.server.process.pid)
        producer = self.producer.server if self.producer else None
        producer_rss = (soak_server.rss_bytes(producer.process.pid)["total"]
                        if producer is not None and producer.process.poll() is None else 0)
        self.timeline.append({
            "t": round(now - started, 1), "completed": done,
            "rss_mib": round(rss["total"] / 2**20, 1),
            "rss_api_mib": round(rss["api"] / 2**20, 1),
            "rss_engine_mib": round(rss["children"] / 2**20, 1),
            "rss_producer_mib": round(producer_rss / 2**20, 1),
            "pool_bytes": metrics.get("store_bytes_held", 0),
            "pool_capacity": metrics.get("store_pool_capacity_bytes", 0),
            "hit_rate_10s": round(sum(recent) / len(recent), 3) if recent else None,
            "metrics": metrics})

    def run(self, started: float) -> None:
        while not self.stop.wait(self.every_s):
            self.sample(started)


def compare_with_reference(checker: ReferenceChecker, load: Load, tally: Tally,
                           exact: bool) -> Dict[str, Any]:
    """Each sampled file, and each shared prefix's chunk digests, against the offline recompute
    (soak_reference.py: a fresh engine, prefill steps of one chunk, no prefix reuse), which has
    run beside the load; waits for what is still queued."""
    import torch

    out = {"samples": len(tally.samples), "bit_exact": 0, "within_tolerance": 0,
           "max_relative_difference": 0.0}
    prefix_reply, replies, error = checker.finish(timeout=REFERENCE_TIMEOUT_S)
    if error:
        tally.fail(error)
    for index, reference in enumerate(prefix_reply.get("prefixes", [])):
        if reference["reused"]:
            tally.fail(f"prefix {index}: the recompute reused {reference['reused']} tokens")
        rows_by_label = torch.load(reference["path"])
        for chunk in range(len(load.prefixes[index]) // CHUNK):
            for label in LAYERS:
                key = (index, chunk, label)
                rows = rows_by_label[label][chunk * CHUNK:(chunk + 1) * CHUNK]
                if key not in tally.prefix_digests:
                    continue
                if (tally.prefix_digests[key] != digest(rows)) if exact else (
                        relative_difference(tally.prefix_rows[key], rows) > TOLERANCE):
                    tally.fail(f"prefix {index} chunk {chunk} layer {label}: served rows "
                               "differ from the recompute")
    samples = {sample["id"]: sample for sample in tally.samples}
    for reply in replies:
        sample = samples[reply["id"]]
        if reply["reused_tokens"] or reply["reused_rows"]:
            tally.fail(f"{sample['id']}: the recompute reused a prefix "
                       f"({reply['reused_tokens']} tokens, {reply['reused_rows']} rows)")
        out["max_relative_difference"] = max(out["max_relative_difference"], reply["worst"])
        if reply["same"]:
            out["bit_exact"] += 1
        elif not exact and reply["worst"] <= TOLERANCE:
            out["within_tolerance"] += 1
        else:
            tally.fail(f"{sample['id']} ({len(sample['prompt'])} tokens, "
                       f"{sample['restored']} restored): differs from the recompute "
                       f"(largest difference {reply['worst']:.3g} of its row's largest value)")
    return out


def memory_summary(timeline: List[Dict[str, Any]], duration: float, warmup: float,
                   warmup_requests: int, bound_mib: float, tally: Tally) -> Dict[str, Any]:
    """RSS growth after the warm-up: the later of a share of the run and a number of requests
    answered (the server's RSS rises with the requests it has served, about 0.8 MiB each for
    the first several hundred here, whatever the time they take: docs/reliability.md)."""
    warm = [s for s in timeline
            if s["t"] >= warmup * duration and s["completed"] >= warmup_requests]
    out: Dict[str, Any] = {"rss_bound_mib": bound_mib, "warmup_requests": warmup_requests}
    if len(warm) < 3:
        done = timeline[-1]["completed"] if timeline else 0
        tally.fail(f"{len(warm)} memory samples after the warm-up ({warmup:.0%} of the run and "
                   f"{warmup_requests} requests; {done} answered): too few to judge")
        return out
    rss = [s["rss_mib"] for s in warm]
    head = statistics.median(rss[: max(1, len(rss) // 4)])
    tail = statistics.median(rss[-max(1, len(rss) // 4):])
    out.update(rss_first_mib=timeline[0]["rss_mib"], rss_after_warmup_mib=head,
               rss_end_mib=tail, rss_max_mib=max(rss), rss_growth_mib=round(tail - head, 1),
               pool_bytes_max=max(s["pool_bytes"] for s in timeline),
               pool_capacity_bytes=max(s["pool_capacity"] for s in timeline))
    if tail - head > bound_mib:
        tally.fail(f"RSS grew {tail - head:.1f} MiB after the warm-up (bound {bound_mib} MiB)")
    if out["pool_bytes_max"] > out["pool_capacity_bytes"]:
        tally.fail("the pool held more bytes than its capacity")
    return out


#: The options: flag, type, default, what it sets.
OPTIONS = (
    ("--minutes", float, 3.0, "how long the load runs"),
    ("--concurrency", int, 8, "clients sending at once"),
    ("--engine-seqs", int, 1, "prompts per engine step (>1: rows held to TOLERANCE)"),
    ("--sample-every", int, 10, "one request in this many is checked against a recompute"),
    ("--sample-s", float, 2.0, "seconds between memory and /metrics samples"),
    ("--fault-every-s", float, 20.0, "seconds between faults (they come in turn)"),
    ("--redis-down-s", float, 3.0, "how long a killed Redis stays down"),
    ("--pd", bool, False, "P/D: a producer engine prefills each prompt first, the server pulls "
     "its hidden states over NIXL (KV through Redis); the faults add its kill and restart"),
    ("--producer-down-s", float, 3.0, "--pd: how long a killed producer stays down"),
    ("--unique-share", float, 0.15, "share of prompts with no shared prefix"),
    ("--disconnect-share", float, 0.05, "share of clients that hang up early"),
    ("--warmup", float, 0.4, "share of the run before memory growth counts"),
    ("--warmup-requests", int, 800, "requests answered before memory growth counts"),
    ("--rss-bound-mib", float, 64.0, "RSS growth allowed after the warm-up"),
    ("--seed", int, 34, "prompts and client choices"),
    ("--report", pathlib.Path, HERE / "soak_report.json", "the JSON report"),
    ("--workdir", pathlib.Path, None, "model, files and logs (default: a new temporary dir)"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, kind, default, help_text in OPTIONS:
        if kind is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=default, help=help_text)
    args = parser.parse_args()
    if args.concurrency < 1 or args.engine_seqs < 1 or args.sample_every < 1:
        parser.error("--concurrency, --engine-seqs and --sample-every must be >= 1")
    return args


def main() -> int:
    args = parse_args()
    tally = Tally()
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="hsstore-soak-"))
    out_dir, samples_dir = work / "states", work / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)
    model_dir = soak_server.write_model(work / "model")
    duration = args.minutes * 60
    print(f"soak: {args.minutes} min, {args.concurrency} clients, work dir {work}", flush=True)
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(soak_server.RedisServer(work / "redis"))
        producer = (stack.enter_context(soak_server.Producer(
            model_dir, redis.url, work, engine_seqs=args.engine_seqs)) if args.pd else None)
        server = stack.enter_context(soak_server.serve(
            model_dir, out_dir, redis.url, work / "serve.log", engine_seqs=args.engine_seqs,
            producer=producer.address if producer else None))
        load = Load(args, server, out_dir, samples_dir, tally)
        load.producer = producer
        sampler = Sampler(server, tally, args.sample_s, producer)
        faults = Faults(args, server, redis, load, tally, sampler)
        started = time.monotonic()
        deadline = started + duration
        sampler.sample(started)
        threads = [threading.Thread(target=load.client, args=(args.seed * 1000 + i,))
                   for i in range(args.concurrency)]
        threads.append(threading.Thread(target=sampler.run, args=(started,)))
        fault_thread = threading.Thread(target=faults.run, args=(deadline, started))
        for thread in threads + [fault_thread]:
            thread.start()
        while time.monotonic() < deadline and server.process.poll() is None:
            time.sleep(1)
        if server.process.poll() is not None:
            tally.fail(f"the server exited during the run ({server.process.returncode})")
        load.stop.set()
        fault_thread.join()
        for thread in threads[:-1] + [t for e in faults.events for t in e.pop("threads", [])]:
            thread.join(timeout=REQUEST_TIMEOUT_S)
        elapsed = time.monotonic() - started
        # Files of disconnected requests that got as far as their prompt's end are checked too.
        for engine_id, prompt, index in load.pending_disconnects:
            load.check_file(engine_id, prompt, index, 1, wait=False)
        sampler.stop.set()
        threads[-1].join()
        sampler.sample(started)
    log = server.log()
    server_report = soak_server.check_log(log, server.exit_code, tally)
    if producer is not None:  # the last producer: stopped with SIGTERM like the server
        server_report["producer"] = soak_server.check_log(
            producer.server.log(), producer.server.exit_code, tally, name="producer",
            writer=False) | {"starts": producer.starts}
    leftovers = sorted(p.name for p in out_dir.iterdir()) if out_dir.exists() else []
    known = {f"{engine_id}.safetensors" for engine_id, _, _ in load.pending_disconnects}
    stray = [name for name in leftovers if name not in known]
    if stray:
        tally.fail(f"{len(stray)} files nobody asked for or half-written: {stray[:5]}")
    # After the load, not beside it: the reference engine's OpenMP threads beside the server's
    # (one per core each, spinning at barriers) cut the server's throughput several times over.
    print(f"soak: checking {len(tally.samples)} sampled requests against a recompute", flush=True)
    checker = ReferenceChecker(model_dir, work, load.prefixes,
                               env=soak_server.reference_env(args.pd))
    for sample in tally.samples:
        checker.submit(sample)
    recompute = compare_with_reference(checker, load, tally, exact=args.engine_seqs == 1)
    memory = memory_summary(sampler.timeline, elapsed, args.warmup, args.warmup_requests,
                            args.rss_bound_mib, tally)
    final = sampler.timeline[-1]["metrics"] if sampler.timeline else {}
    completed = sum(v for k, v in tally.counts.items() if k.startswith("completed_"))
    report = {
        "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.processor() or platform.machine()}, {soak_server.cpu_model()}",
        "config": {k: (str(v) if isinstance(v, pathlib.Path) else v)
                   for k, v in vars(args).items()} | soak_server.describe(args.pd),
        "seconds": round(elapsed, 1),
        "requests": {"sent": tally.counts.get("sent", 0), "completed": completed,
                     "per_second": round(completed / elapsed, 2),
                     **{k: v for k, v in sorted(tally.counts.items()) if not k.startswith("fault")}},
        "faults": {k[6:]: v for k, v in tally.counts.items() if k.startswith("fault_")},
        "fault_log": faults.events,
        "hsstore": final,
        "misses_by_cause": soak_server.misses_by_cause(final),
        "recompute_check": recompute,
        "memory": memory,
        "server": server_report,
        "failures": tally.failures,
        "mismatches": sum(1 for f in tally.failures if "differ" in f),
        "timeline": [{k: v for k, v in s.items() if k != "metrics"} for s in sampler.timeline],
        "passed": not tally.failures,
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("seconds", "requests", "faults", "misses_by_cause",
                                             "recompute_check", "memory", "server", "mismatches",
                                             "passed")}, indent=1))
    print(f"soak: report {args.report}; {'PASSED' if report['passed'] else 'FAILED'}"
          + "".join(f"\n  {f}" for f in tally.failures[:20]), flush=True)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
