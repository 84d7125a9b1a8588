"""HiddenStateStore.store_batch / retrieve_batch_into: an engine step as one call. Results equal
the single calls in item order; a bad item names its index and nothing of the batch is done."""

import numpy as np
import pytest

import hsstore
from conftest import CHUNK, DIM, Fixture, rows


def step(fix, requests=6, layers=3):
    """requests x layers store items over prompts of 1..3 chunks (one token-id object each)."""
    prompts = [list(range(1000 * r, 1000 * r + (r % 3 + 1) * CHUNK + r % 2)) for r in range(requests)]
    for p in prompts:
        fix.mark_kv_present(fix.keys_for(p))
    items = []
    for layer in range(layers):
        for r, p in enumerate(prompts):
            items.append((p, rows(len(p), seed=10 * layer + r), layer))
    return prompts, items


def test_store_batch_equals_single_calls_and_restores_the_same_rows(fix):
    _, items = step(fix)
    items.append(items[0])  # already cached: 0 written
    single = Fixture()
    try:
        want = [single.store.store_hidden_states(t, h, layer_idx=layer) for t, h, layer in items]
        for t, _, _ in items:
            single.mark_kv_present(single.keys_for(t))
        assert fix.store.store_batch(items) == want
        assert want[-1] == 0 and want[0] == 1
        assert fix.store.num_entries() == single.store.num_entries()
        for t, h, layer in items:
            got = fix.store.retrieve_hidden_states(t, layer_idx=layer, like="numpy")
            cached = len(t) // CHUNK * CHUNK
            np.testing.assert_array_equal(got, h[:cached])
    finally:
        single.store.close()


def test_retrieve_batch_into_equals_single_calls(fix):
    prompts, items = step(fix)
    fix.store.store_batch(items)
    outs = [np.full((len(t), DIM), -1.0, dtype=np.float32) for t, _, _ in items]
    reads = [(t, out, layer, i % 2) for i, ((t, _, layer), out) in enumerate(zip(items, outs))]
    got_rows = fix.store.retrieve_batch_into(reads)
    for (t, h, layer), out, (_, _, _, row_begin), n in zip(items, outs, reads, got_rows):
        want = np.full_like(out, -1.0)
        assert fix.store.retrieve_hidden_states_into(t, want, layer_idx=layer, row_begin=row_begin) == n
        assert n == len(t) // CHUNK * CHUNK - row_begin
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(out[:n], h[row_begin : row_begin + n])


def test_retrieve_batch_into_asks_the_storage_manager_once_per_chunk_of_a_token_list(fix):
    """The layers of a request share KV's answers (a Python manager's contains() takes the GIL);
    single calls ask per item. Rows and the coupled eviction are those of the single calls."""
    prompts, items = step(fix, requests=4, layers=3)
    fix.store.store_batch(items)
    chunks = [len(p) // CHUNK for p in prompts]  # every chunk held: each read asks all of them
    fix.sm.present.discard(fix.keys_for(prompts[2])[0])  # request 2's KV is gone at chunk 0

    def reads():
        outs = [np.full((len(t), DIM), -1.0, dtype=np.float32) for t, _, _ in items]
        return outs, [(t, out, layer) for (t, _, layer), out in zip(items, outs)]

    outs, batch = reads()
    fix.sm.calls = 0
    got = fix.store.retrieve_batch_into(batch)
    # Request 2 stops at its first chunk; the others ask each chunk once for their three layers.
    assert fix.sm.calls == sum(c for r, c in enumerate(chunks) if r != 2) + 1
    assert fix.store.stats()["coupled_evictions"] == 1
    want_rows = [0 if r == 2 else c * CHUNK for _ in range(3) for r, c in enumerate(chunks)]
    assert got == want_rows
    for (t, h, _), out, n in zip(items, outs, got):
        np.testing.assert_array_equal(out[:n], h[:n])
        assert (out[n:] == -1.0).all()

    # The same reads as single calls: one question per chunk and item, the same rows.
    _, singles = reads()
    fix.sm.calls = 0
    assert [fix.store.retrieve_hidden_states_into(t, o, layer_idx=layer) for t, o, layer in singles] == got
    assert fix.sm.calls == 3 * (sum(c for r, c in enumerate(chunks) if r != 2) + 1)


def test_items_take_numpy_int32_tokens_kinds_and_offsets(fix):
    tokens = np.arange(3 * CHUNK, dtype=np.int32)
    fix.mark_kv_present(fix.keys_for(tokens.tolist()))
    full = rows(3 * CHUNK)
    written = fix.store.store_batch(
        [(tokens, full, 0, 0, "hidden"), (tokens, full[CHUNK:], 4, CHUNK, hsstore.ActivationKind.key)]
    )
    assert written == [3, 2]
    assert fix.store.has_chunk(fix.keys_for(tokens.tolist())[1], 4, kind="key")
    assert not fix.store.has_chunk(fix.keys_for(tokens.tolist())[0], 4, kind="key")
    out = np.zeros((3 * CHUNK, DIM), dtype=np.float32)
    assert fix.store.retrieve_batch_into([(tokens, out, 0, 0, "hidden")]) == [3 * CHUNK]
    np.testing.assert_array_equal(out, full)


@pytest.mark.parametrize(
    "bad, where",
    [
        ((list(range(CHUNK)),), "items[1]: must be a tuple"),
        ((list(range(CHUNK)), rows(CHUNK), 0, 0, "hidden", 7), "items[1]: must be a tuple"),
        ((list(range(CHUNK)), rows(CHUNK - 1)), "items[1]: "),  # row count
        ((list(range(CHUNK)), rows(CHUNK), "zero"), "items[1]: layer_idx"),
        ((list(range(CHUNK)), rows(CHUNK), 0, 0, "attention"), "items[1]: kind"),
        (([1.5] * CHUNK, rows(CHUNK)), "items[1]: token_ids"),
        ((list(range(CHUNK)), "not a tensor"), "items[1]: hidden_states"),
    ],
)
def test_a_bad_store_item_names_its_index_and_stores_nothing(fix, bad, where):
    good = (list(range(100, 100 + CHUNK)), rows(CHUNK))
    before = fix.store.stats()
    with pytest.raises(hsstore.InvalidArgument, match=where.replace("[", r"\[").replace("]", r"\]")):
        fix.store.store_batch([good, bad])
    assert fix.store.stats() == before
    assert fix.store.num_entries() == 0
    assert fix.roundtrip_ok()


def test_a_bad_retrieve_item_names_its_index_and_writes_nothing(fix):
    _, items = step(fix, requests=2, layers=1)
    fix.store.store_batch(items)
    outs = [np.zeros((len(t), DIM), dtype=np.float32) for t, _, _ in items]
    small = np.zeros((1, DIM), dtype=np.float32)
    before = fix.store.stats()
    with pytest.raises(ValueError, match=r"items\[1\]: out.rows"):
        fix.store.retrieve_batch_into([(items[0][0], outs[0]), (items[1][0], small)])
    with pytest.raises(ValueError, match=r"items\[0\]: out"):
        fix.store.retrieve_batch_into([(items[0][0], "nope")])
    assert fix.store.stats() == before
    assert not outs[0].any()
    with pytest.raises(ValueError, match="items must be a list"):
        fix.store.retrieve_batch_into(42)
    assert fix.store.store_batch([]) == [] and fix.store.retrieve_batch_into([]) == []
