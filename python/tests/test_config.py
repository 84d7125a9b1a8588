import os

import pytest

import hsstore


def test_from_dict_and_defaults():
    c = hsstore.Config({"chunk_size": 16, "enable_hidden_state_cache": True,
                        "max_hidden_state_cpu_size": 0.5, "hidden_state_layers": [0, -1]})
    assert c.chunk_size == 16
    assert c.enable_hidden_state_cache is True
    assert c.max_hidden_state_cpu_size == 0.5
    assert c.hidden_state_layers == [0, -1]
    assert c.save_unfull_chunk is False
    assert c.layer_allowed(-1) and not c.layer_allowed(3)


def test_from_yaml_text_and_file(tmp_path):
    text = "chunk_size: 32\nenable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 1\n"
    assert hsstore.Config(text).chunk_size == 32
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert hsstore.Config(path).chunk_size == 32
    assert hsstore.Config(str(path)).chunk_size == 32
    assert hsstore.Config.from_file(path).chunk_size == 32
    again = hsstore.Config(hsstore.Config(text).to_yaml())
    assert again.chunk_size == 32 and again.max_hidden_state_cpu_size == 1.0


def test_from_env(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("chunk_size: 64\n")
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(path))
    monkeypatch.setenv("LMCACHE_ENABLE_HIDDEN_STATE_CACHE", "true")
    monkeypatch.setenv("LMCACHE_MAX_HIDDEN_STATE_CPU_SIZE", "0.25")
    c = hsstore.Config()
    assert c.chunk_size == 64
    assert c.enable_hidden_state_cache is True
    assert c.max_hidden_state_cpu_size == 0.25
    assert hsstore.Config.from_env().chunk_size == 64


def test_from_lmcache_like_object():
    class LMCacheEngineConfig:  # the attributes LMCache's config object has
        chunk_size = 8
        save_unfull_chunk = True
        max_local_cpu_size = 0.05
        enable_hidden_state_cache = True
        max_hidden_state_cpu_size = 0.05
        hidden_state_layers = None
        remote_url = None

    c = hsstore.Config(LMCacheEngineConfig())
    assert c.chunk_size == 8 and c.save_unfull_chunk is True
    assert c.hidden_state_layers is None


def test_errors_are_value_errors(tmp_path):
    with pytest.raises(hsstore.ConfigError, match="chunk_size"):
        hsstore.Config({"chunk_size": -3})
    with pytest.raises(ValueError):
        hsstore.Config("chunk_size: [1, 2]\n")
    with pytest.raises(hsstore.ConfigError):
        hsstore.Config(tmp_path / "missing.yaml")
    with pytest.raises(hsstore.ConfigError):
        hsstore.Config(12)
    assert issubclass(hsstore.ConfigError, ValueError)
    assert issubclass(hsstore.ConfigError, hsstore.Error)
    assert issubclass(hsstore.InvalidArgument, ValueError)


def test_unknown_keys_are_reported():
    c = hsstore.Config({"chunk_size": 8, "remote_url": None, "some_future_key": 1})
    assert "some_future_key" in c.unknown_keys


def test_repr_round_trips():
    c = hsstore.Config({"chunk_size": 8})
    assert "chunk_size: 8" in repr(c)
    assert os.linesep in repr(c)


def test_store_config_is_the_config_in_effect(monkeypatch):
    # HiddenStateStore.config: a copy of the config the store runs with, the HSS_* debugging
    # variables applied (the given Config object is left as it was).
    given = hsstore.Config({"chunk_size": 16, "enable_hidden_state_cache": True,
                            "max_hidden_state_cpu_size": 0.01, "hidden_state_layers": [0, 2]})
    monkeypatch.setenv("HSS_OUTPUT_CACHE_MB", "3")
    store = hsstore.HiddenStateStore(given, hsstore.ChunkedTokenDatabase(given))
    assert store.config.chunk_size == 16
    assert store.config.hidden_state_layers == [0, 2]
    assert "HSS_OUTPUT_CACHE_MB" in store.config.env_overrides
    assert store.config.hidden_state_output_cache_bytes == 3 << 20
    assert given.hidden_state_output_cache_bytes != 3 << 20
    assert "HSS_OUTPUT_CACHE_MB" not in given.env_overrides
    assert store.config.to_yaml() != given.to_yaml()
    store.close()
    assert store.config.chunk_size == 16
