"""The "hsstore.nixl" option of hsstore.vllm (prefill/decode over NIXL): what HiddenStates writes
into vLLM's KV transfer config, and the configuration-time errors (no engine is built here)."""

import subprocess
import sys

import pytest

import hsstore
import hsstore.vllm
from hsstore.vllm.transfer import parse_options, pull_timeout_ms, request_producer

pytest.importorskip("nixl", reason="the nixl package is not in this venv (scripts/vllm_venv.lock)")


def test_nixl_option_is_one_key_of_the_connector_config():
    prefill = hsstore.vllm.HiddenStates(layers=[-1, 2], nixl={"listen": "0.0.0.0:5555"})
    decode = hsstore.vllm.HiddenStates(layers=[-1, 2], nixl={"producer": "prefill-host:5555"})
    assert prefill.kv_transfer_config().kv_connector_extra_config["hsstore.nixl"] == {
        "listen": "0.0.0.0:5555"}
    extra = decode.kv_transfer_config().kv_connector_extra_config
    assert extra["hsstore.nixl"] == {"producer": "prefill-host:5555"}
    assert "hsstore.nixl" not in hsstore.vllm.HiddenStates().kv_transfer_config(
    ).kv_connector_extra_config


def test_options_map_to_hsstore_transfer_keys():
    options = parse_options({"listen": "127.0.0.1:7001", "producer": "10.0.0.2:7001",
                             "timeout_ms": 800, "lease_ms": 2000, "backend": "UCX"})
    assert options.serve and options.producer == "10.0.0.2:7001" and options.timeout_ms == 800
    settings = hsstore._hsstore.transfer_settings(hsstore.Config(options.settings))
    given = {k: settings[k] for k in ("transfer", "backend", "lease_ms", "timeout_ms", "listen",
                                      "trusted_network", "mac")}
    assert given == {"transfer": "nixl", "backend": "UCX", "lease_ms": 2000, "timeout_ms": 800,
                     "listen": "127.0.0.1:7001", "trusted_network": False, "mac": False}
    trusted = parse_options({"listen": "127.0.0.1:7001", "trusted_network": True})
    assert hsstore._hsstore.transfer_settings(hsstore.Config(trusted.settings))["trusted_network"]
    decode = parse_options({"producer": "prefill:7001"})
    assert not decode.serve and decode.timeout_ms is None
    assert parse_options(None) is None


def test_options_kept_until_exit_leak_nothing_native():
    """The scheduler's connector keeps its parsed options until the interpreter exits, reachable
    from threads that still run then (LMCache's): they must hold no native hsstore object, which
    nanobind reports as leaked at exit (the P/D soak saw "leaked instance ... of type
    hsstore._hsstore.Config" at every P/D server's exit; a daemon thread stands in for LMCache's)."""
    script = ("import threading, time\n"
              "from hsstore.vllm.transfer import parse_options\n"
              "kept = parse_options({'listen': '127.0.0.1:7001', 'timeout_ms': 800})\n"
              "assert kept.serve and kept.settings['hidden_state_transfer'] == 'nixl'\n"
              "threading.Thread(target=lambda o=kept: time.sleep(600), daemon=True).start()\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "nanobind: leaked" not in run.stderr, run.stderr


@pytest.mark.parametrize("value, error, match", [
    ("prefill:5555", ValueError, "must be a dict"),
    ({}, ValueError, "needs 'listen'"),
    ({"producer": "h:1", "port": 1}, ValueError, r"unknown keys \['port'\]"),
    ({"producer": "no-port"}, ValueError, "'producer' must be 'host:port'"),
    ({"producer": "h:0"}, ValueError, "'producer' must be 'host:port'"),
    ({"producer": 5555}, ValueError, "'producer' must be 'host:port'"),
    ({"listen": "no-port"}, hsstore.ConfigError, "hidden_state_transfer_listen"),
    ({"producer": "h:1", "timeout_ms": 0}, hsstore.ConfigError, "hidden_state_transfer_timeout_ms"),
    ({"listen": "h:1", "backend": "U C X"}, hsstore.ConfigError, "hidden_state_transfer_backend"),
    ({"pull": False}, ValueError, "needs 'listen'"),
    ({"pull": "yes"}, ValueError, "'pull' must be true or false"),
])
def test_bad_values_fail_at_configuration_time_naming_the_key(value, error, match):
    with pytest.raises(error, match=match):
        parse_options(value)
    with pytest.raises(error, match=match):
        hsstore.vllm.HiddenStates(nixl=value)


def test_nixl_needs_lmcache_and_hsstores_store():
    with pytest.raises(ValueError, match="needs LMCache and hsstore's store.*store='lmcache'"):
        hsstore.vllm.HiddenStates(store="lmcache", nixl={"producer": "h:1"})
    with pytest.raises(ValueError, match="needs LMCache and hsstore's store.*lmcache=False"):
        hsstore.vllm.HiddenStates(lmcache=False, nixl={"producer": "h:1"})


def test_a_pull_is_bounded_below_lmcaches_lookup_timeout():
    # LMCache's lookup client abandons a lookup at lookup_timeout_ms (as no hit): a pull, which
    # that lookup waits for, gets half of it by default and may not be given more than all of it.
    assert pull_timeout_ms(parse_options({"producer": "h:1"}), 3000) == 1500
    assert pull_timeout_ms(parse_options({"producer": "h:1", "timeout_ms": 2999}), 3000) == 2999
    with pytest.raises(ValueError, match=r"timeout_ms \(3000\) must be below LMCache's "
                                         r"lookup_timeout_ms \(3000\)"):
        pull_timeout_ms(parse_options({"producer": "h:1", "timeout_ms": 3000}), 3000)


def test_the_producer_a_request_names():
    # kv_transfer_params, as a router sets them: "hsstore.producer", or NixlConnector's
    # remote_host with hsstore's port (the request's, else the configured producer's); None:
    # the configured producer. NixlConnector's remote_port is its side channel, never used.
    decode = parse_options({"producer": "prefill-a:5555", "producers": ["prefill-*:*"]})
    assert request_producer({"hsstore.producer": "prefill-b:6000"}, decode) == "prefill-b:6000"
    assert request_producer({"remote_host": "prefill-b", "remote_port": 1}, decode) == (
        "prefill-b:5555")
    assert request_producer({"remote_host": "prefill-b", "hsstore.producer_port": 6000},
                            decode) == "prefill-b:6000"
    assert request_producer({"do_remote_prefill": True}, decode) is None
    assert request_producer(None, decode) is None
    # No default producer: "pull": true; remote_host then needs the request's port.
    pull_only = parse_options({"pull": True, "producers": ["p:*"]})
    assert pull_only.pull and pull_only.producer is None and not pull_only.serve
    assert request_producer({"hsstore.producer": "p:1"}, pull_only) == "p:1"
    assert request_producer({"remote_host": "p"}, pull_only) is None
    # An engine that only serves, or has no hsstore.nixl, ignores the name.
    assert request_producer({"hsstore.producer": "p:1"}, parse_options({"listen": "h:1"})) is None
    assert request_producer({"hsstore.producer": "p:1"}, None) is None
