"""What a hidden state's key depends on besides its tokens (hsstore.salt, hsstore.vllm.identity):
the request's cache_salt, LMCache's key tags and the model's identity, folded into the key's fmt
by an injective encoding, so that no choice of tags spells a salt or another tag set, and new
weights under the same model name never read the old weights' rows (the disk tier included);
hsstore's own chunk hash keyed by a secret (hidden_state_chunk_hash_key_file)."""

import dataclasses
import hashlib
import types

import numpy as np
import pytest

import hsstore
import hsstore.lmcache
from hsstore.salt import KeyNamespace, SaltedKey, namespace_fmt, salted_native_key
from hsstore.vllm.identity import key_namespace, model_identity, read_salt_key

SALT = "tenant-1"


@dataclasses.dataclass(frozen=True)
class LMCacheKey:
    """The fields of LMCache's CacheEngineKey that hsstore.lmcache reads."""

    chunk_hash: int = 0x1234
    tags: tuple = None
    model_name: str = "m"
    world_size: int = 1
    worker_id: int = 0
    dtype: str = "bfloat16"


def native(key, namespace=KeyNamespace()):
    return hsstore.lmcache._native_key(key, namespace)


def test_a_tag_that_spells_a_salt_digest_is_not_that_salt():
    # The old fold wrote a salt as "@salt%<sha256[:32]>", exactly what the tag ("salt", digest)
    # gave: an unsalted client could claim a tenant's keys with it.
    digest = hashlib.sha256(SALT.encode()).hexdigest()[:32]
    spoof = native(LMCacheKey(tags=(("salt", digest),)))
    salted = native(SaltedKey(LMCacheKey(), SALT))
    assert spoof != salted and spoof.fmt != salted.fmt


def test_tag_sets_that_concatenate_alike_are_distinct_keys():
    one = native(LMCacheKey(tags=(("a", "b@c%d"),)))
    two = native(LMCacheKey(tags=(("a", "b"), ("c", "d"))))
    assert one != two
    for key in (one, two):
        assert key.fmt.startswith("lmcache~") and "@" not in key.fmt  # to_string() stays framed
    assert native(LMCacheKey()).fmt == "lmcache"  # untagged, unsalted: today's key


def test_the_salt_digest_is_keyed_by_the_deployment_secret():
    plain = native(SaltedKey(LMCacheKey(), SALT))
    keyed = native(SaltedKey(LMCacheKey(), SALT), KeyNamespace(salt_key=b"s" * 32))
    other = native(SaltedKey(LMCacheKey(), SALT), KeyNamespace(salt_key=b"t" * 32))
    assert len({plain.fmt, keyed.fmt, other.fmt}) == 3
    again = native(SaltedKey(LMCacheKey(), SALT), KeyNamespace(salt_key=b"s" * 32))
    assert again == keyed
    # The salted native keys of hsstore's own stores take the same secret.
    base = hsstore.CacheEngineKey(model_name="m", chunk_hash=7, fmt="vllm")
    assert (salted_native_key(base, SALT, KeyNamespace(salt_key=b"s" * 32)).fmt
            != salted_native_key(base, SALT).fmt)
    assert salted_native_key(base, "") is base


def model_config(revision=None, path="/models/a", **config):
    hf = {"hidden_size": 256, "num_hidden_layers": 2, "_name_or_path": path,
          "transformers_version": "4.57.0", **config}
    return types.SimpleNamespace(revision=revision,
                                 hf_config=types.SimpleNamespace(to_dict=lambda: dict(hf)))


def test_the_model_identity_follows_the_weights_not_where_they_live():
    base = model_identity(model_config(), {})
    assert model_identity(model_config(path="/mnt/copy/a"), {}) == base  # a copy of one model
    assert model_identity(model_config(revision="v2"), {}) != base
    assert model_identity(model_config(hidden_size=512), {}) != base
    assert model_identity(model_config(), {"hsstore.model_revision": "ckpt-7"}) != base
    with pytest.raises(ValueError, match="hsstore.model_revision"):
        model_identity(model_config(), {"hsstore.model_revision": ""})
    lmcache_keys = {native(LMCacheKey(), KeyNamespace(model=ident)).fmt
                    for ident in (base, model_identity(model_config(revision="v2"), {}))}
    assert len(lmcache_keys) == 2 and "lmcache" not in lmcache_keys


def test_the_salt_key_file_is_read_and_checked(tmp_path):
    assert read_salt_key({}) is None
    key = tmp_path / "salt.key"
    key.write_bytes(b"a deployment salt key, 32 bytes.\n")
    assert read_salt_key({"hsstore.salt_key_file": str(key)}) == b"a deployment salt key, 32 bytes."
    key.write_bytes(b"short\n")
    with pytest.raises(ValueError, match="hsstore.salt_key_file: .* holds 5 bytes"):
        read_salt_key({"hsstore.salt_key_file": str(key)})
    with pytest.raises(ValueError, match="hsstore.salt_key_file: cannot read"):
        read_salt_key({"hsstore.salt_key_file": str(tmp_path / "missing")})
    vllm_config = types.SimpleNamespace(model_config=model_config())
    key.write_bytes(b"a deployment salt key, 32 bytes.")
    namespace = key_namespace(vllm_config, {"hsstore.salt_key_file": str(key)})
    assert namespace.salt_key == b"a deployment salt key, 32 bytes." and namespace.model


CHUNK, DIM = 8, 16


def store_over_disk(disk, identity):
    """A store over a disk tier whose keys are in the namespace of `identity` (as
    hsstore.vllm.stores.engine_store makes them from vLLM's model_config); KV present."""
    config = hsstore.Config({"chunk_size": CHUNK, "enable_hidden_state_cache": True,
                             "max_hidden_state_cpu_size": 0.01, "max_local_cpu_size": 0.01,
                             "local_disk": str(disk)})
    fmt = namespace_fmt("vllm", KeyNamespace(model=identity).fields())
    db = hsstore.ChunkedTokenDatabase(config, hsstore.Metadata(model_name="m", fmt=fmt))
    store = hsstore.HiddenStateStore(config, db)
    store.bind_storage_manager(None)
    return store, db


def test_new_weights_under_the_same_model_name_never_read_the_disk_tiers_old_rows(tmp_path):
    tokens = list(range(3, 3 + 4 * CHUNK))
    rows = np.random.default_rng(1).standard_normal((len(tokens), DIM)).astype(np.float32)
    old = model_identity(model_config(), {})
    new = model_identity(model_config(revision="v2"), {})
    store, _ = store_over_disk(tmp_path, old)
    assert store.store_hidden_states(tokens, rows) == 4
    store.close()  # the disk tier has them written
    tiered = hsstore.CoverageScope.local_and_remote

    store, _ = store_over_disk(tmp_path, new)  # a restart with new weights
    assert store.coverage(tokens, [0], scope=tiered) == 0
    assert store.retrieve_hidden_states(tokens, like="numpy") is None
    store.close()
    store, _ = store_over_disk(tmp_path, old)  # control: the same weights do read them
    assert store.coverage(tokens, [0], scope=tiered) == len(tokens)
    assert np.array_equal(store.retrieve_hidden_states(tokens, like="numpy"), rows)
    store.close()


def test_a_chunk_hash_key_file_keys_hsstores_own_chunk_hash(tmp_path):
    key = tmp_path / "chunk.key"
    key.write_bytes(b"a chunk hash key of 32 bytes....\n")
    tokens = list(range(3, 3 + 2 * CHUNK))
    plain = hsstore.ChunkedTokenDatabase(hsstore.Config({"chunk_size": CHUNK}))
    keyed = hsstore.ChunkedTokenDatabase(hsstore.Config(
        {"chunk_size": CHUNK, "hidden_state_chunk_hash_key_file": str(key)}))
    assert keyed.keyed and not plain.keyed
    plain_keys = [k for _, _, k in plain.process_tokens(tokens)]
    keyed_keys = [k for _, _, k in keyed.process_tokens(tokens)]
    assert all(a.chunk_hash != b.chunk_hash for a, b in zip(plain_keys, keyed_keys))
    engine = hsstore.Engine({"chunk_size": CHUNK, "enable_hidden_state_cache": True,
                             "max_hidden_state_cpu_size": 0.01, "max_local_cpu_size": 0.001,
                             "hidden_state_chunk_hash_key_file": str(key)})
    assert [k for _, _, k in engine.token_database.process_tokens(tokens)] == keyed_keys
    key.write_bytes(b"short")
    with pytest.raises(hsstore.ConfigError, match="hidden_state_chunk_hash_key_file"):
        hsstore.ChunkedTokenDatabase(hsstore.Config(
            {"chunk_size": CHUNK, "hidden_state_chunk_hash_key_file": str(key)}))
