"""The soak's recompute check (bench/soak.py) in a process of its own, running beside the load.

The reference is an offline engine (a fresh in-process vLLM engine, prefill steps of one chunk, no
prefix reuse, the same model and layers as the server): each sampled request's prompt is computed
again and its served rows are compared with the recomputed ones. It runs after the load: beside
it, the two engines' OpenMP threads (one per core each, spinning at barriers) cut the server's
throughput several times over (a 3-minute soak answered 300-350 requests instead of ~2000).

    ReferenceChecker(model_dir, workdir, prefixes)          starts the worker; its engine starts
    .submit(sample)                                          queues one sampled request's file
    .finish(timeout) -> (prefix references, results)         waits for the queue to drain

Worker protocol: JSON lines on stdin ({"model": DIR, "prefixes": [...], "out": DIR} first, then
{"id", "prompt", "path"} per sample, then {"done": true}); a JSON reply line to the first line and
to each sample, on a private copy of stdout (vLLM prints to fd 1, which goes to the worker's log).
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

HERE = pathlib.Path(__file__).resolve().parent


def relative_difference(rows: Any, reference: Any) -> float:
    """The largest difference of a row, over that row's largest magnitude in `reference`."""
    return float(((rows - reference).abs().amax(dim=1) / reference.abs().amax(dim=1)).max())


class ReferenceChecker:
    """The soak's side: one worker process, samples sent as they come, replies read by a thread."""

    def __init__(self, model_dir: pathlib.Path, workdir: pathlib.Path,
                 prefixes: List[List[int]], env: Optional[Dict[str, str]] = None) -> None:
        self.out = workdir / "reference"
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "reference.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(pathlib.Path(__file__).resolve())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=dict(os.environ, **(env or {})))
        self.replies: List[Dict[str, Any]] = []
        self.submitted = 0
        self._changed = threading.Condition()
        # submit() never waits on the pipe (a client thread calls it): a thread of ours writes.
        self._outbox: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._write, daemon=True)]
        for thread in self._threads:
            thread.start()
        self._outbox.put({"model": str(model_dir), "prefixes": prefixes, "out": str(self.out)})

    def _write(self) -> None:
        while True:
            message = self._outbox.get()
            try:
                self.proc.stdin.write(json.dumps(message) + "\n")
                self.proc.stdin.flush()
            except OSError:
                return  # the worker died: finish() reports it
            if message.get("done"):
                return

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.replies.append(json.loads(line))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def submit(self, sample: Dict[str, Any]) -> None:
        self.submitted += 1
        self._outbox.put({k: sample[k] for k in ("id", "prompt", "path")})

    def finish(self, timeout: float) -> Tuple[Dict[str, Any], List[Dict[str, Any]], str]:
        """Waits until every submitted sample has its reply: (the prefix reply, the sample
        replies, an error or ""). The worker then exits."""
        self._outbox.put({"done": True})
        with self._changed:
            self._changed.wait_for(lambda: len(self.replies) >= self.submitted + 1
                                   or self.proc.poll() is not None, timeout=timeout)
            replies = list(self.replies)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for thread in self._threads:
            thread.join(timeout=10)
        self._log.close()
        error = ""
        if len(replies) < self.submitted + 1:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            error = (f"the recompute worker answered {len(replies)} of {self.submitted + 1} "
                     f"(exit {self.proc.returncode}):\n{tail}")
        prefix = replies[0] if replies else {}
        return prefix, replies[1:], error


def worker() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, str(HERE.parent / "python" / "tests_vllm"))
    sys.path.insert(0, str(HERE))

    def reply(obj: Dict[str, Any]) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    start = json.loads(sys.stdin.readline())
    import engines
    import hsstore.vllm
    import soak_server
    import torch
    from conftest import CPU_KV
    from safetensors import safe_open

    layers = soak_server.LAYERS
    hs = hsstore.vllm.HiddenStates(layers=layers, store="hsstore", worker_init=CPU_KV)
    out = pathlib.Path(start["out"])
    with engines.engine(pathlib.Path(start["model"]), hs,
                        lmcache=engines.lmcache_config(),
                        max_num_batched_tokens=soak_server.CHUNK) as llm:
        # Each shared prefix once: its chunks' rows, saved for the soak to compare with the
        # digests (or rows) every served request showed.
        prefixes = []
        for index, prefix in enumerate(start["prefixes"]):
            reference, output, _ = engines.run(llm, hs, prefix, skip_prefix_cache=True)
            path = out / f"prefix-{index}.pt"
            torch.save({label: reference[label].clone() for label in layers}, path)
            prefixes.append({"path": str(path), "reused": output.num_cached_tokens})
        reply({"prefixes": prefixes})
        for line in sys.stdin:
            message = json.loads(line)
            if message.get("done"):
                break
            reference, output, counted = engines.run(llm, hs, message["prompt"],
                                                     skip_prefix_cache=True)
            with safe_open(message["path"], framework="pt") as f:
                served = {int(k): f.get_tensor(k) for k in f.keys()}
            reply({"id": message["id"],
                   "same": all(torch.equal(served[label], reference[label]) for label in layers),
                   "worst": max(relative_difference(served[label], reference[label])
                                for label in layers),
                   "reused_tokens": output.num_cached_tokens,
                   "reused_rows": counted["rows_restored"]})
    replies.close()
    os._exit(0)  # LMCache's threads would keep the process alive


if __name__ == "__main__":
    worker()
