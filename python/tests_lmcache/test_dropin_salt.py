"""Tenants in the drop-in (hsstore.salt): vLLM's per-request cache_salt keeps hidden states apart
in a real LMCache 0.5.6 engine and in the Redis tier behind it, while the KV (which LMCache's
in-process engine keys without the salt) is asked with the plain key. A request with one salt
neither hits nor sees hidden states stored under another, or under none."""

import torch

import hsstore
import hsstore.lmcache
from hsstore.salt import SaltedKey, namespace_fmt, salt_field
from test_engine_dropin import CHUNK, DIM, RealEngine, dropin_installed  # noqa: F401 (fixture)
from test_engine_dropin_mac import engine_with, redis_url  # noqa: F401 (fixture)

TENANT_1, TENANT_2 = "tenant-1", "tenant-2"


def tokens_of(seed, chunks=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 30000, (chunks * CHUNK,), generator=g).tolist()


def store_as(engine, tokens, rows, salt):
    chunks = engine.store.chunks(tokens, salt)
    assert engine.store.store_chunks(chunks, rows, layer_idx=-1) == len(chunks)


def read_as(engine, tokens, salt, scope=None):
    """(coverage, rows restored or None) of tokens' layer -1 under `salt`."""
    chunks = engine.store.chunks(tokens, salt)
    kwargs = {} if scope is None else {"scope": scope}
    covered = engine.store.coverage(chunks, [-1], **kwargs)
    out = torch.zeros(len(tokens), DIM)
    rows = engine.store.retrieve_layers_into(chunks, [-1], [out])
    return covered, (out[:rows] if rows else None)


def test_salted_chunks_carry_the_plain_lmcache_key_and_a_salted_native_one():
    engine = RealEngine()
    try:
        tokens = tokens_of(1)
        plain = engine.store.chunks(tokens)
        salted = engine.store.chunks(tokens, TENANT_1)
        assert [(s, e) for s, e, _ in plain] == [(s, e) for s, e, _ in salted]
        for (_, _, key), (_, _, salted_key) in zip(plain, salted):
            assert salted_key == SaltedKey(key, TENANT_1)
            native = hsstore.lmcache._native_key(salted_key)
            assert native.fmt == namespace_fmt("lmcache", salt_field(TENANT_1))
            assert native.fmt.startswith("lmcache~") and "@" not in native.fmt
            assert native != hsstore.lmcache._native_key(key)
            assert native != hsstore.lmcache._native_key(SaltedKey(key, TENANT_2))
        assert engine.store.chunks(tokens, "") == plain  # no salt: today's keys
        assert hsstore.lmcache._native_key(key).fmt == "lmcache"  # no salt: today's fmt
    finally:
        engine.close()


def test_each_tenant_is_served_its_own_rows_and_never_another_s():
    engine = RealEngine()
    try:
        tokens = tokens_of(2)
        engine.put_kv(engine.keys_for(tokens))  # LMCache's KV: one copy, no salt
        rows_1 = torch.randn(len(tokens), DIM)
        store_as(engine, tokens, rows_1, TENANT_1)

        covered, got = read_as(engine, tokens, TENANT_1)
        assert covered == len(tokens) and torch.equal(got, rows_1)
        # Tenant 2 and an unsalted request see nothing, though the KV is there for them.
        assert read_as(engine, tokens, TENANT_2) == (0, None)
        assert read_as(engine, tokens, None) == (0, None)
        assert engine.store.retrieve_hidden_states(tokens, layer_idx=-1) is None
        assert not engine.store.has_chunk(engine.keys_for(tokens)[0], -1)

        # Tenant 2 stores the same tokens' rows under its own keys: each reads its own.
        rows_2 = torch.randn(len(tokens), DIM)
        store_as(engine, tokens, rows_2, TENANT_2)
        assert torch.equal(read_as(engine, tokens, TENANT_1)[1], rows_1)
        assert torch.equal(read_as(engine, tokens, TENANT_2)[1], rows_2)
        assert engine.store.num_cached_chunks() == 2 * len(tokens) // CHUNK
    finally:
        engine.close()


def test_kv_evicted_ends_every_tenant_s_prefix():
    # KV presence is asked with the chunk's plain LMCache key: evicting it drops the hidden
    # states of every salt at that chunk (coupled eviction holds across tenants).
    engine = RealEngine()
    try:
        tokens = tokens_of(3)
        keys = engine.keys_for(tokens)
        engine.put_kv(keys)
        for salt in (TENANT_1, TENANT_2):
            store_as(engine, tokens, torch.randn(len(tokens), DIM), salt)
        engine.evict_kv(keys[2])
        for salt in (TENANT_1, TENANT_2):
            covered, got = read_as(engine, tokens, salt)
            assert covered == 2 * CHUNK and got.shape[0] == 2 * CHUNK
    finally:
        engine.close()


def test_the_redis_tier_keeps_tenants_apart(redis_url):  # noqa: F811 (fixture)
    tokens = tokens_of(4)
    rows = torch.randn(len(tokens), DIM)
    writer = engine_with(redis_url, "writer")
    try:
        writer.put_kv(writer.keys_for(tokens))
        store_as(writer, tokens, rows, TENANT_1)
        writer.store.native.flush()
        assert writer.store.stats()["remote"]["writes_sent"] == len(tokens) // CHUNK
    finally:
        writer.close()

    # A fresh pool (another engine): only Redis holds the rows, under tenant 1's keys.
    reader = engine_with(redis_url, "reader")
    try:
        reader.put_kv(reader.keys_for(tokens))
        tiers = hsstore.CoverageScope.local_and_remote
        assert read_as(reader, tokens, TENANT_2, tiers) == (0, None)
        assert read_as(reader, tokens, None, tiers) == (0, None)
        assert reader.store.stats()["remote"]["hits"] == 0
        covered, got = read_as(reader, tokens, TENANT_1, tiers)
        assert covered == len(tokens) and torch.equal(got, rows)
        assert reader.store.stats()["remote"]["hits"] == len(tokens) // CHUNK
    finally:
        reader.close()
