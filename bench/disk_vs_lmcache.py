#!/usr/bin/env python3
"""hsstore's local disk tier against LMCache 0.5.6's own LocalDiskBackend on the same bytes in
the same run (issue 32), beside a raw pwrite/preadv reference.

    PYTHONPATH=build/python /var/cache/hsstore/vllm-venv/bin/python bench/disk_vs_lmcache.py \
        [--tokens 16384] [--hidden 4096] [--rounds 4] [--reps 3] [--dir DIR] [--json out.json]

Workload: tokens x hidden float32 rows in chunks of 256, i.e. tokens/256 values of 256*hidden*4
bytes (64 values of 4 MiB, 256 MiB, by default). Figures, on every side:
  spill      write every value and wait until every file landed. hsstore: store_hidden_states +
             flush() on a fresh store; LMCache: batched_submit_put_task of filled MemoryObjs, then
             wait for its on_complete_callback of every key. Raw: pwrite, 4 MiB blocks, no fsync.
  cold read  drop every file's pages (fdatasync + POSIX_FADV_DONTNEED), read everything back.
             hsstore: a fresh store on the directory (its constructor, which re-indexes the
             directory, timed apart as "open"), retrieve_hidden_states_into a preallocated tensor;
             LMCache: get_blocking of every key, and batched_get_blocking. Raw: preadv, 4 MiB.
Sides as a user configures them: hsstore's disk-tier defaults, LMCache's defaults (buffered I/O)
and LMCache with extra_config={"use_odirect": True}. Each round uses fresh directories (hsstore
first in even rounds, last in odd ones) and takes the median of --reps per figure; the table gives
the median and [min, max] over rounds of the per-round LMCache s / hsstore s (> 1: hsstore faster)
and raw s / side s. Reads are checked bit-exact, and hsstore's stats must count every value
written and read by the disk tier, or the bench fails. Files go in a fresh directory under --dir
(default /var/tmp), removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")  # read when lmcache makes its loggers

import torch

import hsstore
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from lmcache.v1.token_database import ChunkedTokenDatabase as LMCacheTokenDatabase

CHUNK = 256
BLOCK = 4 << 20  # dd's bs=4M, as bench/wl_tiers.cpp
GIB = 2**30
STALL_S = 30.0  # an LMCache write that raises never calls back: give up after this long idle
SIDES = ["hsstore", "lmcache", "lmcache O_DIRECT"]
RAW_OF = {"spill": "write", "cold read": "read", "cold read batched": "read"}
_libc = ctypes.CDLL(None, use_errno=True)


class Mismatch(RuntimeError):
    """Other bytes than stored, or the disk not used: the bench fails."""


def sync_fs(path: str) -> None:
    """syncfs under `path`: no earlier rep's writeback runs beside the timed one."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    failed = _libc.syncfs(fd) != 0
    os.close(fd)
    if failed:
        os.sync()


def drop_cache(path: str) -> None:
    """Writes back and drops the page cache of `path` or of every file under it."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.fdatasync(fd)  # dirty pages are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def fresh_dir(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Workload:
    def __init__(self, tokens: int, hidden: int):
        self.tokens, self.hidden = list(range(1, tokens + 1)), hidden
        self.rows = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0))
        self.chunks, self.nbytes = tokens // CHUNK, self.rows.numel() * 4
        self.disk_gib = max(1.0, 4 * self.nbytes / GIB)  # every rep's files fit: no eviction

    def chunk(self, i: int) -> torch.Tensor:
        return self.rows[i * CHUNK:(i + 1) * CHUNK]


def raw_round(w: Workload, base: str, reps: int) -> Dict[str, float]:
    path, src = os.path.join(base, "raw.bin"), memoryview(w.rows.numpy()).cast("B")
    dst = memoryview(bytearray(w.nbytes))  # zero-filled: mapped before the timed reads

    def io(flags: int, call: Callable[[int, memoryview, int], int], buf: memoryview) -> None:
        fd, at = os.open(path, flags, 0o644), 0
        while at < w.nbytes:
            done = call(fd, buf[at:min(at + BLOCK, w.nbytes)], at)
            if done <= 0:
                raise Mismatch("raw I/O: short file")
            at += done
        os.close(fd)

    writes, reads = [], []
    for _ in range(reps):
        if os.path.exists(path):
            os.unlink(path)
        sync_fs(base)
        writes.append(timed(lambda: io(os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.pwrite, src)))
    for _ in range(reps):
        drop_cache(path)
        reads.append(timed(lambda: io(os.O_RDONLY, lambda f, b, a: os.preadv(f, [b], a), dst)))
    if not torch.equal(torch.frombuffer(dst, dtype=torch.float32), w.rows.view(-1)):
        raise Mismatch("raw read returned other bytes")
    os.unlink(path)
    return {"write": statistics.median(writes), "read": statistics.median(reads)}


class HsstoreSide:
    def __init__(self, w: Workload):
        self.w, self.info = w, {}
        self.db = hsstore.ChunkedTokenDatabase(hsstore.Config({"chunk_size": CHUNK}))

    def open(self, disk: str):
        # A user's config: the chunk, a pool that holds the prefix, the disk and its budget.
        return hsstore.HiddenStateStore(hsstore.Config({
            "chunk_size": CHUNK, "enable_hidden_state_cache": True,
            "max_hidden_state_cpu_size": (self.w.nbytes + (64 << 20)) / GIB,
            "local_disk": disk, "max_local_disk_size": self.w.disk_gib}), self.db)

    @staticmethod
    def disk_tier(store) -> dict:
        return next(t for t in store.stats()["tiers"] if t["name"] == "disk")

    def round(self, base: str, reps: int) -> Dict[str, float]:
        w, disk = self.w, os.path.join(base, "hsstore-side")
        spills, opens, reads = [], [], []
        for _ in range(reps):  # each rep writes into a fresh directory from a fresh store
            store = self.open(fresh_dir(disk))
            sync_fs(disk)
            spills.append(timed(lambda: (store.store_hidden_states(w.tokens, w.rows),
                                         store.flush())))
            tier = self.disk_tier(store)
            if tier["writes_done"] != w.chunks or tier["dropped_writes"] or tier["errors"]:
                raise Mismatch(f"hsstore spill wrote {tier['writes_done']} of {w.chunks} "
                               f"values ({tier['dropped_writes']} dropped, {tier['errors']} errors)")
            store.close()
        out = torch.zeros_like(w.rows)  # preallocated, as LMCache reads into its allocator's
        for _ in range(reps):
            drop_cache(disk)
            start = time.perf_counter()
            reader = self.open(disk)  # empty pool: every chunk comes from the disk tier
            opens.append(time.perf_counter() - start)
            start = time.perf_counter()
            got = reader.retrieve_hidden_states_into(w.tokens, out)
            reads.append(time.perf_counter() - start)
            tier = self.disk_tier(reader)
            self.info["read_mode"] = tier["read_mode"]
            if got != len(w.tokens) or tier["hits"] != w.chunks or not torch.equal(out, w.rows):
                raise Mismatch(f"hsstore cold read: {got} rows, {tier['hits']} disk hits of "
                               f"{w.chunks}, same values: {torch.equal(out, w.rows)}")
            out.zero_()  # a later read that fills nothing cannot pass the check
            reader.close()
        shutil.rmtree(disk)
        return {"spill": statistics.median(spills), "cold read": statistics.median(reads),
                "open": statistics.median(opens)}


class LMCacheSide:
    def __init__(self, w: Workload):
        self.w, self.info = w, {}
        # The backend's writes are jobs on an asyncio loop in a thread, as in LMCache's engine.
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cpu_gib = (2.2 * w.nbytes + (64 << 20)) / GIB  # the values and one read-back
        metadata = LMCacheMetadata(model_name="bench", world_size=1, local_world_size=1,
                                   worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                                   kv_shape=(1, 2, CHUNK, 1, w.hidden))
        config = self.config(None, None)
        self.cpu = LocalCPUBackend(config, metadata, dst_device="cpu")  # the allocator
        db = LMCacheTokenDatabase(config, metadata)
        self.keys = [k for *_, k in db.process_tokens(tokens=w.tokens)]
        self.values = []
        for i in range(w.chunks):
            obj = self.cpu.allocate(torch.Size([CHUNK, w.hidden]), torch.float32)
            obj.tensor.copy_(w.chunk(i))
            self.values.append(obj)

    def config(self, disk: Optional[str], extra: Optional[dict]) -> LMCacheEngineConfig:
        return LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=self.cpu_gib, local_disk=disk,
            max_local_disk_size=self.w.disk_gib if disk else 0, remote_url=None,
            save_unfull_chunk=False, extra_config=extra)

    def spill(self, backend: LocalDiskBackend) -> float:
        landed, cond = [], threading.Condition()

        def on_written(key):  # on a writer thread, once the file is closed and indexed
            with cond:
                landed.append(key)
                cond.notify()

        start = time.perf_counter()
        backend.batched_submit_put_task(self.keys, self.values, on_complete_callback=on_written)
        with cond:
            while len(landed) < len(self.keys):
                if not cond.wait(timeout=STALL_S):
                    raise RuntimeError(f"LMCache wrote {len(landed)} of {len(self.keys)} values, "
                                       f"none in the last {STALL_S:.0f} s (a write raised?)")
        seconds = time.perf_counter() - start
        if not all(backend.contains(k) for k in self.keys):
            raise Mismatch("LMCache spill: a key is not on disk after its callback")
        return seconds

    def read(self, backend: LocalDiskBackend, batched: bool) -> float:
        objs: List = []
        seconds = timed(lambda: objs.extend(
            backend.batched_get_blocking(self.keys) if batched
            else [backend.get_blocking(k) for k in self.keys]))
        try:
            for i, obj in enumerate(objs):
                if obj is None or not torch.equal(obj.tensor, self.w.chunk(i)):
                    raise Mismatch(f"LMCache {'batched ' if batched else ''}read of chunk {i}: "
                                   f"{'missing' if obj is None else 'other values'}")
        finally:
            for obj in objs:
                if obj is not None:
                    obj.tensor.zero_()  # the allocator hands this memory out again: a later
                    obj.ref_count_down()  # read that fills nothing cannot pass the check
        return seconds

    def round(self, base: str, reps: int, odirect: bool) -> Dict[str, float]:
        disk = os.path.join(base, "lmcache-odirect" if odirect else "lmcache-side")
        config = self.config(disk, {"use_odirect": True} if odirect else None)
        spills, backend = [], None
        try:
            for _ in range(reps):  # each rep writes into a fresh directory from a fresh backend
                if backend is not None:
                    backend.close()
                fresh_dir(disk)
                backend = LocalDiskBackend(config, self.loop, self.cpu, dst_device="cpu")
                # LMCache uses O_DIRECT only when asked and only for block-aligned sizes.
                self.info["O_DIRECT" if odirect else "default"] = {
                    "use_odirect": backend.use_odirect,
                    "block_aligned": self.values[0].get_physical_size() % backend.os_disk_bs == 0}
                sync_fs(disk)
                spills.append(self.spill(backend))
            # LMCache's index lives in the backend (no directory scan at start): the reads go
            # through the backend that wrote the files.
            figures = {"spill": statistics.median(spills)}
            for batched, name in ((False, "cold read"), (True, "cold read batched")):
                times = []
                for _ in range(reps):
                    drop_cache(disk)
                    times.append(self.read(backend, batched))
                figures[name] = statistics.median(times)
            return figures
        finally:
            if backend is not None:
                backend.close()
            shutil.rmtree(disk, ignore_errors=True)

    def close(self) -> None:
        for obj in self.values:
            obj.ref_count_down()  # held since allocate()
        self.cpu.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def spread(values: List[float]) -> str:
    return (f"{statistics.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}]"
            if values else "-")


def summarize(rounds: List[Dict[str, Dict[str, float]]], nbytes: int) -> List[dict]:
    rows = []
    for fig in ("spill", "cold read", "cold read batched", "open"):
        for side in (["raw"] if fig in ("spill", "cold read") else []) + SIDES:
            key = RAW_OF[fig] if side == "raw" else fig
            per = [r for r in rounds if key in r.get(side, {})]
            if not per:
                continue
            hs_fig = "cold read" if fig == "cold read batched" else fig
            vs_hs = [r[side][key] / r["hsstore"][hs_fig] for r in per
                     if side.startswith("lmcache") and hs_fig in r.get("hsstore", {})]
            vs_raw = ([r["raw"][RAW_OF[fig]] / r[side][key] for r in per]
                      if side != "raw" and fig in RAW_OF else [])
            secs = [r[side][key] for r in per]
            med = statistics.median(secs)
            rows.append({"figure": fig, "side": side, "seconds": secs, "median_s": med,
                         "gbps": nbytes / med / 1e9 if fig != "open" else None,
                         "lmcache_over_hsstore": vs_hs, "side_over_raw": vs_raw})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("tokens", 16384), ("hidden", 4096), ("rounds", 4), ("reps", 3)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dir", default="/var/tmp", help="parent of the bench's fresh directory")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.tokens % CHUNK or args.tokens <= 0:
        ap.error(f"--tokens must be a positive multiple of {CHUNK}")
    w = Workload(args.tokens, args.hidden)
    base = tempfile.mkdtemp(prefix="hss-disk-vs-lmcache-", dir=args.dir)
    hs, lm = HsstoreSide(w), LMCacheSide(w)
    failures: Dict[str, str] = {}
    rounds: List[Dict[str, Dict[str, float]]] = []
    print(f"disk_vs_lmcache: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
          f", lmcache 0.5.6; {args.tokens} x {args.hidden} f32 = {w.chunks} values of "
          f"{CHUNK * args.hidden * 4 >> 10} KiB ({w.nbytes / 2**20:.0f} MiB), {args.rounds} rounds"
          f" x {args.reps} reps, under {base}", flush=True)
    runs = {"hsstore": lambda d: hs.round(d, args.reps),
            "lmcache": lambda d: lm.round(d, args.reps, odirect=False),
            "lmcache O_DIRECT": lambda d: lm.round(d, args.reps, odirect=True)}
    try:
        for rnd in range(args.rounds):
            rdir = fresh_dir(os.path.join(base, f"round{rnd}"))
            got = {"raw": raw_round(w, rdir, args.reps)}
            for side in (SIDES if rnd % 2 == 0 else SIDES[::-1]):
                if side in failures:
                    continue
                try:
                    got[side] = runs[side](rdir)
                except Exception as e:  # noqa: BLE001 - the O_DIRECT variant may not work
                    if side != "lmcache O_DIRECT" or isinstance(e, Mismatch):
                        raise
                    failures[side] = f"{type(e).__name__}: {e}"
                    print(f"  {side} failed: {failures[side]}", flush=True)
            rounds.append(got)
            shutil.rmtree(rdir)
            print(f"  round {rnd + 1}: " + ", ".join(
                f"{side} {fig} {got[side][fig] / got['hsstore'][fig]:.2f}x"
                for side in SIDES[1:] if side in got for fig in ("spill", "cold read")), flush=True)
    finally:
        lm.close()
        shutil.rmtree(base, ignore_errors=True)
    rows = summarize(rounds, w.nbytes)
    print(f"{'figure':18s} {'side':17s} {'median':>9s} {'GB/s':>6s}  "
          f"{'LMCache s/hsstore s':22s}  raw s/side s")
    for r in rows:
        gbps = f"{r['gbps']:6.2f}" if r["gbps"] is not None else "     -"
        print(f"{r['figure']:18s} {r['side']:17s} {r['median_s'] * 1e3:7.1f}ms {gbps}  "
              f"{spread(r['lmcache_over_hsstore']):22s}  {spread(r['side_over_raw'])}")
    print(f"hsstore disk tier reads: {hs.info.get('read_mode')}; LMCache: {lm.info}"
          + (f"; failed: {failures}" if failures else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "tokens": args.tokens, "hidden": args.hidden,
                       "bytes": w.nbytes, "cpus": os.cpu_count(), "hsstore": hs.info,
                       "lmcache": lm.info, "failures": failures, "rounds": rounds,
                       "figures": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
