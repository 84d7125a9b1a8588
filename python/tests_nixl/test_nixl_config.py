"""Configuration of the point-to-point transfer: off by default, 'nixl' needs the nixl package
(a ConfigError at configuration time without it), bad values are ConfigErrors naming the key."""

import os
import subprocess
import sys

import pytest

import hsstore
import hsstore.nixl
from hsstore import _hsstore

from conftest import config


def test_off_by_default_and_settings_are_read():
    s = _hsstore.transfer_settings(hsstore.Config({}))
    assert s == {"transfer": "none", "backend": "UCX", "lease_ms": 30000, "timeout_ms": 10000,
                 "listen": "127.0.0.1:0", "max_chunks": 4096, "peer_leases": 64,
                 "peer_leased_bytes": 4 << 30, "max_peers": 64, "idle_ms": 60000,
                 "trusted_network": False, "mac": False}
    c = hsstore.Config({"hidden_state_transfer": "nixl", "hidden_state_transfer_lease_ms": 500,
                        "hidden_state_transfer_listen": "0.0.0.0:7777"})
    s = _hsstore.transfer_settings(c)
    assert (s["transfer"], s["lease_ms"], s["listen"]) == ("nixl", 500, "0.0.0.0:7777")


@pytest.mark.parametrize("key, value", [
    ("hidden_state_transfer", "rdma"),
    ("hidden_state_transfer_backend", "U C X"),
    ("hidden_state_transfer_lease_ms", 0),
    ("hidden_state_transfer_timeout_ms", 10**9),
    ("hidden_state_transfer_listen", "no-port"),
    ("hidden_state_mac_key", "short"),
    ("hidden_state_transfer_max_chunks", 0),
    ("hidden_state_transfer_max_peers", 0),
    ("hidden_state_transfer_idle_ms", 0),
    ("hidden_state_transfer_peer_leases", -1),
])
def test_bad_values_are_config_errors_naming_the_key(key, value):
    with pytest.raises(hsstore.ConfigError, match=key):
        hsstore.Config({key: value})


def test_nixl_without_the_package_is_a_config_error_at_configuration_time():
    # The same interpreter without site-packages (so without nixl), the build tree's hsstore only.
    code = ("import hsstore\n"
            "try:\n"
            "    hsstore.Config({'hidden_state_transfer': 'nixl'})\n"
            "except hsstore.ConfigError as e:\n"
            "    print('ConfigError:', e)\n")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert "ConfigError: config key 'hidden_state_transfer': 'nixl' needs the Python package nixl" in out.stdout, out
    # And with transfer off the same interpreter is fine.
    ok = subprocess.run([sys.executable, "-S", "-c", "import hsstore; hsstore.Config({}); print('ok')"],
                        env=env, capture_output=True, text=True, timeout=60)
    assert ok.stdout.strip() == "ok", ok


def test_agent_needs_transfer_nixl_in_the_config():
    engine = hsstore.Engine({"chunk_size": 256, "enable_hidden_state_cache": True,
                             "max_hidden_state_cpu_size": 0.01})
    with pytest.raises(hsstore.ConfigError, match="hidden_state_transfer: nixl"):
        hsstore.nixl.NixlAgent(engine)


def test_agent_with_an_unknown_backend_is_a_config_error():
    engine = hsstore.Engine(config(8, hidden_state_transfer_backend="NOSUCHBACKEND"))
    with pytest.raises(hsstore.ConfigError, match="NOSUCHBACKEND"):
        hsstore.nixl.NixlAgent(engine, serve=False)
