"""Python code that runs while hsstore reads its arguments (__index__, __dlpack__, __repr__) and
changes them, and Python threads racing on one object: each call sees its arguments as they were
when it began (or raises InvalidArgument), returns the right values, and never crashes.

The scenarios that can crash the process (a list's item array freed under the walk, a KV backend
freed under a reader thread, a reservation used by two threads at once) run in a fresh interpreter
(`isolated`), so a regression fails its test instead of killing pytest. Each one is a plain
function of this module (scenario_*), which the child imports and calls."""

import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hsstore
from hsstore import _hsstore
from conftest import CHUNK, DIM, FakeStorageManager, Fixture, rows

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(hsstore.__file__)))


def isolated(scenario):
    """Runs scenario_<name>() of this module in a child interpreter; it must exit 0."""
    code = (
        "import sys\n"
        f"sys.path[:0] = [{PACKAGE_ROOT!r}, {TESTS_DIR!r}]\n"
        "import test_reentrancy\n"
        f"test_reentrancy.scenario_{scenario}()\n"
        "print('scenario done')\n"
    )
    env = dict(os.environ, HSS_LOG_LEVEL="warn", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 0 and "scenario done" in proc.stdout, (
        f"scenario_{scenario} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}")


def churn():
    """Allocates and frees many small objects, so freed item arrays and items get reused."""
    junk = [[object() for _ in range(8)] for _ in range(2000)]
    del junk


class Empties:
    """An integer whose __index__ empties `target` (a list being parsed) and churns memory."""

    def __init__(self, target, value):
        self.target = target
        self.value = value

    def __index__(self):
        del self.target[:]
        churn()
        return self.value


class EmptiesOnExport:
    """A tensor (NumPy array underneath) whose __dlpack__ empties `target` first."""

    def __init__(self, target, array):
        self.target = target
        self.array = array

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        del self.target[:]
        churn()
        return self.array.__dlpack__(*args, **kwargs)


class EmptiesOnRepr:
    """Not an integer; its repr (for the error message) empties `target`."""

    def __init__(self, target):
        self.target = target

    def __repr__(self):
        del self.target[:]
        churn()
        return "EmptiesOnRepr()"


def unbound_store(**overrides):
    """A store with no storage manager: KV counts as present for every chunk."""
    f = Fixture(**overrides)
    f.store.bind_storage_manager(None)
    return f


def self_emptying(values, first):
    """A list [first, *values] whose first item empties the list when read."""
    items = []
    items.extend([Empties(items, first)] + list(values))
    return items


# --- token lists (int_list_from) ---------------------------------------------------------------


def scenario_token_list_emptied_by_index():
    f = unbound_store()
    n = 4 * CHUNK
    data = rows(n)
    plain = list(range(n))
    tokens = self_emptying(range(1, n), 0)
    assert f.store.store_hidden_states(tokens, data) == 4  # the list as the call found it
    assert tokens == []
    assert np.array_equal(f.store.retrieve_hidden_states(plain, like="numpy"), data)
    # The reviewer's case: NumPy integers after the self-emptying item, on retrieve.
    tokens = []
    tokens.extend([Empties(tokens, 0)] + [np.int64(i) for i in range(1, n)])
    assert np.array_equal(f.store.retrieve_hidden_states(tokens, like="numpy"), data)
    out = np.zeros_like(data)
    assert f.store.retrieve_hidden_states_into(self_emptying(range(1, n), 0), out) == n
    assert np.array_equal(out, data)
    assert f.db.process_tokens(tokens=self_emptying(range(1, n), 0)) == f.db.process_tokens(
        tokens=plain)
    # A list refilled (its item array reallocated) by __index__ reads as it was, too.
    class Refills:
        def __index__(self):
            tokens.extend(range(10_000))
            churn()
            return 0

    tokens = [Refills()] + list(range(1, n))
    assert np.array_equal(f.store.retrieve_hidden_states(tokens, like="numpy"), data)
    # Offsets of process_tokens(hashes=...) go through the same conversion.
    hashes = [h for _, _, h in f.db.process_tokens(tokens=plain, make_key=False)]
    offsets = []
    offsets.extend([Empties(offsets, CHUNK)] + [CHUNK] * 3)
    assert f.db.process_tokens(hashes=hashes, offsets=offsets) == f.db.process_tokens(tokens=plain)


def test_token_list_emptied_by_index():
    isolated("token_list_emptied_by_index")


def test_exact_int_token_list_errors_name_the_item():
    f = unbound_store()
    with pytest.raises(hsstore.InvalidArgument, match=r"token_ids\[2\] = 1180591620717411303424"):
        f.store.retrieve_hidden_states([0, 1, 2**70, 3])
    with pytest.raises(hsstore.InvalidArgument, match=r"token_ids\[1\] = True is not an integer"):
        f.store.retrieve_hidden_states([0, True, 2])
    with pytest.raises(hsstore.InvalidArgument, match=r"token_ids\[1\] = 1.5 is not an integer"):
        f.store.retrieve_hidden_states([0, 1.5, 2])
    assert f.roundtrip_ok()


# --- store_batch / retrieve_batch_into ----------------------------------------------------------


def scenario_batch_items_emptied_by_index():
    f = unbound_store()
    n = 2 * CHUNK
    datas = [rows(n, seed=i) for i in range(32)]
    items = []
    items.extend([(list(range(i * 100, i * 100 + n)), datas[i], Empties(items, 0) if i == 0 else 0)
                  for i in range(32)])
    assert f.store.store_batch(items) == [2] * 32
    outs = [np.zeros_like(d) for d in datas]
    items = []
    items.extend([(list(range(i * 100, i * 100 + n)), outs[i], Empties(items, 0) if i == 0 else 0)
                  for i in range(32)])
    assert f.store.retrieve_batch_into(items) == [n] * 32
    for out, data in zip(outs, datas):
        assert np.array_equal(out, data)
    # A list item whose own layer_idx empties it: its token ids and tensor (held by nothing else)
    # are still what the call found.
    expected = rows(n, seed=99)
    item = [list(range(5000, 5000 + n)), expected.copy()]
    item.append(Empties(item, 3))
    assert f.store.store_batch([item]) == [2]
    assert item == []
    got = f.store.retrieve_hidden_states(list(range(5000, 5000 + n)), layer_idx=3, like="numpy")
    assert np.array_equal(got, expected)
    item = [list(range(5000, 5000 + n)), np.zeros_like(expected)]
    out = item[1]
    item.append(Empties(item, 3))
    assert f.store.retrieve_batch_into([item]) == [n]
    assert np.array_equal(out, expected)


def test_batch_items_emptied_by_index():
    isolated("batch_items_emptied_by_index")


def test_batch_token_cache_does_not_match_a_reused_address():
    """Item 2's layer_idx frees item 0's token list and makes a new one for item 3 (CPython's
    free list would give it the freed list's address): item 3 gets its own ids, not item 0's."""
    f = unbound_store()
    n = 2 * CHUNK
    first, second = list(range(0, n)), list(range(7000, 7000 + n))
    datas = [rows(n, seed=s) for s in range(4)]
    items = [[list(first), datas[0], 0], [list(first), datas[1], 1], None, [None, datas[3], 0]]

    class Swaps:
        def __index__(self):
            items[0][0] = None  # item 0's token list: no reference left
            items[3][0] = second[:]  # a new list (PyList_New: the free list, the freed address)
            return 2

    items[2] = (list(range(9000, 9000 + n)), datas[2], Swaps())
    assert f.store.store_batch(items) == [2, 2, 2, 2]
    for tokens, layer, data in ((first, 0, datas[0]), (first, 1, datas[1]),
                                (second, 0, datas[3])):
        got = f.store.retrieve_hidden_states(tokens, layer_idx=layer, like="numpy")
        assert got is not None and np.array_equal(got, data), (tokens[0], layer)


# --- layer lists, output lists, chunk lists, hash lists ----------------------------------------


def scenario_argument_lists_emptied():
    f = unbound_store()
    n = 3 * CHUNK
    data = [rows(n, seed=layer) for layer in range(3)]
    tokens = list(range(n))
    for layer in range(3):
        f.store.store_hidden_states(tokens, data[layer], layer_idx=layer)
    # Layer lists (slots_from): an index that empties the list; a (kind, layer) tuple after it.
    layers = []
    layers.extend([Empties(layers, 0), 1, ("hidden", 2)])
    got = f.store.retrieve_layers(tokens, layers, like="numpy")
    assert [np.array_equal(g, d) for g, d in zip(got, data)] == [True] * 3
    layers = []
    layers.extend([Empties(layers, 0), 1, 2])
    assert f.store.coverage(tokens, layers) == n
    # Output lists: the first tensor's __dlpack__ empties the list of outputs.
    outs_arrays = [np.zeros_like(d) for d in data]
    outs = []
    outs.extend([EmptiesOnExport(outs, outs_arrays[0])] + outs_arrays[1:])
    assert f.store.retrieve_layers_into(tokens, [0, 1, 2], outs) == n
    assert [np.array_equal(o, d) for o, d in zip(outs_arrays, data)] == [True] * 3
    # Chunk lists (chunks_from): a start whose __index__ empties the list.
    chunks = f.db.process_tokens(tokens=tokens)
    evil_chunks = []
    evil_chunks.extend([(Empties(evil_chunks, 0),) + tuple(chunks[0][1:])] + chunks[1:])
    assert np.array_equal(f.store.retrieve_chunks(evil_chunks, like="numpy"), data[0])
    # Hash lists: a bad item's repr empties the list; the error still names it.
    hashes = [1, 2]
    hashes.append(EmptiesOnRepr(hashes))
    try:
        f.db.process_tokens(hashes=hashes, offsets=[CHUNK] * 3)
        raise AssertionError("a non-integer hash was accepted")
    except hsstore.InvalidArgument as e:
        assert "hashes[2] = EmptiesOnRepr()" in str(e), e


def test_argument_lists_emptied():
    isolated("argument_lists_emptied")


def test_numpy_buffers_are_released_after_the_call():
    """Buffers are held for the call (the copy runs without the GIL), then released."""
    f = unbound_store()
    n = 2 * CHUNK
    data = rows(n)
    out = np.zeros_like(data)
    tokens = list(range(n))
    before = (sys.getrefcount(data), sys.getrefcount(out))
    f.store.store_hidden_states(tokens, data)
    f.store.store_batch([(tokens, data, 1)])
    assert f.store.retrieve_hidden_states_into(tokens, out) == n
    assert f.store.retrieve_batch_into([(tokens, out, 1)]) == [n]
    assert f.store.retrieve_layers_into(tokens, [0, 1], [out, out]) == n
    assert np.array_equal(out, data)
    assert (sys.getrefcount(data), sys.getrefcount(out)) == before
    out.resize((4 * n, DIM), refcheck=True)  # nothing of hsstore's still refers to it


# --- rebinding a LocalCpuBackend under a reader thread -----------------------------------------


def test_unbound_local_cpu_backend_is_kept_alive():
    """The C++ store calls a bound backend by raw pointer, maybe on another thread after the next
    bind: the Python store holds every backend it was bound to until it dies."""
    f = unbound_store()
    kv, other = hsstore.LocalCpuBackend(1 << 20), hsstore.LocalCpuBackend(1 << 20)
    base = sys.getrefcount(kv)
    f.store.bind_storage_manager(kv)
    f.store.bind_storage_manager(None)
    assert sys.getrefcount(kv) == base + 1
    f.store.bind_storage_manager(other)
    f.store.bind_storage_manager(FakeStorageManager())
    assert sys.getrefcount(kv) == base + 1
    for _ in range(3):
        f.store.bind_storage_manager(kv)
    assert sys.getrefcount(kv) == base + 2  # bound now, and held once however often bound
    assert f.store.storage_manager is kv
    f.store.close()


def scenario_rebinding_backends_under_a_reader():
    f = unbound_store(hidden_state_block_bytes=512, max_hidden_state_cpu_size=0.05)
    chunks, rebinds = 2000, 60
    n = chunks * CHUNK
    tokens = np.arange(n, dtype=np.int64)
    keys = f.keys_for(tokens)
    data = rows(n)
    assert f.store.store_hidden_states(tokens, data) == chunks

    def backend():  # KV for every chunk: no retrieve may come up short, no chunk be dropped
        kv = hsstore.LocalCpuBackend(1 << 24)
        for key in keys:
            kv.put(key, b"x")
        return kv

    backends = [backend() for _ in range(rebinds)]
    results, stop, started = [], threading.Event(), threading.Event()

    def reader():
        out = np.empty_like(data)
        while not stop.is_set():
            results.append(f.store.retrieve_hidden_states_into(tokens, out))
            started.set()
        results.append(bool(np.array_equal(out, data)))

    sys.setswitchinterval(1e-5)  # the reader gets the GIL back quickly between its calls
    thread = threading.Thread(target=reader)
    thread.start()
    started.wait()
    try:
        for i in range(rebinds):
            f.store.bind_storage_manager(backends[i])
            backends[i] = None  # the store is all that holds it now
            time.sleep(0.0005)  # the reader asks it (contains() for each chunk)
            # Unbinding must not free it: the reader may still be inside its contains().
            f.store.bind_storage_manager(None)
            time.sleep(0.0005)
    finally:
        stop.set()
        thread.join()
    assert results[-1] is True
    assert set(results[:-1]) == {n}, sorted(set(results[:-1]))  # started: at least one
    assert f.store.num_entries() == chunks
    assert f.store.stats()["coupled_evictions"] == 0


def test_rebinding_backends_under_a_reader():
    isolated("rebinding_backends_under_a_reader")


# --- one PoolPull shared by Python threads -----------------------------------------------------


def scenario_pool_pull_shared_by_threads():
    config = {"chunk_size": CHUNK, "enable_hidden_state_cache": True,
              "max_hidden_state_cpu_size": 0.01}
    producer, consumer = hsstore.Engine(config), hsstore.Engine(config)
    source, dest = producer.hidden_state_store, consumer.hidden_state_store
    source.bind_storage_manager(None)
    dest.bind_storage_manager(None)
    chunks = 64
    tokens = list(range(chunks * CHUNK))
    data = rows(len(tokens))
    source.store_hidden_states(tokens, data)
    serving = _hsstore.PoolTransfer(source)
    pull = _hsstore.PoolTransfer(dest).begin_pull(tokens, [0])
    readers, publishers = 4, 4
    reserved, landed = threading.Event(), threading.Event()
    published, errors = [], []

    def consume():  # reserve, then the READ (a copy from the producer's extents)
        pull.reserve(serving.serve(pull.request, 10_000)[0])
        reserved.set()
        local, remote = pull.descriptors()
        local = np.frombuffer(local, np.uint64).reshape(-1, 3)
        remote = np.frombuffer(remote, np.uint64).reshape(-1, 3)
        for (to, size, _), (at, _, _) in zip(local, remote):
            ctypes.memmove(int(to), int(at), int(size))
        landed.set()

    publish_together = threading.Barrier(publishers)

    def publish():  # all at once: one publishes every entry, the others find none left
        landed.wait()
        publish_together.wait()
        published.append(pull.publish())

    def observe():  # reads the reservation while it is made and published
        for _ in range(200):
            assert len(pull.entry_bytes()) in (0, chunks) and pull.entries in (0, chunks)
            assert pull.bytes in (0, chunks * CHUNK * DIM * 4)
            assert pull.chunks_covered in (0, chunks)
            try:
                local, remote = pull.descriptors()
                assert len(local) == len(remote)
            except hsstore.InvalidArgument as e:  # before reserve()
                assert "nothing reserved yet" in str(e)

    def worker(role):
        try:
            role()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    roles = [consume] + [publish] * publishers + [observe] * readers
    threads = [threading.Thread(target=worker, args=(role,)) for role in roles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors
    everything = {"published": chunks, "rejected": 0, "unauthenticated": 0,
                  "bytes": chunks * CHUNK * DIM * 4}
    nothing = dict.fromkeys(everything, 0)
    assert sorted(published, key=lambda r: r["published"]) == [nothing] * 3 + [everything]
    assert pull.publish() == nothing and pull.entries == 0
    dest.check_invariants()
    pull.abandon()
    assert np.array_equal(dest.retrieve_hidden_states(tokens, like="numpy"), data)


def test_pool_pull_shared_by_threads():
    isolated("pool_pull_shared_by_threads")
