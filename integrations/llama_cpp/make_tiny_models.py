#!/usr/bin/env python3
"""Writes the tiny random-weight GGUF models hss-llama and its tests load (no model can be
downloaded here). Build-time only: the engine's path (libllama, libhss_llama, hss-llama) runs no
Python.

    make_tiny_models.py [--bench] OUT_DIR

Writes, llama architecture, float32 weights, no tokenizer (tokenizer.ggml.model = "none",
LLAMA_VOCAB_TYPE_NONE: token ids go in directly; <arch>.vocab_size gives the id range):
  thinker.gguf       n_embd 64, 4 layers, vocab 256
  talker.gguf        n_embd 64, 2 layers, vocab 128 (the thinker's width: it reads its states)
  talker-w32.gguf    n_embd 32, 2 layers, vocab 128 (another width: a clear error, tested)
and with --bench also
  thinker-bench.gguf n_embd 256, 6 layers, vocab 256 (~20 MB: hss-llama --bench's thinker, for
                     docs/perf.md; the tests do not need it)
Seeded: the same bytes every run.
"""
import os
import sys

import gguf
import numpy as np


def write_model(path, *, n_embd, n_layer, n_vocab, n_head, n_head_kv, n_ff, seed):
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def weight(rows, cols):  # numpy (rows, cols) is ggml ne = [cols, rows]
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(os.path.splitext(os.path.basename(path))[0])
    writer.add_context_length(1024)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")

    # float32 times a numpy float64 is float64 under NumPy 2 (NEP 50): cast back, or llama.cpp
    # gets an f64 embedding table it cannot read.
    embedding = (weight(n_vocab, n_embd) * np.sqrt(n_embd)).astype(np.float32)
    writer.add_tensor("token_embd.weight", embedding)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_head * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_head * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    args = sys.argv[1:]
    bench = "--bench" in args
    args = [a for a in args if a != "--bench"]
    if len(args) != 1:
        sys.exit(__doc__)
    out = args[0]
    os.makedirs(out, exist_ok=True)
    write_model(os.path.join(out, "thinker.gguf"), n_embd=64, n_layer=4, n_vocab=256, n_head=4,
                n_head_kv=2, n_ff=128, seed=1)
    write_model(os.path.join(out, "talker.gguf"), n_embd=64, n_layer=2, n_vocab=128, n_head=4,
                n_head_kv=2, n_ff=128, seed=2)
    write_model(os.path.join(out, "talker-w32.gguf"), n_embd=32, n_layer=2, n_vocab=128,
                n_head=4, n_head_kv=2, n_ff=64, seed=3)
    if bench:
        write_model(os.path.join(out, "thinker-bench.gguf"), n_embd=256, n_layer=6, n_vocab=256,
                    n_head=8, n_head_kv=4, n_ff=768, seed=4)


if __name__ == "__main__":
    main()
