"""The thinker -> talker pipeline in real vLLM engines: the job hidden states are cached for.

A thinker (a vLLM engine, the tiny test Llama) reads a prompt; a talker (a second vLLM engine, a
different model of the same hidden width) takes the thinker's final hidden states of the *whole*
prompt as its input (vLLM's ``prompt_embeds``) and speaks. When the thinker's KV for a prefix comes
back from LMCache, vLLM does not compute that prefix, so no forward hook sees its hidden states:
hsstore restores them beside the KV, and the talker gets the whole prompt.

For each LMCache mode (in-process ``LMCacheConnectorV1``, and multi-process against an ``lmcache
server`` started for the run), this runs a cold request, then requests sharing 25%, 75% and 100%
of its prefix, and prints per request the rows restored, the rows computed and whether the
talker's tokens (and their logprobs) equal those of a cold run of the same prompt (the thinker
recomputing everything). Then the counter-example, the same requests with KV only (LMCache alone,
a forward hook for the hidden states): the thinker holds only the computed tail, the talker gets a
truncated tensor, and the demo says so.

    make demo-talker
    scripts/vllm_venv --python python/demos/thinker_talker.py [--mode in-process|mp|both]

python/tests_vllm/test_vllm_talker.py asserts the same in ``make test-vllm``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import random
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests_vllm"))

import engines  # noqa: E402

LAYERS = [-1, 2]  # the final state (the talker's input) and decoder layer 2 (a probe's)
CHUNK = 256  # LMCache's chunk size (in-process and the server's)
STEP_TOKENS = 256  # prefill steps start at chunk boundaries: restored + computed == recompute, bit for bit
TALKER_SEED = 11  # the talker's weights (the thinker's: engines.MODEL_SEED)
TALKER_TOKENS = 8
SHARES = (0.25, 0.75, 1.0)
CPU_KV = "hsstore.vllm.testing:install_cpu_kv_connector"  # LMCache's KV copy on a CPU (tests only)
MODES = ("in-process", "mp")


# -- the talker ----------------------------------------------------------------------------------


@contextlib.contextmanager
def talker_engine(model_dir: pathlib.Path) -> Iterator[Any]:
    """A vLLM engine that takes prompt embeddings (no prefix cache: every call computes all), in
    an engine-core process of its own: vLLM's KV connector is one per process (the thinker's,
    in-process, would be the talker's too)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    engines.allow_engines_after_lmcache()
    from vllm import LLM

    llm = LLM(model=str(model_dir), skip_tokenizer_init=True,
              enforce_eager=True, dtype="float32", max_model_len=4096, seed=0,
              enable_prompt_embeds=True, enable_prefix_caching=False,
              distributed_executor_backend="uni")
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm


@dataclasses.dataclass(frozen=True)
class Speech:
    tokens: Tuple[int, ...]
    logprobs: Tuple[float, ...]  # of each token chosen: equal inputs give equal floats


def speak(talker: Any, embeds: Any) -> Speech:
    """The talker's greedy tokens for a [rows, hidden] tensor of the thinker's states."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=TALKER_TOKENS, temperature=0.0, detokenize=False,
                            logprobs=0)
    out = talker.generate([{"prompt_embeds": embeds}], params, use_tqdm=False)[0].outputs[0]
    chosen = [next(iter(step.values())).logprob for step in out.logprobs]
    return Speech(tuple(out.token_ids), tuple(chosen))


# -- the thinker, with hsstore or with KV only ---------------------------------------------------


@dataclasses.dataclass
class Thought:
    """What the thinker hands on for one prompt: per label, its rows [first_row, prompt_len)."""
    states: Dict[int, Any]
    prompt_len: int
    kv_restored: int  # tokens vLLM did not compute (out.num_cached_tokens)
    rows_restored: int  # hidden-state rows restored from the cache
    rows_computed: int

    @property
    def rows_held(self) -> int:
        return int(self.states[-1].shape[0])

    @property
    def whole(self) -> bool:
        return self.rows_held == self.prompt_len


class KVOnly:
    """The counter-example: LMCache moves the KV, nothing caches hidden states; a forward hook on
    the model sees only the rows vLLM computes. Duck-types the parts of HiddenStates that
    engines.engine uses (llm_kwargs, install, shutdown). In-process engines only (the hook's
    rows are read in this process)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.rows: List[Tuple[List[int], Any]] = []  # per forward: (positions, final states)
        self._handle: Any = None

    def llm_kwargs(self, lmcache: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        from vllm.config import KVTransferConfig

        extra = {f"lmcache.{k}": v for k, v in (lmcache or {}).items()}
        if self.mode == "mp":
            name, module = "LMCacheMPConnector", "lmcache.integration.vllm.lmcache_mp_connector"
        else:
            name, module = "KVOnlyLMCacheConnector", "thinker_talker_kv_only"
        return {"kv_transfer_config": KVTransferConfig(
            kv_connector=name, kv_connector_module_path=module, kv_role="kv_both",
            kv_connector_extra_config=extra)}

    def install(self, llm: Any) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            raise RuntimeError("KVOnly: in-process engines only")
        model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        self._handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        # One copy per forward (a user's hook would do no less); rows are indexed at the end.
        self.rows.append((positions.tolist(), hidden[: positions.shape[0]].clone()))

    def shutdown(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def held_rows(capture: KVOnly, prompt_len: int) -> Any:
    """The final-state rows a KVOnly hook holds of the last prompt: [first computed, prompt_len)."""
    import torch

    by_position = {}
    for positions, hidden in capture.rows:
        for row, position in enumerate(positions):
            if position < prompt_len:
                by_position[position] = (hidden, row)
    positions = sorted(by_position)
    first = positions[0] if positions else prompt_len
    assert positions == list(range(first, prompt_len)), "the hook saw a gap"
    if not positions:
        return torch.empty(0, 0)
    return torch.stack([by_position[p][0][by_position[p][1]] for p in positions])


def think(llm: Any, capture: Any, prompt: List[int], *, cold: bool = False) -> Thought:
    """One prompt through the thinker (cold: no prefix reuse of any kind, the reference)."""
    if isinstance(capture, KVOnly):
        capture.rows.clear()
        out = engines.generate(llm, [prompt], skip_prefix_cache=cold)[0]
        held = held_rows(capture, len(prompt))
        return Thought({-1: held}, len(prompt), out.num_cached_tokens, 0, int(held.shape[0]))
    states, out, d = engines.run(llm, capture, prompt, skip_prefix_cache=cold)
    return Thought(states, len(prompt), out.num_cached_tokens, d["rows_restored"],
                   d["rows_computed"])


@contextlib.contextmanager
def thinker_engine(model_dir: pathlib.Path, mode: str, *, hidden_states: bool = True,
                   server: Any = None) -> Iterator[Tuple[Any, Any]]:
    """A thinker in LMCache `mode` ("in-process" or "mp", then against `server`): (llm, capture),
    capture an hsstore.vllm.HiddenStates (hidden_states) or a KVOnly hook."""
    import hsstore.vllm

    if mode == "mp":
        import hsstore.vllm.mp_connector  # noqa: F401 (LMCache imported before the worker starts)

        engines.allow_engines_after_lmcache()
        lmcache = {**server.client_config, "mp.heartbeat_interval": 2.0}
        capture = (hsstore.vllm.HiddenStates(layers=LAYERS, lmcache="mp") if hidden_states
                   else KVOnly(mode))
    else:
        lmcache = engines.lmcache_config(chunk_size=CHUNK,
                                         enable_hidden_state_cache=hidden_states)
        capture = (hsstore.vllm.HiddenStates(layers=LAYERS, worker_init=CPU_KV) if hidden_states
                   else KVOnly(mode))
    with engines.engine(model_dir, capture, lmcache=lmcache,
                        max_num_batched_tokens=STEP_TOKENS) as llm:
        yield llm, capture


# -- the run ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Turn:
    name: str
    thought: Thought
    cold: Thought
    speech: Optional[Speech]  # None when the talker was not given the whole prompt
    cold_speech: Speech

    @property
    def same_as_cold(self) -> bool:
        return self.speech == self.cold_speech


def prompts(seed: int, length: int) -> List[Tuple[str, List[int]]]:
    """A cold prompt, then prompts sharing 25%, 75% and 100% of it (fresh tails)."""
    rng = random.Random(seed)

    def fresh(n: int) -> List[int]:
        return [rng.randrange(3, 1000) for _ in range(n)]

    base = fresh(length)
    turns = [("cold", base)]
    for share in SHARES:
        shared = int(length * share)
        turns.append((f"{int(share * 100)}% shared", base[:shared] + fresh(length - shared)))
    return turns


def pipeline(thinker: Any, capture: Any, talker: Any,
             turns: Sequence[Tuple[str, List[int]]]) -> List[Turn]:
    """Each prompt through thinker -> talker, then again cold (after: a cold run stores too)."""
    results = []
    for name, prompt in turns:
        thought = think(thinker, capture, prompt)
        cold = think(thinker, capture, prompt, cold=True)
        assert cold.whole, "a cold run computes the whole prompt"
        speech = speak(talker, thought.states[-1]) if thought.whole else None
        results.append(Turn(name, thought, cold, speech, speak(talker, cold.states[-1])))
    return results


def truncated_speech(talker: Any, turn: Turn) -> Speech:
    """What a talker given only the rows the thinker holds would say (the failure the store
    prevents: a shorter input, silently)."""
    return speak(talker, turn.thought.states[-1])


def difference(turn: Turn) -> str:
    said, cold = turn.speech, turn.cold_speech
    if said.tokens != cold.tokens:
        return f"DIFFERENT tokens: {list(said.tokens)} vs {list(cold.tokens)}"
    worst = max(abs(a - b) for a, b in zip(said.logprobs, cold.logprobs))
    return f"DIFFERENT logprobs (same tokens): max |difference| {worst:.3g}"


def report(title: str, turns: Sequence[Turn], talker: Any) -> None:
    print(f"\n== {title}")
    print(f"{'request':<12} {'prompt':>6} {'KV restored':>11} {'HS restored':>11} "
          f"{'computed':>8} {'talker gets':>12}  talker vs cold run")
    for t in turns:
        th = t.thought
        held = f"{th.rows_held}/{th.prompt_len}"
        if t.speech is not None:
            verdict = "same tokens, same logprobs" if t.same_as_cold else difference(t)
        else:
            said = truncated_speech(talker, t)
            verdict = (f"TRUNCATED: {th.prompt_len - th.rows_held} rows missing (KV restored, "
                       f"no hidden states); on what it has the talker says "
                       f"{'the same' if said == t.cold_speech else 'something else'}")
        print(f"{t.name:<12} {th.prompt_len:>6} {th.kv_restored:>11} {th.rows_restored:>11} "
              f"{th.rows_computed:>8} {held:>12}  {verdict}")


def run_mode(mode: str, thinker_dir: pathlib.Path, talker: Any, length: int,
             server: Any = None) -> Tuple[List[Turn], List[Turn]]:
    with thinker_engine(thinker_dir, mode, server=server) as (llm, capture):
        with_store = pipeline(llm, capture, talker, prompts(1, length))
    # KV only: fresh prompts (an MP server still holds the first run's KV).
    with thinker_engine(thinker_dir, mode, hidden_states=False, server=server) as (llm, capture):
        kv_only = pipeline(llm, capture, talker, prompts(2, length))
    return with_store, kv_only


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--prompt", type=int, default=4 * CHUNK, help="tokens per prompt")
    args = parser.parse_args(argv)
    modes = MODES if args.mode == "both" else (args.mode,)
    failed = False
    with tempfile.TemporaryDirectory(prefix="hsstore-talker-") as tmp:
        root = pathlib.Path(tmp)
        thinker_dir = engines.write_llama(root / "thinker")
        talker_dir = engines.write_llama(root / "talker", seed=TALKER_SEED)  # same width
        with talker_engine(talker_dir) as talker:
            for mode in modes:
                server_cm = contextlib.nullcontext()
                if mode == "mp":
                    from lmcache_server import lmcache_server

                    server_cm = lmcache_server(root)
                with server_cm as server:
                    with_store, kv_only = run_mode(mode, thinker_dir, talker, args.prompt, server)
                label = "LMCache in-process" if mode == "in-process" else "LMCache MP server"
                report(f"{label} KV + hsstore hidden states", with_store, talker)
                report(f"{label} KV only (no hidden-state cache: the counter-example)", kv_only,
                       talker)
                failed |= not all(t.speech is not None and t.same_as_cold for t in with_store)
    print("\nwith hsstore every talker output equals the cold run's" if not failed
          else "\nFAILED: a talker output with hsstore differs from the cold run's")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
