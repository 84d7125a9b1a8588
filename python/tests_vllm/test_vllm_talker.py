"""The thinker -> talker pipeline (issue 38 §2; python/demos/thinker_talker.py, `make demo-talker`)
in real vLLM engines: a talker engine (another model of the same width) takes the thinker's final
hidden states of the whole prompt as prompt_embeds. With hsstore, in both LMCache modes, a request
sharing 25%, 75% or 100% of a cached prompt's prefix hands the talker exactly what a cold run
hands it (both layers bit for bit), so the talker's tokens and their logprobs equal the cold run's.
With KV only (the counter-example), the thinker holds only the rows vLLM computed: the talker's
input is truncated by exactly the KV restored, and what it says then differs."""

import pathlib
import sys

import pytest
import torch

import engines

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "demos"))

import thinker_talker as tt  # noqa: E402
from lmcache_server import lmcache_server  # noqa: E402

PROMPT = 4 * tt.CHUNK
# Per request: (KV restored, hidden-state rows restored, rows computed). vLLM computes the last
# token of a fully cached prompt again; hsstore restores whole chunks, the last one included, and
# keeps the stored row (the one the prefix's own prefill computed).
EXPECTED = {"cold": (0, 0, PROMPT), "25% shared": (256, 256, 768),
            "75% shared": (768, 768, 256), "100% shared": (PROMPT - 1, PROMPT, 0)}


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    directory = engines.write_llama(tmp_path_factory.mktemp("talker"), seed=tt.TALKER_SEED)
    with tt.talker_engine(directory) as llm:
        yield llm


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with lmcache_server(tmp_path_factory.mktemp("lmcache-talker")) as s:
        yield s


@pytest.mark.parametrize("mode", tt.MODES)
def test_talker_gets_the_whole_prompt_and_says_what_a_cold_run_says(request, mode, tiny_model,
                                                                    talker):
    server = request.getfixturevalue("server") if mode == "mp" else None
    with tt.thinker_engine(tiny_model, mode, server=server) as (llm, capture):
        turns = tt.pipeline(llm, capture, talker, tt.prompts(1, PROMPT))
    assert [t.name for t in turns] == list(EXPECTED)
    for t in turns:
        th = t.thought
        assert (th.kv_restored, th.rows_restored, th.rows_computed) == EXPECTED[t.name], t.name
        assert th.whole and t.speech is not None, t.name
        for label in tt.LAYERS:  # restored + computed == a cold run's rows, bit for bit
            assert th.states[label].shape == (PROMPT, engines.TINY["hidden_size"])
            assert torch.equal(th.states[label], t.cold.states[label]), (t.name, label)
        assert t.speech == t.cold_speech, t.name  # tokens and their logprobs
        assert len(t.speech.tokens) == tt.TALKER_TOKENS
    # Control: the talker listens to its whole input (a different prompt, different speech).
    assert turns[1].cold_speech != turns[0].cold_speech


def test_kv_only_truncates_the_talkers_input_and_changes_what_it_says(tiny_model, talker):
    with tt.thinker_engine(tiny_model, "in-process", hidden_states=False) as (llm, capture):
        turns = tt.pipeline(llm, capture, talker, tt.prompts(2, PROMPT))
    assert turns[0].thought.whole and turns[0].same_as_cold  # cold: nothing cached yet
    for t in turns[1:]:
        th = t.thought
        kv_restored = EXPECTED[t.name][0]
        assert th.kv_restored == kv_restored, t.name
        # The hook sees only what vLLM computed: the rows behind the KV hit are missing.
        assert th.rows_held == PROMPT - kv_restored and not th.whole and t.speech is None
        # What the store prevents: the tail alone, handed on, is not the prompt the talker
        # should have heard.
        assert tt.truncated_speech(talker, t) != t.cold_speech, t.name
