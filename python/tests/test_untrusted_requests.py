"""A request's kv_transfer_params come from the HTTP client (vLLM's OpenAI server passes them
through): the producer a request names is pulled from only if the decode engine's allow-list has
it, a worker that does not pull connects nowhere for a request, and a pulling worker refuses to
start without a MAC key unless the network is declared trusted (hsstore.vllm.transfer;
docs/design.md, "Threat model"). No vLLM or NIXL needed: the options, the name check and the
worker's fill are plain Python."""

import logging

import pytest

import hsstore
from hsstore.vllm import transfer
from hsstore.vllm.transfer import REFUSED, HiddenStateTransfer, request_producer


@pytest.fixture
def parse(monkeypatch):
    # hsstore.Config({"hidden_state_transfer": "nixl"}) needs the nixl package; these tests are
    # about the connector's own keys only.
    monkeypatch.setattr(hsstore, "Config", lambda settings: None)
    return transfer.parse_options


def test_by_default_a_request_may_name_the_configured_producer_only(parse):
    decode = parse({"producer": "prefill-a:5555"})
    assert decode.producers == ("prefill-a:5555",)
    assert request_producer({"hsstore.producer": "prefill-a:5555"}, decode) == "prefill-a:5555"
    assert request_producer({"hsstore.producer": "attacker:6000"}, decode) == REFUSED
    assert request_producer({"remote_host": "attacker"}, decode) == REFUSED  # the default port
    assert request_producer({"remote_host": "prefill-a"}, decode) == "prefill-a:5555"
    assert request_producer({}, decode) is None  # none named: the configured one


def test_the_allow_list_takes_host_and_port_patterns(parse):
    decode = parse({"pull": True, "producers": ["prefill-*:5555", "10.0.0.?:*", "[::1]:7000"]})
    allowed = ["prefill-b:5555", "PREFILL-C:5555", "10.0.0.7:1234", "[::1]:7000"]
    refused = ["prefill-b:5556", "evil-prefill-b:5555", "10.0.0.77:1234", "10.0.0.7:0",
               "[::2]:7000", "no-port", "prefill-b:", ":5555", "prefill-b:99999"]
    for name in allowed:
        assert request_producer({"hsstore.producer": name}, decode) == name, name
    for name in refused:
        assert request_producer({"hsstore.producer": name}, decode) == REFUSED, name


def test_pull_without_a_producer_needs_an_allow_list_and_patterns_are_checked(parse):
    with pytest.raises(ValueError, match="'pull': true without a 'producer' needs 'producers'"):
        parse({"pull": True})
    for bad in (["no-port"], ["host:port"], "prefill:5555", [5555]):
        with pytest.raises(ValueError, match="'producers'"):
            parse({"pull": True, "producers": bad})
    with pytest.raises(ValueError, match="'trusted_network' must be true or false"):
        parse({"producer": "p:1", "trusted_network": "yes"})


def test_a_worker_that_does_not_pull_ignores_every_named_producer(parse):
    serving = parse({"listen": "0.0.0.0:5555"})
    assert not serving.pull and serving.producers == ()
    for params in ({"hsstore.producer": "attacker:6000"}, {"remote_host": "attacker",
                                                          "hsstore.producer_port": 6000}):
        assert request_producer(params, serving) is None


class _Store:
    """What fill() calls: counts the pulls it was asked for."""

    def __init__(self):
        self.pulled_from = []

    def pull(self, agent, producer, chunks, labels, timeout):
        self.pulled_from.append(producer)

        class Result:
            chunks_pulled, chunks_wanted, missed = len(chunks), len(chunks), ""
        return Result()


def _transfer(opts):
    """A HiddenStateTransfer without its NIXL agent (fill uses the store, options and counter)."""
    made = HiddenStateTransfer.__new__(HiddenStateTransfer)
    made.store, made.options, made.producer, made.timeout_s = _Store(), opts, opts.producer, 1.0
    made.agent = None
    made.counts = {}

    def count(**deltas):
        for name, delta in deltas.items():
            made.counts[name] = made.counts.get(name, 0) + delta
    made._count = count
    return made


def test_the_worker_never_connects_to_a_refused_name_or_for_a_serving_only_engine(parse):
    chunks = [(0, 256, "k0"), (256, 512, "k1")]
    serving = _transfer(parse({"listen": "0.0.0.0:5555"}))
    serving.fill(chunks, [-1], 512, "attacker:6000")  # what a client wrote into request configs
    assert serving.store.pulled_from == [] and serving.counts == {}

    decode = _transfer(parse({"producer": "prefill-a:5555"}))
    for name in (REFUSED, "attacker:6000"):
        decode.fill(chunks, [-1], 512, name)
    assert decode.store.pulled_from == [] and decode.counts == {"pulls_refused": 2}
    decode.fill(chunks, [-1], 512, None)  # no name: the configured producer
    assert decode.store.pulled_from == ["prefill-a:5555"]


def test_a_pulling_worker_needs_a_mac_key_unless_the_network_is_trusted(parse, tmp_path, caplog):
    no_mac = hsstore._hsstore.Config({})
    key_file = tmp_path / "mac.key"
    key_file.write_text("a MAC key of 32 bytes or so.....\n")
    with_mac = hsstore._hsstore.Config({"hidden_state_mac_key_file": str(key_file)})
    decode = parse({"producer": "prefill-a:5555"})
    with pytest.raises(ValueError, match="no MAC key .* \"trusted_network\": true"):
        transfer.check_authenticated_pulls(decode, no_mac)
    transfer.check_authenticated_pulls(decode, with_mac)
    trusted = parse({"producer": "prefill-a:5555", "trusted_network": True})
    with caplog.at_level(logging.WARNING, logger="hsstore.vllm"):
        transfer.check_authenticated_pulls(trusted, no_mac)
    assert "pulls without a MAC key" in caplog.text and "prefill-a:5555" in caplog.text

