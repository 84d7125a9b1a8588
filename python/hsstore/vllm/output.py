"""Hidden states for a serving client (``vllm serve``): each completed prompt's states written to a
directory, one file per request, named by the request id the client chose and its tenant.

``hsstore.output_dir`` turns it on. A client of vLLM's OpenAI-compatible server names its request
(the ``X-Request-Id`` header, or ``"request_id"`` in the body); vLLM's engine request id is then
``cmpl-<id>-<prompt index>`` for /v1/completions (``chatcmpl-<id>`` for chat), and the file is
``<output_dir>/<that id, percent-encoded>.safetensors`` for a request without a ``cache_salt``, and
``<that id, percent-encoded>@<tenant_digest(salt)>.safetensors`` for one with (:func:`file_name`):
two tenants that send the same id get two files, and no id of one can name the other's ("@" is
always percent-encoded in an id).

* one float tensor per label, named by the label (``"-1"``, ``"2"``), ``[prompt tokens, hidden]``,
  restored prefix plus computed tail, exactly what ``HiddenStates.take()`` returns offline;
* metadata ``request_id``, ``prompt_tokens``, ``labels`` (comma-separated) and, from a capture,
  ``rows_restored`` (the prompt's first rows that came from the store; the rest were computed);
* written through a descriptor of a fresh temporary file (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode
  0600, a random name) in the same directory, then linked to its name, which must not exist yet:
  a reader that sees the file sees all of it, and a name already there (the same id twice in one
  tenant, or anything planted) is never replaced: the new file is refused and counted
  (``files_refused``). The client reads the file, then deletes it.

The directory is trusted only if this process's user owns it and others cannot write it
(ValueError naming it otherwise); a missing one is made 0700. Its ``.safetensors`` files are kept
within ``hsstore.output_max_bytes`` (16 GiB): before a write that would pass it, the oldest files
are deleted (``files_evicted``); a file larger than the whole budget is dropped. The budget is
this writer's: engines that share a directory each keep their own.

The file is written by a thread of its own: the engine step only queues the tensors (the capture's
buffers, which it no longer writes, device memory included). The queue holds at most
``max_pending`` prompts and ``max_pending_bytes`` of their tensors (2 GiB); a prompt that finds it
full is dropped and counted (``files_dropped``), never waited for. ``close()`` writes what is
queued before it returns (a clean shutdown loses no completed prompt's file).

Thread safety: submit() and stats() from the worker's step thread; the writer thread only writes
files and bumps counters under the lock.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import logging
import os
import queue
import secrets
import stat
import threading
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from .connector_keys import default_of, option

__all__ = ["StateFileWriter", "file_name", "output_options", "tenant_digest"]

logger = logging.getLogger("hsstore.vllm")

SUFFIX = ".safetensors"
_MAX_NAME = 200  # bytes of an encoded id, well under NAME_MAX (255) with a tenant and the suffix
_TENANT_HEX = 32  # 128 bits of SHA-256
_TENANT_DOMAIN = b"hsstore.output_dir tenant\x00"  # not the store keys' salt digest
DEFAULT_MAX_PENDING = default_of("hsstore.output_max_pending")
DEFAULT_MAX_BYTES = default_of("hsstore.output_max_bytes")
DEFAULT_MAX_PENDING_BYTES = default_of("hsstore.output_max_pending_bytes")
_STOP = object()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# safetensors' dtype names (https://github.com/huggingface/safetensors, the format's header).
_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
           "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
           "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def tenant_digest(salt: str) -> str:
    """The tenant part of a salted request's file name: 32 hex of SHA-256 over a domain tag and
    the salt (a client computes it from its own salt)."""
    return hashlib.sha256(_TENANT_DOMAIN + str(salt).encode()).hexdigest()[:_TENANT_HEX]


def file_name(request_id: str, salt: Optional[str] = None) -> str:
    """The file of a request id in a tenant (`salt`, vLLM's cache_salt; none: no tenant part):
    percent-encoded (no "/" can reach the path, "%" and "@" are encoded, so distinct ids and
    tenants give distinct names); ids longer than a file name allows are refused (ValueError): a
    client that wants files names its requests briefly."""
    name = urllib.parse.quote(request_id, safe="-_.")
    if not name or name in (".", "..") or len(name) > _MAX_NAME:
        raise ValueError(f"hsstore.output_dir: request id {request_id!r} cannot name a file "
                         f"(empty, '.', '..' or over {_MAX_NAME} bytes encoded)")
    if salt:
        name += "@" + tenant_digest(salt)
    return name + SUFFIX


def _open_trusted_dir(directory: str, create: bool) -> int:
    """A descriptor of `directory` (made 0700 with its missing parents if `create`), after the
    checks: a directory, not a symlink, this user's, not writable by others (ValueError)."""
    if create:
        path = "/" if directory.startswith("/") else ""
        for part in directory.split("/"):
            if part in ("", "."):
                continue
            path = os.path.join(path, part) if path else part
            if part == "..":
                continue
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError(f"hsstore.output_dir {directory!r} is a symlink or not a directory: "
                             "refused") from None
        raise
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this process (uid {os.geteuid()})"
    elif st.st_mode & stat.S_IWOTH:
        problem = f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem is not None:
        os.close(fd)
        raise ValueError(f"hsstore.output_dir {directory!r} {problem}: refused (whoever can "
                         "write it can plant or replace the files clients read)")
    return fd


def _host_array(value: Any) -> Tuple[str, List[int], memoryview]:
    """(safetensors dtype, shape, the bytes) of a torch tensor (any device) or a NumPy array."""
    if hasattr(value, "detach"):  # torch
        import torch

        t = value.detach().contiguous().cpu()
        dtype = str(t.dtype).removeprefix("torch.")
        shape = list(t.shape)
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    else:
        import numpy as np

        a = np.ascontiguousarray(value)
        dtype, shape, raw = a.dtype.name, list(a.shape), a.reshape(-1).view(np.uint8)
    if dtype not in _DTYPES:
        raise ValueError(f"hsstore.output_dir: dtype {dtype} has no safetensors name")
    return _DTYPES[dtype], shape, memoryview(raw).cast("B")


def _safetensors(states: Dict[str, Any], metadata: Dict[str, str]) -> List[memoryview]:
    """The pieces of a safetensors file: 8-byte header length, JSON header (padded with spaces
    to 8 bytes), the tensors' bytes in header order."""
    header: Dict[str, Any] = {"__metadata__": metadata}
    pieces: List[memoryview] = []
    offset = 0
    for name, value in states.items():
        dtype, shape, raw = _host_array(value)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        pieces.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [memoryview(len(text).to_bytes(8, "little")), memoryview(text)] + pieces


def _write_all(fd: int, piece: memoryview) -> None:
    while piece:
        piece = piece[os.write(fd, piece):]


def _nbytes(value: Any) -> int:
    if hasattr(value, "element_size"):  # torch
        return int(value.numel()) * int(value.element_size())
    return int(getattr(value, "nbytes", 0))


class StateFileWriter:
    """Writes completed prompts' hidden states to `directory` (see the module's docstring)."""

    def __init__(self, directory: str, max_pending: int = DEFAULT_MAX_PENDING,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        for key, value in (("max_pending", max_pending), ("max_bytes", max_bytes),
                           ("max_pending_bytes", max_pending_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self._dir_fd = _open_trusted_dir(directory, create=True)
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self.counters = {"files_written": 0, "files_dropped": 0, "file_write_errors": 0,
                         "files_refused": 0, "files_evicted": 0}
        self._pending_bytes = 0
        # The directory's files, oldest first (name -> bytes), and their sum: the budget's view,
        # refreshed from the directory whenever a write would pass the budget.
        self._files: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        self._held = 0
        self._rescan()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hsstore-state-files",
                                        daemon=True)
        self._thread.start()

    def submit(self, request_id: str, states: Dict[int, Any], prompt_tokens: int,
               rows_restored: Optional[int] = None, salt: Optional[str] = None) -> bool:
        """Queues one prompt's states (not copied: the caller no longer writes them) under the
        tenant of `salt`. False (counted) if the queue is full (prompts or bytes) or the id cannot
        name a file."""
        try:
            name = file_name(request_id, salt)
        except ValueError as error:
            logger.warning("%s", error)
            self._count("file_write_errors")
            return False
        if self._closed:
            self._count("files_dropped")
            return False
        nbytes = sum(_nbytes(t) for t in states.values())
        with self._lock:
            room = self._pending_bytes + nbytes <= self.max_pending_bytes
            if room:
                self._pending_bytes += nbytes
        if not room:
            logger.warning("hsstore.output_dir: %d bytes queued, the file of %r (%d bytes) is "
                           "dropped", self._pending_bytes, request_id, nbytes)
            self._count("files_dropped")
            return False
        try:
            metadata = {"request_id": request_id, "prompt_tokens": str(int(prompt_tokens)),
                        "labels": ",".join(str(label) for label in states)}
            if rows_restored is not None:
                metadata["rows_restored"] = str(int(rows_restored))
            self._queue.put_nowait((name, dict(states), metadata, nbytes))
        except queue.Full:
            with self._lock:
                self._pending_bytes -= nbytes
            logger.warning("hsstore.output_dir: %d prompts queued, the file of %r is dropped",
                           self._queue.maxsize, request_id)
            self._count("files_dropped")
            return False
        return True

    def stats(self) -> Dict[str, int]:
        with self._lock:
            out = dict(self.counters)
            out["files_pending_bytes"] = self._pending_bytes
        out["files_pending"] = self._queue.qsize()
        return out

    def close(self) -> None:
        """Writes what is queued, then stops the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        os.close(self._dir_fd)
        stats = self.stats()
        lost = stats["files_dropped"] + stats["file_write_errors"] + stats["files_refused"]
        (logger.warning if lost else logger.info)(
            "hsstore.output_dir: closed: %d files written, %d dropped, %d failed, %d refused "
            "(name taken), %d evicted (budget)", stats["files_written"], stats["files_dropped"],
            stats["file_write_errors"], stats["files_refused"], stats["files_evicted"])

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            name, states, metadata, nbytes = item
            item = None
            try:
                self._write(name, states, metadata)
            except Exception as error:  # a full disk, a removed directory: counted, not fatal
                logger.warning("hsstore.output_dir: writing %s failed: %s", name, error)
                self._count("file_write_errors")
            finally:
                del states  # the buffers (device memory) go before the next prompt's write
                with self._lock:
                    self._pending_bytes -= nbytes

    def _directory(self) -> int:
        """The directory's descriptor; opened again (never re-created) if it was removed."""
        if os.fstat(self._dir_fd).st_nlink == 0:
            fd = _open_trusted_dir(self.directory, create=False)
            os.close(self._dir_fd)
            self._dir_fd = fd
            self._rescan()
        return self._dir_fd

    def _rescan(self) -> None:
        """The budget's view from the directory: its regular ``.safetensors`` files by age."""
        found = []
        with os.scandir(self._dir_fd) as entries:
            for entry in entries:
                if not entry.name.endswith(SUFFIX) or entry.name.startswith("."):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((st.st_mtime_ns, entry.name, st.st_size))
        found.sort()
        self._files = collections.OrderedDict((name, size) for _, name, size in found)
        self._held = sum(self._files.values())

    def _make_room(self, size: int) -> None:
        """Deletes the oldest files until `size` more bytes fit the budget (counted)."""
        if self._held + size <= self.max_bytes:
            return
        self._rescan()  # files the clients deleted, or another engine wrote, since
        evicted = 0
        while self._files and self._held + size > self.max_bytes:
            name, bytes_ = self._files.popitem(last=False)
            self._held -= bytes_
            try:
                os.unlink(name, dir_fd=self._dir_fd)
                evicted += 1
            except FileNotFoundError:
                pass
        if evicted:
            logger.warning("hsstore.output_dir: over hsstore.output_max_bytes (%d): the %d oldest "
                           "files deleted", self.max_bytes, evicted)
            self._count("files_evicted", evicted)

    def _write(self, name: str, states: Dict[int, Any], metadata: Dict[str, str]) -> None:
        pieces = _safetensors({str(label): t for label, t in states.items()}, metadata)
        size = sum(len(p) for p in pieces)
        if size > self.max_bytes:
            logger.warning("hsstore.output_dir: %s is %d bytes, over hsstore.output_max_bytes "
                           "(%d): dropped", name, size, self.max_bytes)
            self._count("files_dropped")
            return
        dir_fd = self._directory()
        self._make_room(size)
        partial = f".{secrets.token_hex(16)}.partial"  # nobody can name it in advance
        fd = os.open(partial, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            try:
                for piece in pieces:
                    _write_all(fd, piece)
            finally:
                os.close(fd)
            # link(), not rename(): a name that exists is never replaced (rename would).
            os.link(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            logger.warning("hsstore.output_dir: %s exists already: the new file is refused "
                           "(counted)", name)
            self._count("files_refused")
            return
        finally:
            try:
                os.unlink(partial, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        self._files[name] = size
        self._held += size
        self._count("files_written")


def output_options(extra: Dict[str, Any]) -> Optional[Tuple[str, int, int, int]]:
    """(directory, max_pending, max_bytes, max_pending_bytes) from ``hsstore.output_dir``,
    ``hsstore.output_max_pending``, ``hsstore.output_max_bytes`` and
    ``hsstore.output_max_pending_bytes`` (None without a directory); ValueError naming the key
    and the value."""
    directory = option(extra, "hsstore.output_dir")
    limits = []
    for key in ("hsstore.output_max_pending", "hsstore.output_max_bytes",
                "hsstore.output_max_pending_bytes"):
        value = option(extra, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        limits.append(value)
    if directory is None:
        return None
    if not isinstance(directory, str) or not directory:
        raise ValueError(f"hsstore.output_dir must be a directory path, got {directory!r}")
    return (directory, *limits)
