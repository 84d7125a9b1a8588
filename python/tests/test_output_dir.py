"""hsstore.output_dir against its clients and its directory (hsstore.vllm.output; docs/design.md,
"Threat model"): one file per request id and tenant, a name that exists never replaced, private
temporary files written through their descriptor, the directory's owner and mode checked, its
bytes bounded, and the queue bounded in bytes. NumPy arrays stand in for the capture's tensors (the
writer takes either; python/tests_vllm/test_vllm_serve.py runs it with torch under vllm serve)."""

import json
import os
import stat
import threading
import time

import numpy as np
import pytest

from hsstore.vllm.output import StateFileWriter, file_name, output_options, tenant_digest

WAIT_S = 60.0


def read(path):
    """(tensors by label, metadata) of a safetensors file, parsed here (8-byte header length,
    JSON header, data)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32"
        begin, end = info["data_offsets"]
        out[int(name)] = np.frombuffer(body[begin:end], np.float32).reshape(info["shape"])
    return out, meta


def states(seed, rows=4, cols=8):
    return {-1: np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)}


def test_two_tenants_sending_one_request_id_get_a_file_each(tmp_path):
    writer = StateFileWriter(str(tmp_path))
    a, b = states(1), states(2)
    assert writer.submit("cmpl-same-0", a, 4, salt="tenant-a")
    assert writer.submit("cmpl-same-0", b, 4, salt="tenant-b")
    writer.close()
    name_a, name_b = file_name("cmpl-same-0", "tenant-a"), file_name("cmpl-same-0", "tenant-b")
    assert name_a == f"cmpl-same-0@{tenant_digest('tenant-a')}.safetensors" != name_b
    assert np.array_equal(read(tmp_path / name_a)[0][-1], a[-1])
    assert np.array_equal(read(tmp_path / name_b)[0][-1], b[-1])
    assert writer.stats()["files_written"] == 2


def test_no_request_id_names_another_tenants_file():
    # "@" is percent-encoded in an id, so an unsalted id cannot end in a tenant's suffix.
    digest = tenant_digest("victim")
    assert file_name(f"x@{digest}") != file_name("x", "victim")
    assert file_name("x") != file_name("x", "victim")


def test_a_name_that_exists_is_refused_and_counted_never_replaced(tmp_path):
    writer = StateFileWriter(str(tmp_path))
    first, second = states(3), states(4)
    assert writer.submit("r", first, 4)
    assert writer.submit("r", second, 4)  # the same id in the same (no) tenant
    writer.close()
    assert np.array_equal(read(tmp_path / "r.safetensors")[0][-1], first[-1])
    stats = writer.stats()
    assert stats["files_written"] == 1 and stats["files_refused"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.safetensors"]  # no temp file left


def test_a_symlink_planted_at_the_name_is_neither_followed_nor_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    (out / "r.safetensors").symlink_to(target)
    writer = StateFileWriter(str(out))
    writer.submit("r", states(5), 4)
    writer.close()
    assert target.read_bytes() == b"keep me"
    assert (out / "r.safetensors").is_symlink()
    assert writer.stats()["files_refused"] == 1 and writer.stats()["files_written"] == 0


def test_files_are_mode_0600_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        writer = StateFileWriter(str(tmp_path / "new" / "dir"))
        writer.submit("r", states(6), 4)
        writer.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(tmp_path / "new" / "dir" / "r.safetensors").st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(tmp_path / "new" / "dir").st_mode) == 0o700  # made by it


def test_the_temporary_name_cannot_be_predicted_from_the_request_id(tmp_path):
    # Links planted at every name the request id and pid could give are never written through.
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    out = tmp_path / "out"
    out.mkdir()
    for planted in (f".r.safetensors.{os.getpid()}.partial", ".r.safetensors.partial"):
        (out / planted).symlink_to(target)
    writer = StateFileWriter(str(out))
    writer.submit("r", states(7), 4)
    writer.close()
    assert target.read_bytes() == b"keep me"
    assert writer.stats()["files_written"] == 1
    assert np.array_equal(read(out / "r.safetensors")[0][-1], states(7)[-1])


def test_a_directory_writable_by_others_is_refused_naming_it(tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o777)
    with pytest.raises(ValueError, match=rf"hsstore.output_dir '{out}' is writable by others"):
        StateFileWriter(str(out))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to another user")
def test_a_directory_owned_by_another_user_is_refused_naming_it(tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    os.chown(out, 65534, 65534)
    with pytest.raises(ValueError, match=rf"hsstore.output_dir '{out}' is owned by uid 65534"):
        StateFileWriter(str(out))


def test_a_symlink_as_the_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="symlink"):
        StateFileWriter(str(tmp_path / "link"))


def test_the_directory_budget_deletes_the_oldest_files_counted(tmp_path):
    probe = StateFileWriter(str(tmp_path / "probe"))
    probe.submit("p", states(0), 4)
    probe.close()
    size = (tmp_path / "probe" / "p.safetensors").stat().st_size
    out = tmp_path / "out"
    writer = StateFileWriter(str(out), max_bytes=2 * size + size // 2)  # two files and a half
    for i in range(4):
        writer.submit(f"r{i}", states(i), 4)
    writer.close()
    assert sorted(p.name for p in out.iterdir()) == ["r2.safetensors", "r3.safetensors"]
    stats = writer.stats()
    assert stats["files_written"] == 4 and stats["files_evicted"] == 2


def test_files_a_client_deleted_leave_the_budget(tmp_path):
    probe = StateFileWriter(str(tmp_path / "probe"))
    probe.submit("p", states(0), 4)
    probe.close()
    size = (tmp_path / "probe" / "p.safetensors").stat().st_size
    out = tmp_path / "out"
    writer = StateFileWriter(str(out), max_bytes=2 * size + size // 2)
    writer.submit("r0", states(0), 4)
    writer.submit("r1", states(1), 4)
    deadline = time.monotonic() + WAIT_S
    while writer.stats()["files_written"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (out / "r0.safetensors").unlink()  # the client read it
    writer.submit("r2", states(2), 4)
    writer.close()
    assert sorted(p.name for p in out.iterdir()) == ["r1.safetensors", "r2.safetensors"]
    assert writer.stats()["files_evicted"] == 0


def test_a_file_larger_than_the_whole_budget_is_dropped_counted(tmp_path):
    writer = StateFileWriter(str(tmp_path), max_bytes=64)
    writer.submit("big", states(1), 4)
    writer.close()
    assert list(tmp_path.iterdir()) == []
    assert writer.stats()["files_dropped"] == 1 and writer.stats()["files_written"] == 0


class Held:
    """An array whose conversion waits until released: holds the writer thread mid-write."""

    def __init__(self, value, release):
        self.value, self.release, self.nbytes = value, release, value.nbytes

    def __array__(self, dtype=None, copy=None):
        assert self.release.wait(WAIT_S)
        return self.value


def test_the_queue_is_bounded_in_bytes_dropping_counted(tmp_path):
    release = threading.Event()
    one = states(1)[-1]
    writer = StateFileWriter(str(tmp_path), max_pending_bytes=2 * one.nbytes)
    assert writer.submit("held", {-1: Held(one, release)}, 4)  # the writer holds it
    assert writer.submit("second", {-1: one}, 4)
    assert writer.stats()["files_pending_bytes"] == 2 * one.nbytes
    assert not writer.submit("third", {-1: one}, 4)  # past the bytes bound: dropped
    assert writer.stats()["files_dropped"] == 1
    release.set()
    writer.close()
    stats = writer.stats()
    assert stats["files_written"] == 2 and stats["files_pending_bytes"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held.safetensors", "second.safetensors"]


def test_output_options_read_and_check_the_byte_bounds():
    extra = {"hsstore.output_dir": "/x", "hsstore.output_max_bytes": 1 << 30,
             "hsstore.output_max_pending_bytes": 1 << 20}
    assert output_options(extra) == ("/x", 256, 1 << 30, 1 << 20)
    assert output_options({"hsstore.output_dir": "/x"}) == ("/x", 256, 16 << 30, 2 << 30)
    for key in ("hsstore.output_max_bytes", "hsstore.output_max_pending_bytes"):
        for bad in (0, -1, "1", True, 1.5):
            with pytest.raises(ValueError, match=key):
                output_options({"hsstore.output_dir": "/x", key: bad})
