"""What a new user hits first: every Config key reachable from Python, YAML text in from_yaml,
read-only NumPy arrays read (or refused naming the argument), tensors without data refused as
ValueError, and the C++ calls retrieve_layers_into and coverage(scope=...) in Python."""

import pathlib
import re

import numpy as np
import pytest

import hsstore
from conftest import CHUNK, DIM, rows
from hsstore import _hsstore

YAML = "chunk_size: 8\nenable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 0.01\n"


def test_from_yaml_takes_text():
    config = hsstore.Config.from_yaml(YAML)
    assert config.chunk_size == 8 and config.enable_hidden_state_cache is True
    with pytest.raises(hsstore.ConfigError, match="chunk_size"):
        hsstore.Config.from_yaml("chunk_size: eight\n")


def test_every_config_key_is_an_attribute_with_its_value():
    keys = hsstore.Config.keys()
    assert len(keys) == len(set(keys))
    assert {"chunk_size", "hidden_state_transfer", "hidden_state_stream_threshold_bytes"} <= set(keys)
    config = hsstore.Config({
        "hidden_state_remote_ttl_s": 30, "hidden_state_remote_timeout_ms": 250,
        "hidden_state_remote_queue_bytes": 4096, "hidden_state_restore_impl": "cub",
        "hidden_state_store_impl": "mapped", "hidden_state_staging_bytes": 1 << 20,
        "hidden_state_launch_slots": 8, "hidden_state_output_cache_bytes": 0,
        "hidden_state_stream_threshold_bytes": 123, "hidden_state_kinds": ["hidden", "key"],
        "hidden_state_copy_threads": 2,
    })
    values = config.to_dict()
    assert sorted(values) == sorted(keys)
    for key in keys:
        assert getattr(config, key) == values[key], key
    assert values["hidden_state_remote_ttl_s"] == 30
    assert values["hidden_state_remote_timeout_ms"] == 250
    assert values["hidden_state_remote_queue_bytes"] == 4096
    assert values["hidden_state_restore_impl"] == "cub"
    assert values["hidden_state_store_impl"] == "mapped"
    assert values["hidden_state_staging_bytes"] == 1 << 20
    assert values["hidden_state_launch_slots"] == 8
    assert values["hidden_state_output_cache_bytes"] == 0
    assert values["hidden_state_stream_threshold_bytes"] == 123
    assert values["hidden_state_copy_threads"] == 2
    # auto (the default): None, and it survives the round trips too.
    auto = hsstore.Config()
    assert auto.hidden_state_stream_threshold_bytes is None
    assert hsstore.Config(auto.to_dict()).hidden_state_stream_threshold_bytes is None
    assert hsstore.Config(auto.to_yaml()).hidden_state_stream_threshold_bytes is None
    assert values["hidden_state_remote_url"] == []
    # Every key survives the round trip through a dict, and through YAML.
    assert hsstore.Config(values).to_dict() == values
    assert hsstore.Config(config.to_yaml()).to_dict() == values


def test_config_keys_match_to_yaml():
    written = {line.split(":", 1)[0] for line in hsstore.Config().to_yaml().splitlines()}
    # The inline MAC secret is never written out (hidden_state_mac_key_file is the way to persist it).
    assert written == set(hsstore.Config.keys()) - {"hidden_state_mac_key"}
    secret = "0123456789abcdef-secret"
    assert secret not in hsstore.Config({"hidden_state_mac_key": secret}).to_yaml()


def test_lmcache_style_object_carries_every_key():
    class Engine:
        chunk_size = 16
        hidden_state_launch_slots = 7
        hidden_state_store_impl = "mapped"

    config = hsstore.Config(Engine())
    assert config.chunk_size == 16 and config.hidden_state_launch_slots == 7
    assert config.hidden_state_store_impl == "mapped"


def test_read_only_numpy_arrays_are_read(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    data = rows(2 * CHUNK)
    over_bytes = np.frombuffer(data.tobytes(), np.float32).reshape(2 * CHUNK, DIM)
    assert not over_bytes.flags.writeable
    assert fix.store.store_hidden_states(tokens, over_bytes) == 2
    np.testing.assert_array_equal(fix.store.retrieve_hidden_states(tokens, like="numpy"), data)
    assert _hsstore._roundtrip_tensor(over_bytes)[:3] == (2 * CHUNK, DIM, DIM)
    # A read-only view with a usable layout (every other row) is read as well.
    view = np.frombuffer(rows(4 * CHUNK).tobytes(), np.float32).reshape(4 * CHUNK, DIM)[::2]
    assert _hsstore._roundtrip_tensor(view)[:3] == (2 * CHUNK, DIM, 2 * DIM)


def test_read_only_array_hsstore_cannot_read_is_value_error_naming_it(fix):
    tokens = list(range(2 * CHUNK))
    before = fix.store.stats()
    broadcast = np.broadcast_to(np.ones(DIM, np.float32), (2 * CHUNK, DIM))  # row stride 0
    with pytest.raises(ValueError, match="hidden_states is a read-only NumPy array"):
        fix.store.store_hidden_states(tokens, broadcast)
    doubles = np.frombuffer(rows(2 * CHUNK).astype(np.float64).tobytes()).reshape(2 * CHUNK, DIM)
    with pytest.raises(ValueError, match="hidden_states is a read-only NumPy array"):
        fix.store.store_hidden_states(tokens, doubles)
    assert fix.store.stats() == before
    assert fix.roundtrip_ok()


def test_read_only_output_is_value_error_naming_it(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    fix.store.store_hidden_states(tokens, rows(2 * CHUNK))
    out = np.frombuffer(np.zeros((2 * CHUNK, DIM), np.float32).tobytes(), np.float32)
    with pytest.raises(ValueError, match="out is a read-only NumPy array"):
        fix.store.retrieve_hidden_states_into(tokens, out.reshape(2 * CHUNK, DIM))
    with pytest.raises(ValueError, match=r"outs\[0\] is a read-only NumPy array"):
        fix.store.retrieve_layers_into(tokens, [0], [out.reshape(2 * CHUNK, DIM)])


def test_a_producer_refusing_dlpack_is_value_error_naming_the_argument(fix):
    class Refuses:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            raise BufferError("no export today")

    with pytest.raises(ValueError, match="hidden_states cannot be exported through DLPack.*no "
                                         "export today"):
        fix.store.store_hidden_states(list(range(CHUNK)), Refuses())
    assert fix.roundtrip_ok()


def test_retrieve_layers_into_restores_every_layer_or_none(fix):
    tokens = list(range(3 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    l0, l5 = rows(3 * CHUNK, seed=1), rows(3 * CHUNK, seed=5)
    fix.store.store_hidden_states(tokens, l0, layer_idx=0)
    fix.store.store_hidden_states(tokens[:2 * CHUNK], l5[:2 * CHUNK], layer_idx=5)
    outs = [np.zeros((3 * CHUNK, DIM), np.float32) for _ in range(2)]
    # All or nothing: layer 5 ends after 2 chunks, so both outputs get 2 chunks.
    assert fix.store.retrieve_layers_into(tokens, [0, 5], outs) == 2 * CHUNK
    np.testing.assert_array_equal(outs[0][:2 * CHUNK], l0[:2 * CHUNK])
    np.testing.assert_array_equal(outs[1][:2 * CHUNK], l5[:2 * CHUNK])
    assert not outs[0][2 * CHUNK:].any()
    # Caller-computed chunks, row_begin, a (kind, layer) slot, float16 output.
    chunks = fix.db.process_tokens(tokens=tokens)
    half = np.zeros((2 * CHUNK, DIM), np.float16)
    assert fix.store.retrieve_layers_into(chunks, [("hidden", 0)], [half], row_begin=CHUNK) == \
        2 * CHUNK
    np.testing.assert_array_equal(half, l0[CHUNK:].astype(np.float16))
    assert fix.store.retrieve_layers_into(tokens, [0, 99], outs) == 0
    with pytest.raises(ValueError, match="outs"):
        fix.store.retrieve_layers_into(tokens, [0, 5], outs[:1])


def test_coverage_scope(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    fix.store.store_hidden_states(tokens, rows(2 * CHUNK))
    assert fix.store.coverage(tokens, [0], scope=hsstore.CoverageScope.local) == 2 * CHUNK
    # No remote tier configured: the remote scope counts the same local entries.
    assert fix.store.coverage(tokens, [0],
                              scope=hsstore.CoverageScope.local_and_remote) == 2 * CHUNK
    assert fix.store.coverage(tokens, [1], scope=hsstore.CoverageScope.local) == 0


def test_readme_config_table_lists_every_key():
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    table = readme.read_text().split("\n## Configuration keys\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, re.M)
    assert sorted(listed) == sorted(hsstore.Config.keys())


def test_config_attributes_are_the_key_table_with_its_doc_lines():
    """Every attribute comes from the C++ key table: README's meaning column, Config.doc and the
    attribute's docstring are one text, in the table's order."""
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    table = readme.read_text().split("\n## Configuration keys\n", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (.*?) \| (.*) \|$", table, re.M)
    assert [name for name, _, _ in rows] == hsstore.Config.keys()
    for name, _, meaning in rows:
        assert hsstore.Config.doc(name) == meaning, name
        assert getattr(hsstore.Config, name).__doc__ == meaning, name
    with pytest.raises(ValueError, match="chunk_sizes"):
        hsstore.Config.doc("chunk_sizes")
    config = hsstore.Config({"hidden_state_log_level": "error"})
    assert config.hidden_state_log_level == "error"
    assert hsstore.Config.from_yaml("").hidden_state_log_level is None
    assert config.env_overrides == []
