import pickle

import numpy as np
import pytest

import hsstore
from conftest import CHUNK, make_config


def test_key_value_semantics():
    a = hsstore.CacheEngineKey(model_name="m", chunk_hash=5)
    b = hsstore.CacheEngineKey(model_name="m", chunk_hash=5)
    c = hsstore.CacheEngineKey(model_name="m", chunk_hash=6)
    assert a == b and hash(a) == hash(b) and a != c
    assert len({a, b, c}) == 2
    assert sorted([c, a]) == [a, c]
    assert a.chunk_hash == 5
    assert a.to_string() == "vllm@m@1@0@0000000000000005@bfloat16"
    assert str(a) == a.to_string() and "0000000000000005" in repr(a)
    assert a != "vllm@m@1@0@0000000000000005@bfloat16"
    assert pickle.loads(pickle.dumps(a)) == a


def test_negative_hash_is_twos_complement():
    k = hsstore.CacheEngineKey(chunk_hash=-1)
    assert k.chunk_hash == 2**64 - 1
    with pytest.raises(ValueError, match="chunk_hash"):
        hsstore.CacheEngineKey(chunk_hash=2**64)


def test_process_tokens_chunks_and_inputs():
    db = hsstore.ChunkedTokenDatabase(make_config(), hsstore.Metadata(model_name="m"))
    tokens = list(range(3 * CHUNK + 3))
    chunks = db.process_tokens(tokens)
    assert [(s, e) for s, e, _ in chunks] == [(0, 8), (8, 16), (16, 24)]  # no unfull chunk
    keys = [k for _, _, k in chunks]
    assert all(k.model_name == "m" for k in keys)
    # The same keys from a NumPy array (int32 and int64) and from a tuple.
    assert [k for *_, k in db.process_tokens(np.array(tokens, np.int32))] == keys
    assert [k for *_, k in db.process_tokens(tokens=np.array(tokens, np.int64))] == keys
    assert [k for *_, k in db.process_tokens(tuple(tokens))] == keys
    # Prefix chaining: a different first chunk changes every later key.
    other = db.process_tokens([1] + tokens[1:])
    assert all(a[2] != b[2] for a, b in zip(chunks, other))


def test_process_tokens_unfull_chunk():
    db = hsstore.ChunkedTokenDatabase(make_config(save_unfull_chunk=True))
    assert [(s, e) for s, e, _ in db.process_tokens(list(range(11)))] == [(0, 8), (8, 11)]
    default = hsstore.ChunkedTokenDatabase()  # LMCache without a config: 256, unfull kept
    assert default.chunk_size == 256
    assert [(s, e) for s, e, _ in default.process_tokens(list(range(300)))] == [(0, 256), (256, 300)]


def test_process_hashes_offsets_are_counts():
    db = hsstore.ChunkedTokenDatabase(make_config())
    chunks = db.process_tokens(hashes=[11, 22, -3], offsets=[8, 8, 5])
    assert [(s, e) for s, e, _ in chunks] == [(0, 8), (8, 16), (16, 21)]
    assert [k.chunk_hash for *_, k in chunks] == [11, 22, 2**64 - 3]
    assert [h for *_, h in db.process_tokens(hashes=[11], offsets=[8], make_key=False)] == [11]
    with pytest.raises(ValueError, match="offsets"):
        db.process_tokens(hashes=[1, 2])
    with pytest.raises(ValueError):
        db.process_tokens()


def test_bad_token_ids():
    db = hsstore.ChunkedTokenDatabase(make_config())
    for bad, needle in [([1, "x"], "tokens\\[1\\]"), ([1.5], "tokens\\[0\\]"),
                        ([2**70], "tokens\\[0\\]"), (np.zeros((2, 8), np.int64), "1-D"),
                        (np.zeros(8, np.float32), "integers"), ("abc", "tokens"),
                        ([-1] * CHUNK, "-1"), ([2**32] * CHUNK, "4294967296")]:
        with pytest.raises(ValueError, match=needle):
            db.process_tokens(bad)
