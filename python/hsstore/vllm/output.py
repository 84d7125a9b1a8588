"""Hidden states for a serving client (``vllm serve``): each completed prompt's states written to a
directory, one file per request, named by the request id the client chose.

``hsstore.output_dir`` turns it on. A client of vLLM's OpenAI-compatible server names its request
(the ``X-Request-Id`` header, or ``"request_id"`` in the body); vLLM's engine request id is then
``cmpl-<id>-<prompt index>`` for /v1/completions (``chatcmpl-<id>`` for chat), and the file is
``<output_dir>/<that id, percent-encoded>.safetensors``:

* one float tensor per label, named by the label (``"-1"``, ``"2"``), ``[prompt tokens, hidden]``,
  restored prefix plus computed tail, exactly what ``HiddenStates.take()`` returns offline;
* metadata ``request_id``, ``prompt_tokens``, ``labels`` (comma-separated) and, from a capture,
  ``rows_restored`` (the prompt's first rows that came from the store; the rest were computed);
* written to a temporary name in the same directory and renamed: a reader that sees the file sees
  all of it (a POSIX rename is atomic). The client reads it, then deletes it: hsstore never does.

The file is written by a thread of its own: the engine step only queues the tensors (the capture's
buffers, which it no longer writes). The queue holds at most ``max_pending`` prompts; a prompt
that finds it full is dropped and counted (``files_dropped``), never waited for. ``close()``
writes what is queued before it returns (a clean shutdown loses no completed prompt's file).

Thread safety: submit() and stats() from the worker's step thread; the writer thread only writes
files and bumps counters under the lock.
"""

from __future__ import annotations

import logging
import os
import pathlib
import queue
import threading
import urllib.parse
from typing import Any, Dict, Optional, Tuple

__all__ = ["StateFileWriter", "file_name", "output_options"]

logger = logging.getLogger("hsstore.vllm")

SUFFIX = ".safetensors"
_MAX_NAME = 200  # bytes of a file name, well under NAME_MAX (255) with the suffix
_STOP = object()


def file_name(request_id: str) -> str:
    """The file of a request id: percent-encoded (no "/" can reach the path, "%" itself is
    encoded, so distinct ids give distinct names); ids longer than a file name allows are
    refused (ValueError): a client that wants files names its requests briefly."""
    name = urllib.parse.quote(request_id, safe="-_.")
    if not name or name in (".", "..") or len(name) > _MAX_NAME:
        raise ValueError(f"hsstore.output_dir: request id {request_id!r} cannot name a file "
                         f"(empty, '.', '..' or over {_MAX_NAME} bytes encoded)")
    return name + SUFFIX


class StateFileWriter:
    """Writes completed prompts' hidden states to `directory` (see the module's docstring)."""

    def __init__(self, directory: str, max_pending: int = 256) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self.counters = {"files_written": 0, "files_dropped": 0, "file_write_errors": 0}
        self._thread = threading.Thread(target=self._run, name="hsstore-state-files",
                                        daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, request_id: str, states: Dict[int, Any], prompt_tokens: int,
               rows_restored: Optional[int] = None) -> bool:
        """Queues one prompt's states (not copied: the caller no longer writes them). False
        (counted) if the queue is full or the id cannot name a file."""
        try:
            name = file_name(request_id)
        except ValueError as error:
            logger.warning("%s", error)
            self._count("file_write_errors")
            return False
        if self._closed:
            self._count("files_dropped")
            return False
        try:
            metadata = {"request_id": request_id, "prompt_tokens": str(int(prompt_tokens)),
                        "labels": ",".join(str(label) for label in states)}
            if rows_restored is not None:
                metadata["rows_restored"] = str(int(rows_restored))
            self._queue.put_nowait((name, dict(states), metadata))
        except queue.Full:
            logger.warning("hsstore.output_dir: %d prompts queued, the file of %r is dropped",
                           self._queue.maxsize, request_id)
            self._count("files_dropped")
            return False
        return True

    def stats(self) -> Dict[str, int]:
        with self._lock:
            out = dict(self.counters)
        out["files_pending"] = self._queue.qsize()
        return out

    def close(self) -> None:
        """Writes what is queued, then stops the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        stats = self.stats()
        lost = stats["files_dropped"] + stats["file_write_errors"]
        (logger.warning if lost else logger.info)(
            "hsstore.output_dir: closed: %d files written, %d dropped, %d failed",
            stats["files_written"], stats["files_dropped"], stats["file_write_errors"])

    def _count(self, key: str) -> None:
        with self._lock:
            self.counters[key] += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            name, states, metadata = item
            try:
                self._write(name, states, metadata)
                self._count("files_written")
            except Exception as error:  # a full disk, a removed directory: counted, not fatal
                logger.warning("hsstore.output_dir: writing %s failed: %s", name, error)
                self._count("file_write_errors")

    def _write(self, name: str, states: Dict[int, Any], metadata: Dict[str, str]) -> None:
        from safetensors.torch import save_file

        tensors = {str(label): tensor.detach().contiguous().cpu()
                   for label, tensor in states.items()}
        final = self.directory / name
        partial = self.directory / f".{name}.{os.getpid()}.partial"
        try:
            save_file(tensors, str(partial), metadata=metadata)
            os.replace(partial, final)
        finally:
            if partial.exists():
                partial.unlink()


def output_options(extra: Dict[str, Any]) -> Optional[Tuple[str, int]]:
    """(directory, max_pending) from ``hsstore.output_dir`` / ``hsstore.output_max_pending``
    (None without a directory); ValueError naming the key and the value."""
    directory = extra.get("hsstore.output_dir")
    pending = extra.get("hsstore.output_max_pending", 256)
    if isinstance(pending, bool) or not isinstance(pending, int) or pending < 1:
        raise ValueError(f"hsstore.output_max_pending must be an integer >= 1, got {pending!r}")
    if directory is None:
        return None
    if not isinstance(directory, str) or not directory:
        raise ValueError(f"hsstore.output_dir must be a directory path, got {directory!r}")
    return directory, pending
