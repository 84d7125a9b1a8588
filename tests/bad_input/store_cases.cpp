// Bad-input cases of HiddenStateStore: every argument of every public method.
#include <limits>
#include <stdexcept>

#include "cases.hpp"

namespace hss::bad_input {
namespace {

constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
const auto kBadKind = static_cast<ActivationKind>(9);

// A store of fresh tokens (nothing of them cached) with one edit to the view or the options.
void store_case(std::vector<Case>& cases, const std::string& what,
                std::function<void(TensorView&, StoreOptions&)> edit) {
  cases.push_back({"HiddenStateStore::store_hidden_states(" + what + ")", Expect::kInvalidArgument,
                   [edit](World& w) {
                     std::vector<int32_t> tokens(2 * kChunk);
                     for (size_t i = 0; i < tokens.size(); ++i) {
                       tokens[i] = static_cast<int32_t>(i + 900);
                     }
                     std::vector<float> rows(tokens.size() * kCols, 1.0f);
                     TensorView view{rows.data(),
                                     DType::kFloat32,
                                     static_cast<int64_t>(tokens.size()),
                                     kCols,
                                     0,
                                     Device::kHost,
                                     0};
                     StoreOptions options;
                     edit(view, options);
                     (void)w.store().store_hidden_states(tokens, view, options);
                   }});
}

void store_chunks_case(std::vector<Case>& cases, const std::string& what,
                       std::function<void(std::vector<Chunk>&, TensorView&)> edit) {
  cases.push_back(
      {"HiddenStateStore::store_chunks(" + what + ")", Expect::kInvalidArgument, [edit](World& w) {
         std::vector<Chunk> chunks;
         for (int64_t c = 0; c < 2; ++c) {
           CacheEngineKey key;
           key.chunk_hash = static_cast<uint64_t>(7000 + c);
           chunks.push_back(Chunk{c * kChunk, (c + 1) * kChunk, key});
         }
         std::vector<float> rows(2 * kChunk * kCols, 1.0f);
         TensorView view{rows.data(), DType::kFloat32, 2 * kChunk, kCols, 0, Device::kHost, 0};
         edit(chunks, view);
         (void)w.store().store_chunks(chunks, view);
       }});
}

// retrieve_hidden_states_into the cached tokens with one edit to the output or the options.
void into_case(std::vector<Case>& cases, const std::string& what,
               std::function<void(MutableTensorView&, RetrieveOptions&)> edit) {
  cases.push_back({"HiddenStateStore::retrieve_hidden_states_into(" + what + ")",
                   Expect::kInvalidArgument, [edit](World& w) {
                     std::vector<float> out(w.tokens.size() * kCols, 0.0f);
                     MutableTensorView view{out.data(),
                                            DType::kFloat32,
                                            static_cast<int64_t>(w.tokens.size()),
                                            kCols,
                                            0,
                                            Device::kHost,
                                            0};
                     RetrieveOptions options;
                     edit(view, options);
                     (void)w.store().retrieve_hidden_states_into(w.tokens, view, options);
                   }});
}

std::vector<Chunk> chunks_of(World& w) {
  return w.engine->token_database().process_tokens(w.tokens);
}

}  // namespace

void add_store_cases(std::vector<Case>& cases) {
  // --- construction -----------------------------------------------------------------------------
  cases.push_back(
      {"HiddenStateStore(max_hidden_state_cpu_size = 0)", Expect::kConfigError, [](World& w) {
         Config c = w.config;
         c.max_hidden_state_cpu_size = 0;
         HiddenStateStore store(c, w.engine->token_database());
       }});
  cases.push_back(
      {"HiddenStateStore(hidden_state_block_bytes = 24)", Expect::kConfigError, [](World& w) {
         Config c = w.config;
         c.hidden_state_block_bytes = 24;
         HiddenStateStore store(c, w.engine->token_database());
       }});
  cases.push_back(
      {"HiddenStateStore(max_hidden_state_cpu_size = 2^33 GiB)", Expect::kError, [](World& w) {
         Config c = w.config;
         c.max_hidden_state_cpu_size = 8589934592.0;  // 2^63 bytes: no such memory
         HiddenStateStore store(c, w.engine->token_database());
       }});

  // --- store_hidden_states
  // ------------------------------------------------------------------------
  store_case(cases, "token_offset = -1", [](TensorView&, StoreOptions& o) { o.token_offset = -1; });
  store_case(cases, "token_offset > len", [](TensorView& v, StoreOptions& o) {
    o.token_offset = 33;
    v.rows = 0;
  });
  store_case(cases, "token_offset = 2^63-1",
             [](TensorView&, StoreOptions& o) { o.token_offset = kHuge; });
  store_case(cases, "rows != len - offset", [](TensorView& v, StoreOptions&) { v.rows -= 1; });
  store_case(cases, "rows = -1", [](TensorView& v, StoreOptions&) { v.rows = -1; });
  store_case(cases, "cols = 0", [](TensorView& v, StoreOptions&) { v.cols = 0; });
  store_case(cases, "cols = -32", [](TensorView& v, StoreOptions&) { v.cols = -32; });
  store_case(cases, "cols = 2^40", [](TensorView& v, StoreOptions&) { v.cols = int64_t{1} << 40; });
  store_case(cases, "row_stride < cols", [](TensorView& v, StoreOptions&) { v.row_stride = 5; });
  store_case(cases, "row_stride = -1", [](TensorView& v, StoreOptions&) { v.row_stride = -1; });
  store_case(cases, "row_stride = 2^62",
             [](TensorView& v, StoreOptions&) { v.row_stride = int64_t{1} << 62; });
  store_case(cases, "dtype = 9",
             [](TensorView& v, StoreOptions&) { v.dtype = static_cast<DType>(9); });
  store_case(cases, "device = 7",
             [](TensorView& v, StoreOptions&) { v.device = static_cast<Device>(7); });
  store_case(cases, "device_index = -3", [](TensorView& v, StoreOptions&) {
    v.device = Device::kCuda;
    v.device_index = -3;
  });
  store_case(cases, "data = null", [](TensorView& v, StoreOptions&) { v.data = nullptr; });
  store_case(cases, "kind = 9", [](TensorView&, StoreOptions& o) { o.kind = kBadKind; });
  cases.push_back({"HiddenStateStore::store_hidden_states(int32 token -1)",
                   Expect::kInvalidArgument, [](World& w) {
                     auto tokens = w.tokens;
                     tokens[40] = -1;
                     (void)w.store().store_hidden_states(tokens, w.rows_view());
                   }});
  cases.push_back({"HiddenStateStore::store_hidden_states(int64 token 2^32)",
                   Expect::kInvalidArgument, [](World& w) {
                     std::vector<int64_t> tokens(w.tokens.begin(), w.tokens.end());
                     tokens[63] = int64_t{1} << 32;
                     (void)w.store().store_hidden_states(tokens, w.rows_view());
                   }});
  // A re-store of cached chunks with a bad view is still a bad argument (validated first).
  cases.push_back({"HiddenStateStore::store_hidden_states(cached tokens, cols = 0)",
                   Expect::kInvalidArgument, [](World& w) {
                     TensorView v = w.rows_view();
                     v.cols = 0;
                     (void)w.store().store_hidden_states(w.tokens, v);
                   }});

  // --- store_chunks
  // -------------------------------------------------------------------------------
  store_chunks_case(cases, "empty chunk list, rows = 32",
                    [](std::vector<Chunk>& c, TensorView&) { c.clear(); });
  store_chunks_case(cases, "chunks[0].start = 4",
                    [](std::vector<Chunk>& c, TensorView&) { c[0].start = 4; });
  store_chunks_case(cases, "gap between chunks",
                    [](std::vector<Chunk>& c, TensorView&) { c[1].start += 1; });
  store_chunks_case(cases, "empty chunk",
                    [](std::vector<Chunk>& c, TensorView&) { c[1].end = c[1].start; });
  store_chunks_case(cases, "end < start",
                    [](std::vector<Chunk>& c, TensorView&) { c[1].end = c[1].start - 3; });
  store_chunks_case(cases, "end = 2^63-1",
                    [](std::vector<Chunk>& c, TensorView&) { c[1].end = kHuge; });
  store_chunks_case(cases, "rows != chunks end",
                    [](std::vector<Chunk>&, TensorView& v) { v.rows = 31; });
  store_chunks_case(cases, "dtype = 9",
                    [](std::vector<Chunk>&, TensorView& v) { v.dtype = static_cast<DType>(9); });

  // --- retrieve_hidden_states / retrieve_chunks -----------------------------------------------
  cases.push_back({"HiddenStateStore::retrieve_hidden_states(row_begin = -1)",
                   Expect::kInvalidArgument, [](World& w) {
                     (void)w.store().retrieve_hidden_states(w.tokens, {0, -1});
                   }});
  cases.push_back({"HiddenStateStore::retrieve_hidden_states(kind = 9)", Expect::kInvalidArgument,
                   [](World& w) {
                     RetrieveOptions o;
                     o.kind = kBadKind;
                     (void)w.store().retrieve_hidden_states(w.tokens, o);
                   }});
  cases.push_back({"HiddenStateStore::retrieve_hidden_states(token -1)", Expect::kInvalidArgument,
                   [](World& w) {
                     auto tokens = w.tokens;
                     tokens[10] = -1;
                     (void)w.store().retrieve_hidden_states(tokens);
                   }});
  cases.push_back(
      {"HiddenStateStore::retrieve_chunks(gap)", Expect::kInvalidArgument, [](World& w) {
         auto chunks = chunks_of(w);
         chunks[2].start += 1;
         (void)w.store().retrieve_chunks(chunks);
       }});
  cases.push_back(
      {"HiddenStateStore::retrieve_chunks(row_begin = -5)", Expect::kInvalidArgument, [](World& w) {
         (void)w.store().retrieve_chunks(chunks_of(w), {0, -5});
       }});

  // --- retrieve_*_into
  // ------------------------------------------------------------------------------
  into_case(cases, "cols = 16 (stored 32)",
            [](MutableTensorView& v, RetrieveOptions&) { v.cols = 16; });
  into_case(cases, "rows < prefix", [](MutableTensorView& v, RetrieveOptions&) { v.rows = 17; });
  into_case(cases, "dtype = 9",
            [](MutableTensorView& v, RetrieveOptions&) { v.dtype = static_cast<DType>(9); });
  into_case(cases, "device = 7",
            [](MutableTensorView& v, RetrieveOptions&) { v.device = static_cast<Device>(7); });
  into_case(cases, "data = null", [](MutableTensorView& v, RetrieveOptions&) { v.data = nullptr; });
  into_case(cases, "row_stride < cols",
            [](MutableTensorView& v, RetrieveOptions&) { v.row_stride = 7; });
  into_case(cases, "row_stride = 2^62",
            [](MutableTensorView& v, RetrieveOptions&) { v.row_stride = int64_t{1} << 62; });
  into_case(cases, "row_begin = -1",
            [](MutableTensorView&, RetrieveOptions& o) { o.row_begin = -1; });
  into_case(cases, "kind = 9", [](MutableTensorView&, RetrieveOptions& o) { o.kind = kBadKind; });
  cases.push_back(
      {"HiddenStateStore::retrieve_chunks_into(cols = 0)", Expect::kInvalidArgument, [](World& w) {
         std::vector<float> out(64 * kCols);
         (void)w.store().retrieve_chunks_into(
             chunks_of(w),
             MutableTensorView{out.data(), DType::kFloat32, 64, 0, 0, Device::kHost, 0});
       }});

  // --- retrieve_layers / coverage
  // -----------------------------------------------------------------
  cases.push_back(
      {"HiddenStateStore::retrieve_layers(layers = [])", Expect::kInvalidArgument,
       [](World& w) { (void)w.store().retrieve_layers(w.tokens, std::span<const int64_t>{}); }});
  cases.push_back(
      {"HiddenStateStore::retrieve_layers(slots = [])", Expect::kInvalidArgument,
       [](World& w) { (void)w.store().retrieve_layers(w.tokens, std::span<const Slot>{}); }});
  cases.push_back(
      {"HiddenStateStore::retrieve_layers(row_begin = -1)", Expect::kInvalidArgument, [](World& w) {
         const std::vector<int64_t> layers{0};
         (void)w.store().retrieve_layers(w.tokens, layers, -1);
       }});
  cases.push_back(
      {"HiddenStateStore::retrieve_layers(slot kind = 9)", Expect::kInvalidArgument, [](World& w) {
         const std::vector<Slot> slots{{ActivationKind::kHidden, 0}, {kBadKind, 0}};
         (void)w.store().retrieve_layers(w.tokens, slots);
       }});
  cases.push_back(
      {"HiddenStateStore::coverage(layers = [])", Expect::kInvalidArgument,
       [](World& w) { (void)w.store().coverage(chunks_of(w), std::span<const int64_t>{}); }});
  cases.push_back(
      {"HiddenStateStore::coverage(slot kind = 9)", Expect::kInvalidArgument, [](World& w) {
         const std::vector<Slot> slots{{kBadKind, 0}};
         (void)w.store().coverage(chunks_of(w), slots);
       }});
  cases.push_back(
      {"HiddenStateStore::coverage(gap in chunks)", Expect::kInvalidArgument, [](World& w) {
         auto chunks = chunks_of(w);
         chunks[1].start = 3;
         const std::vector<int64_t> layers{0};
         (void)w.store().coverage(chunks, layers);
       }});
  cases.push_back({"HiddenStateStore::has_chunk(kind = 9)", Expect::kInvalidArgument,
                   [](World& w) { (void)w.store().has_chunk(chunks_of(w)[0].key, 0, kBadKind); }});
  // --- batch calls and retrieve_layers_into -----------------------------------------------------
  // A batch with one bad item does nothing of the batch (InvalidArgument naming the item).
  const auto batch_store_case = [&cases](const std::string& what,
                                         std::function<void(StoreItem&)> edit) {
    cases.push_back({"HiddenStateStore::store_batch(items[1]: " + what + ")",
                     Expect::kInvalidArgument, [edit](World& w) {
                       std::vector<int64_t> fresh(2 * kChunk);
                       for (size_t i = 0; i < fresh.size(); ++i) {
                         fresh[i] = static_cast<int64_t>(i + 700);
                       }
                       std::vector<float> rows(fresh.size() * kCols, 2.0f);
                       const TensorView view{rows.data(),
                                             DType::kFloat32,
                                             static_cast<int64_t>(fresh.size()),
                                             kCols,
                                             0,
                                             Device::kHost,
                                             0};
                       std::vector<StoreItem> items{{fresh, view, {}}, {fresh, view, {}}};
                       items[1].options.layer_idx = 1;
                       edit(items[1]);
                       (void)w.store().store_batch(items);
                     }});
  };
  batch_store_case("token_offset = -1", [](StoreItem& i) { i.options.token_offset = -1; });
  batch_store_case("rows != len", [](StoreItem& i) { i.hidden_states.rows -= 1; });
  batch_store_case("cols = 0", [](StoreItem& i) { i.hidden_states.cols = 0; });
  batch_store_case("dtype = 9",
                   [](StoreItem& i) { i.hidden_states.dtype = static_cast<DType>(9); });
  batch_store_case("kind = 9", [](StoreItem& i) { i.options.kind = kBadKind; });
  batch_store_case("data = null", [](StoreItem& i) { i.hidden_states.data = nullptr; });

  const auto batch_retrieve_case = [&cases](const std::string& what,
                                            std::function<void(RetrieveItem&)> edit) {
    cases.push_back(
        {"HiddenStateStore::retrieve_batch_into(items[1]: " + what + ")", Expect::kInvalidArgument,
         [edit](World& w) {
           const std::vector<int64_t> tokens(w.tokens.begin(), w.tokens.end());
           std::vector<float> a(tokens.size() * kCols), b(tokens.size() * kCols);
           const auto rows = static_cast<int64_t>(tokens.size());
           std::vector<RetrieveItem> items{
               {tokens, {a.data(), DType::kFloat32, rows, kCols, 0, Device::kHost, 0}, {}},
               {tokens, {b.data(), DType::kFloat32, rows, kCols, 0, Device::kHost, 0}, {}}};
           edit(items[1]);
           (void)w.store().retrieve_batch_into(items);
         }});
  };
  batch_retrieve_case("out.cols = 16", [](RetrieveItem& i) { i.out.cols = 16; });
  batch_retrieve_case("out.rows < prefix", [](RetrieveItem& i) { i.out.rows = 10; });
  batch_retrieve_case("out.dtype = 9",
                      [](RetrieveItem& i) { i.out.dtype = static_cast<DType>(9); });
  batch_retrieve_case("row_begin = -1", [](RetrieveItem& i) { i.options.row_begin = -1; });
  batch_retrieve_case("kind = 9", [](RetrieveItem& i) { i.options.kind = kBadKind; });

  const auto layers_into_case =
      [&cases](const std::string& what,
               std::function<void(std::vector<Slot>&, std::vector<MutableTensorView>&,
                                  RetrieveLayersOptions&)>
                   edit) {
        cases.push_back({"HiddenStateStore::retrieve_layers_into(" + what + ")",
                         Expect::kInvalidArgument, [edit](World& w) {
                           std::vector<float> a(w.tokens.size() * kCols);
                           const auto rows = static_cast<int64_t>(w.tokens.size());
                           std::vector<Slot> slots{{ActivationKind::kHidden, 0}};
                           std::vector<MutableTensorView> outs{
                               {a.data(), DType::kFloat32, rows, kCols, 0, Device::kHost, 0}};
                           RetrieveLayersOptions options;
                           edit(slots, outs, options);
                           (void)w.store().retrieve_layers_into(w.tokens, slots, outs, options);
                         }});
      };
  layers_into_case("slots = [], outs = []", [](auto& slots, auto& outs, auto&) {
    slots.clear();
    outs.clear();
  });
  layers_into_case("outs shorter than slots", [](auto& slots, auto&, auto&) {
    slots.push_back({ActivationKind::kHidden, 0});
  });
  layers_into_case("out cols = 16", [](auto&, auto& outs, auto&) { outs[0].cols = 16; });
  layers_into_case("out rows < prefix", [](auto&, auto& outs, auto&) { outs[0].rows = 3; });
  layers_into_case("out data = null", [](auto&, auto& outs, auto&) { outs[0].data = nullptr; });
  layers_into_case("slot kind = 9", [](auto& slots, auto&, auto&) { slots[0].kind = kBadKind; });
  layers_into_case("row_begin = -1", [](auto&, auto&, auto& o) { o.row_begin = -1; });
}

}  // namespace hss::bad_input
