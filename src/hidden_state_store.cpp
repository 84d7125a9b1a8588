#include "hss/hidden_state_store.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "block_pool.hpp"
#include "cuda_runtime.hpp"
#include "data_path.hpp"
#include "hss/error.hpp"
#include "log.hpp"
#include "nvtx.hpp"
#include "store_index.hpp"

namespace hss {

using detail::EntryRef;
using kernels::ElemType;

namespace {

// Evictions tried per chunk before a store gives up on it (LMCache retries a bounded number too).
constexpr int kMaxEvictionsPerChunk = 64;

ElemType to_elem(DType dtype) { return static_cast<ElemType>(static_cast<int>(dtype)); }

std::string describe(int64_t value) { return std::to_string(value); }

void check_view(const TensorView& view, const char* name) {
  if (view.dtype != DType::kFloat32 && view.dtype != DType::kFloat16 &&
      view.dtype != DType::kBFloat16) {
    throw InvalidArgument(std::string(name) + ".dtype has an unknown value " +
                          describe(static_cast<int>(view.dtype)));
  }
  if (view.rows < 0)
    throw InvalidArgument(std::string(name) + ".rows = " + describe(view.rows) + " is negative");
  if (view.cols <= 0) {
    throw InvalidArgument(std::string(name) + ".cols = " + describe(view.cols) +
                          ": hidden states must be 2-D with at least one column");
  }
  if (view.row_stride != 0 && view.row_stride < view.cols) {
    throw InvalidArgument(std::string(name) + ".row_stride = " + describe(view.row_stride) +
                          " is smaller than cols = " + describe(view.cols));
  }
  if (view.rows > 0 && view.data == nullptr) {
    throw InvalidArgument(std::string(name) + ".data is null with rows = " + describe(view.rows));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

class HiddenStateStore::Impl {
 public:
  Impl(const Config& config, const TokenDatabase& token_database)
      : config_(config),
        token_database_(token_database),
        device_path_(detail::DevicePath::create(config)),
        pool_(checked_pool_bytes(config), /*try_pinned=*/true, /*prefault=*/true) {
    if (config.hidden_state_block_bytes > 0) {
      (void)pool_.ensure_block_bytes(static_cast<uint64_t>(config.hidden_state_block_bytes));
    }
  }

  ~Impl() {
    try {
      close();
    } catch (...) {  // a destructor must not throw; close() only fails on a broken device
    }
  }

  static uint64_t checked_pool_bytes(const Config& config) {
    if (!(config.max_hidden_state_cpu_size > 0)) {
      throw ConfigError("max_hidden_state_cpu_size must be > 0 for the hidden-state store, got " +
                        std::to_string(config.max_hidden_state_cpu_size));
    }
    const uint64_t bytes = config.hidden_state_pool_bytes();
    if (bytes < 16) {
      throw ConfigError(
          "max_hidden_state_cpu_size = " + std::to_string(config.max_hidden_state_cpu_size) +
          " GiB is smaller than one 16-byte block");
    }
    return bytes;
  }

  void bind(const StorageManager* manager) { storage_manager_.store(manager); }

  template <typename Token>
  int64_t store(std::span<const Token> token_ids, const TensorView& hidden,
                const StoreOptions& opt);

  struct Walk {
    std::vector<Chunk> chunks;
    std::vector<std::vector<EntryRef>> pinned;  // [chunk][layer]
    int64_t hit_chunks = 0;
    int64_t prefix_tokens = 0;
  };
  template <typename Token>
  Walk walk(std::span<const Token> token_ids, std::span<const int64_t> layers);

  template <typename Token>
  std::optional<HostTensor> retrieve(std::span<const Token> token_ids, const RetrieveOptions& opt);
  template <typename Token>
  int64_t retrieve_into(std::span<const Token> token_ids, const MutableTensorView& out,
                        const RetrieveOptions& opt);
  template <typename Token>
  std::vector<HostTensor> retrieve_layers(std::span<const Token> token_ids,
                                          std::span<const int64_t> layers, int64_t row_begin);

  int64_t coverage(std::span<const Chunk> chunks, std::span<const int64_t> layers) const;
  size_t num_cached_chunks() const {
    std::lock_guard lock(mutex_);
    return index_.ready_entries();
  }
  bool has_chunk(const CacheEngineKey& key, int64_t layer) const;
  bool drop_key(const CacheEngineKey& key);
  void flush() {
    if (device_path_) device_path_->flush();
  }
  void close();
  HiddenStateStats stats() const;

 private:
  void check_open() const {
    if (closed_.load(std::memory_order_acquire)) throw Error("HiddenStateStore is closed");
  }
  /// Rows [row_begin, prefix end) of layer `layer_pos` of a walk as gather segments.
  std::vector<kernels::GatherSegment> plan_restore(const Walk& w, size_t layer_pos,
                                                   int64_t row_begin) const;
  /// Drops the walk's chunks from `from` on when a copy into them failed; returns the new hit
  /// count.
  int64_t wait_for_copies(Walk& w);
  /// Evicts one LRU key for pool pressure. False when nothing can be evicted.
  bool evict_one(std::vector<EntryRef>& graveyard);
  int64_t common_cols(const Walk& w, size_t layer_pos) const;

  const Config config_;
  const TokenDatabase& token_database_;
  std::unique_ptr<detail::DevicePath> device_path_;
  detail::BlockPool pool_;
  std::atomic<const StorageManager*> storage_manager_{nullptr};
  std::atomic<bool> closed_{false};

  mutable std::mutex mutex_;  // guards index_ and Entry::ready
  detail::StoreIndex index_;

  struct Counters {
    std::atomic<uint64_t> stores{0}, chunks_written{0}, retrieves{0}, hit_tokens{0}, miss_tokens{0},
        hs_evictions{0}, coupled_evictions{0}, allocation_failures{0};
  };
  mutable Counters counters_;
};

// ---------------------------------------------------------------------------------------------
// store

template <typename Token>
int64_t HiddenStateStore::Impl::store(std::span<const Token> token_ids, const TensorView& hidden,
                                      const StoreOptions& opt) {
  HSS_RANGE("store");
  check_open();
  const auto n = static_cast<int64_t>(token_ids.size());
  if (opt.token_offset < 0 || opt.token_offset > n) {
    throw InvalidArgument("token_offset = " + describe(opt.token_offset) + " is outside [0, " +
                          describe(n) + "] (len(token_ids))");
  }
  check_view(hidden, "hidden_states");
  if (hidden.rows != n - opt.token_offset) {
    throw InvalidArgument(
        "hidden_states.rows = " + describe(hidden.rows) +
        " must equal len(token_ids) - token_offset = " + describe(n - opt.token_offset));
  }
  const bool on_device = hidden.device == Device::kCuda;
  if (on_device && !device_path_) {
    throw InvalidArgument(
        "hidden_states.device = cuda but no CUDA device is usable in this process");
  }
  std::vector<Chunk> chunks;
  {
    HSS_RANGE("store/keys");
    chunks = token_database_.process_tokens(token_ids);  // validates the token ids
  }
  counters_.stores.fetch_add(1, std::memory_order_relaxed);
  if (!config_.layer_allowed(opt.layer_idx)) return 0;

  const ElemType storage = (config_.hidden_state_storage_dtype == StorageDType::kNative &&
                            hidden.dtype != DType::kFloat32)
                               ? to_elem(hidden.dtype)
                               : ElemType::kFloat32;
  const auto esize = static_cast<int64_t>(kernels::elem_bytes(storage));
  const uint64_t block_bytes = pool_.ensure_block_bytes(
      static_cast<uint64_t>(token_database_.chunk_size() * hidden.cols * esize));

  // Phase 1, under the lock: reserve entries (PENDING) for the chunks not yet cached.
  struct Write {
    const Chunk* chunk;
    EntryRef entry;
  };
  std::vector<Write> writes;
  std::vector<EntryRef> graveyard;  // destroyed after the lock is released
  int64_t cached = 0;
  {
    HSS_RANGE("store/alloc");
    std::lock_guard lock(mutex_);
    for (const Chunk& chunk : chunks) {
      if (chunk.start < opt.token_offset) continue;  // chunks stay atomic with KV boundaries
      if (detail::KeyRecord* record = index_.find(chunk.key);
          record && record->find(opt.layer_idx)) {
        index_.touch(*record);
        ++cached;
        continue;
      }
      auto entry = std::make_shared<detail::Entry>(pool_, chunk.size(), hidden.cols, storage);
      const size_t need =
          pool_.blocks_for(static_cast<uint64_t>(chunk.size() * hidden.cols * esize));
      bool ok = need <= pool_.num_blocks() && pool_.allocate(need, entry->blocks);
      for (int attempt = 0; !ok && need <= pool_.num_blocks() && attempt < kMaxEvictionsPerChunk;
           ++attempt) {
        if (!evict_one(graveyard)) break;
        ok = pool_.allocate(need, entry->blocks);
      }
      if (!ok) {
        counters_.allocation_failures.fetch_add(1, std::memory_order_relaxed);
        break;  // stop at this chunk: the prefix stays contiguous
      }
      detail::KeyRecord& record = index_.find_or_insert(chunk.key);
      index_.touch(record);
      record.layers.emplace_back(opt.layer_idx, entry);
      writes.push_back({&chunk, std::move(entry)});
      ++cached;
    }
  }
  graveyard.clear();
  if (writes.empty()) return cached;

  // Phase 2, no lock: move the rows into the reserved blocks.
  std::vector<kernels::WriteSegment> segments;
  for (const Write& w : writes) {
    const int64_t src_row0 = w.chunk->start - opt.token_offset;
    kernels::for_each_block_piece(
        0, w.chunk->size() * hidden.cols, esize, static_cast<int64_t>(block_bytes),
        [&](int64_t block, int64_t byte_offset, int64_t first, int64_t count) {
          segments.push_back(
              {pool_.block_address(w.entry->blocks[static_cast<size_t>(block)]) + byte_offset,
               src_row0, first, count, storage});
        });
  }
  const kernels::SourceView source{hidden.data, to_elem(hidden.dtype), hidden.cols,
                                   hidden.stride()};
  std::shared_ptr<detail::CopyFence> fence;
  try {
    if (on_device) {
      fence = device_path_->store(source, hidden.device_index, segments,
                                   static_cast<Stream>(opt.stream));
    } else {
      HSS_RANGE("store/gather_cast");
      detail::host_store(source, segments);
    }
  } catch (...) {
    // Nothing that was never filled may stay visible: withdraw this call's reservations.
    std::lock_guard lock(mutex_);
    for (const Write& w : writes) {
      if (detail::KeyRecord* record = index_.find(w.chunk->key)) {
        std::erase_if(record->layers, [&](const auto& l) { return l.second == w.entry; });
        if (record->layers.empty()) (void)index_.erase(w.chunk->key, graveyard);
      }
    }
    throw;
  }

  // Phase 3: publish. An entry dropped meanwhile (drop_key, close) stays detached.
  {
    std::lock_guard lock(mutex_);
    for (Write& w : writes) {
      w.entry->fence = fence;
      if (detail::KeyRecord* record = index_.find(w.chunk->key)) {
        if (EntryRef* held = record->find(opt.layer_idx); held && *held == w.entry) {
          w.entry->ready = true;
          index_.account_publish(*w.entry);
        }
      }
    }
  }
  counters_.chunks_written.fetch_add(writes.size(), std::memory_order_relaxed);
  return cached;
}

bool HiddenStateStore::Impl::evict_one(std::vector<EntryRef>& graveyard) {
  HSS_RANGE("evict");
  const CacheEngineKey* victim = index_.eviction_candidate();
  if (victim == nullptr) return false;
  const CacheEngineKey key = *victim;  // erase invalidates the pointer
  (void)index_.erase(key, graveyard);
  counters_.hs_evictions.fetch_add(1, std::memory_order_relaxed);
  // Blocks return to the pool when an entry dies: unpinned ones die right here so the caller's
  // retry can use them; pinned ones when their reader lets go.
  std::erase_if(graveyard, [](const EntryRef& entry) { return entry.use_count() == 1; });
  return true;
}

// ---------------------------------------------------------------------------------------------
// retrieve

template <typename Token>
HiddenStateStore::Impl::Walk HiddenStateStore::Impl::walk(std::span<const Token> token_ids,
                                                          std::span<const int64_t> layers) {
  HSS_RANGE("retrieve/walk");
  Walk w;
  w.chunks = token_database_.process_tokens(token_ids);
  {
    std::lock_guard lock(mutex_);
    for (const Chunk& chunk : w.chunks) {
      detail::KeyRecord* record = index_.find(chunk.key);
      if (record == nullptr) break;
      std::vector<EntryRef> row;
      row.reserve(layers.size());
      for (int64_t layer : layers) {
        EntryRef* entry = record->find(layer);
        if (entry == nullptr || !(*entry)->ready || (*entry)->rows != chunk.size()) break;
        // A hidden dim that changes part-way (a caller bug) ends the prefix there.
        if (!w.pinned.empty() && (*entry)->cols != w.pinned.front()[row.size()]->cols) break;
        row.push_back(*entry);
      }
      if (row.size() != layers.size()) break;
      w.pinned.push_back(std::move(row));
    }
  }
  // KV check outside the lock: contains() takes the KV backend's own lock.
  int64_t hits = static_cast<int64_t>(w.pinned.size());
  std::optional<size_t> orphan;
  if (const StorageManager* kv = storage_manager_.load(std::memory_order_acquire)) {
    for (int64_t i = 0; i < hits; ++i) {
      if (!kv->contains(w.chunks[static_cast<size_t>(i)].key)) {
        orphan = static_cast<size_t>(i);
        hits = i;
        break;
      }
    }
  }
  std::vector<EntryRef> graveyard;
  {
    std::lock_guard lock(mutex_);
    if (orphan) {
      // KV evicted => hidden states evicted (all layers of the key).
      if (index_.erase(w.chunks[*orphan].key, graveyard) > 0) {
        counters_.coupled_evictions.fetch_add(1, std::memory_order_relaxed);
      }
    }
    // Reverse order: chunk 0 ends most recent, so pressure evicts the suffix first.
    for (int64_t i = hits - 1; i >= 0; --i) {
      if (detail::KeyRecord* record = index_.find(w.chunks[static_cast<size_t>(i)].key)) {
        index_.touch(*record);
      }
    }
  }
  w.pinned.resize(static_cast<size_t>(hits));
  w.hit_chunks = hits;
  graveyard.clear();
  hits = wait_for_copies(w);
  w.prefix_tokens = hits > 0 ? w.chunks[static_cast<size_t>(hits - 1)].end : 0;
  counters_.retrieves.fetch_add(1, std::memory_order_relaxed);
  counters_.hit_tokens.fetch_add(static_cast<uint64_t>(w.prefix_tokens), std::memory_order_relaxed);
  counters_.miss_tokens.fetch_add(token_ids.size() - static_cast<uint64_t>(w.prefix_tokens),
                                  std::memory_order_relaxed);
  return w;
}

int64_t HiddenStateStore::Impl::wait_for_copies(Walk& w) {
  for (int64_t i = 0; i < w.hit_chunks; ++i) {
    for (const EntryRef& entry : w.pinned[static_cast<size_t>(i)]) {
      if (entry->fence && !entry->fence->wait()) {
        detail::log(detail::LogLevel::kError,
                    "hidden-state copy failed, dropping chunk: " + entry->fence->error());
        std::vector<EntryRef> graveyard;
        {
          std::lock_guard lock(mutex_);
          (void)index_.erase(w.chunks[static_cast<size_t>(i)].key, graveyard);
        }
        w.hit_chunks = i;
        w.pinned.resize(static_cast<size_t>(i));
        return i;
      }
    }
  }
  return w.hit_chunks;
}

int64_t HiddenStateStore::Impl::common_cols(const Walk& w, size_t layer_pos) const {
  return w.pinned.empty() ? 0 : w.pinned.front()[layer_pos]->cols;
}

std::vector<kernels::GatherSegment> HiddenStateStore::Impl::plan_restore(const Walk& w,
                                                                         size_t layer_pos,
                                                                         int64_t row_begin) const {
  std::vector<kernels::GatherSegment> segments;
  const int64_t cols = common_cols(w, layer_pos);
  const auto block_bytes = static_cast<int64_t>(pool_.block_bytes());
  for (int64_t i = 0; i < w.hit_chunks; ++i) {
    const Chunk& chunk = w.chunks[static_cast<size_t>(i)];
    if (chunk.end <= row_begin) continue;
    const detail::Entry& entry = *w.pinned[static_cast<size_t>(i)][layer_pos];
    const int64_t first_row = std::max<int64_t>(0, row_begin - chunk.start);
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(entry.storage));
    kernels::for_each_block_piece(
        first_row * cols, (chunk.size() - first_row) * cols, esize, block_bytes,
        [&](int64_t block, int64_t byte_offset, int64_t first, int64_t count) {
          segments.push_back(
              {pool_.block_address(entry.blocks[static_cast<size_t>(block)]) + byte_offset,
               chunk.start * cols + first - row_begin * cols, count, entry.storage});
        });
  }
  return segments;
}

template <typename Token>
std::optional<HostTensor> HiddenStateStore::Impl::retrieve(std::span<const Token> token_ids,
                                                           const RetrieveOptions& opt) {
  const int64_t layer = opt.layer_idx;
  auto tensors = retrieve_layers(token_ids, std::span<const int64_t>(&layer, 1), opt.row_begin);
  if (tensors.empty()) return std::nullopt;
  return std::move(tensors.front());
}

template <typename Token>
std::vector<HostTensor> HiddenStateStore::Impl::retrieve_layers(std::span<const Token> token_ids,
                                                                std::span<const int64_t> layers,
                                                                int64_t row_begin) {
  HSS_RANGE("retrieve");
  check_open();
  if (row_begin < 0) throw InvalidArgument("row_begin = " + describe(row_begin) + " is negative");
  if (layers.empty()) throw InvalidArgument("layer_idxs is empty");
  const Walk w = walk(token_ids, layers);
  std::vector<HostTensor> out;
  if (row_begin >= w.prefix_tokens) return out;
  HSS_RANGE("retrieve/assemble");
  out.reserve(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t cols = common_cols(w, l);
    HostTensor tensor(w.prefix_tokens - row_begin, cols);
    detail::host_restore(plan_restore(w, l, row_begin), {tensor.data(), cols, cols});
    out.push_back(std::move(tensor));
  }
  return out;
}

template <typename Token>
int64_t HiddenStateStore::Impl::retrieve_into(std::span<const Token> token_ids,
                                              const MutableTensorView& out,
                                              const RetrieveOptions& opt) {
  HSS_RANGE("retrieve");
  check_open();
  if (opt.row_begin < 0) {
    throw InvalidArgument("row_begin = " + describe(opt.row_begin) + " is negative");
  }
  if (out.dtype != DType::kFloat32) {
    throw InvalidArgument("out.dtype = " + std::string(to_string(out.dtype)) +
                          ": retrieve_hidden_states_into writes float32");
  }
  check_view(out.as_const(), "out");
  if (out.device == Device::kCuda && !device_path_) {
    throw InvalidArgument("out.device = cuda but no CUDA device is usable in this process");
  }
  const int64_t layer = opt.layer_idx;
  Walk w = walk(token_ids, std::span<const int64_t>(&layer, 1));
  if (opt.row_begin >= w.prefix_tokens) return 0;
  const int64_t rows = w.prefix_tokens - opt.row_begin;
  const int64_t cols = common_cols(w, 0);
  if (out.cols != cols) {
    throw InvalidArgument("out.cols = " + describe(out.cols) + " but the cached hidden dim is " +
                          describe(cols));
  }
  if (out.rows < rows) {
    throw InvalidArgument("out.rows = " + describe(out.rows) + " is too small for the " +
                          describe(rows) + " rows of the cached prefix");
  }
  HSS_RANGE("retrieve/assemble");
  const kernels::OutputView view{static_cast<float*>(out.data), cols, out.stride()};
  if (out.device == Device::kCuda) {
    const auto segments = plan_restore(w, 0, opt.row_begin);
    auto pins = std::make_shared<std::vector<std::vector<EntryRef>>>(std::move(w.pinned));
    device_path_->restore(segments, view, out.device_index, static_cast<Stream>(opt.stream), {},
                          std::move(pins));
  } else {
    detail::host_restore(plan_restore(w, 0, opt.row_begin), view);
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------
// queries and maintenance

int64_t HiddenStateStore::Impl::coverage(std::span<const Chunk> chunks,
                                         std::span<const int64_t> layers) const {
  check_open();
  size_t present = 0;
  {
    std::lock_guard lock(mutex_);
    for (; present < chunks.size(); ++present) {
      const detail::KeyRecord* record = index_.find(chunks[present].key);
      if (record == nullptr) break;
      const bool all = std::all_of(layers.begin(), layers.end(), [&](int64_t layer) {
        for (const auto& [idx, entry] : record->layers) {
          if (idx == layer) return entry->ready;
        }
        return false;
      });
      if (!all) break;
    }
  }
  if (const StorageManager* kv = storage_manager_.load(std::memory_order_acquire)) {
    for (size_t i = 0; i < present; ++i) {
      if (!kv->contains(chunks[i].key)) {
        present = i;
        break;
      }
    }
  }
  return present == 0 ? 0 : chunks[present - 1].end;
}

bool HiddenStateStore::Impl::has_chunk(const CacheEngineKey& key, int64_t layer) const {
  std::lock_guard lock(mutex_);
  const detail::KeyRecord* record = index_.find(key);
  if (record == nullptr) return false;
  for (const auto& [idx, entry] : record->layers) {
    if (idx == layer) return entry->ready;
  }
  return false;
}

bool HiddenStateStore::Impl::drop_key(const CacheEngineKey& key) {
  check_open();
  std::vector<EntryRef> graveyard;
  std::lock_guard lock(mutex_);
  return index_.erase(key, graveyard) > 0;
}

void HiddenStateStore::Impl::close() {
  if (closed_.exchange(true)) return;
  flush();
  std::vector<EntryRef> graveyard;
  {
    std::lock_guard lock(mutex_);
    index_.clear(graveyard);
  }
}

HiddenStateStats HiddenStateStore::Impl::stats() const {
  HiddenStateStats s;
  {
    std::lock_guard lock(mutex_);
    s.chunks_held = index_.ready_entries();
    s.keys_held = index_.keys();
    s.bytes_held = index_.bytes_held();
    s.blocks_held = index_.blocks_held();
  }
  s.pool_capacity_bytes = pool_.capacity_bytes();
  s.block_bytes = pool_.block_bytes();
  s.pinned = pool_.pinned();
  s.device_path = device_path_ != nullptr;
  s.stores = counters_.stores.load();
  s.chunks_written = counters_.chunks_written.load();
  s.retrieves = counters_.retrieves.load();
  s.hit_tokens = counters_.hit_tokens.load();
  s.miss_tokens = counters_.miss_tokens.load();
  s.hs_evictions = counters_.hs_evictions.load();
  s.coupled_evictions = counters_.coupled_evictions.load();
  s.allocation_failures = counters_.allocation_failures.load();
  return s;
}

// ---------------------------------------------------------------------------------------------
// public surface

HiddenStateStore::HiddenStateStore(const Config& config, const TokenDatabase& token_database)
    : impl_(std::make_unique<Impl>(config, token_database)) {}
HiddenStateStore::~HiddenStateStore() = default;

void HiddenStateStore::bind_storage_manager(const StorageManager* m) { impl_->bind(m); }

int64_t HiddenStateStore::store_hidden_states(std::span<const int32_t> t, const TensorView& h,
                                              const StoreOptions& o) {
  return impl_->store(t, h, o);
}
int64_t HiddenStateStore::store_hidden_states(std::span<const int64_t> t, const TensorView& h,
                                              const StoreOptions& o) {
  return impl_->store(t, h, o);
}
std::optional<HostTensor> HiddenStateStore::retrieve_hidden_states(std::span<const int32_t> t,
                                                                   const RetrieveOptions& o) {
  return impl_->retrieve(t, o);
}
std::optional<HostTensor> HiddenStateStore::retrieve_hidden_states(std::span<const int64_t> t,
                                                                   const RetrieveOptions& o) {
  return impl_->retrieve(t, o);
}
int64_t HiddenStateStore::retrieve_hidden_states_into(std::span<const int32_t> t,
                                                      const MutableTensorView& out,
                                                      const RetrieveOptions& o) {
  return impl_->retrieve_into(t, out, o);
}
int64_t HiddenStateStore::retrieve_hidden_states_into(std::span<const int64_t> t,
                                                      const MutableTensorView& out,
                                                      const RetrieveOptions& o) {
  return impl_->retrieve_into(t, out, o);
}
std::vector<HostTensor> HiddenStateStore::retrieve_layers(std::span<const int32_t> t,
                                                          std::span<const int64_t> layers,
                                                          int64_t row_begin) {
  return impl_->retrieve_layers(t, layers, row_begin);
}
std::vector<HostTensor> HiddenStateStore::retrieve_layers(std::span<const int64_t> t,
                                                          std::span<const int64_t> layers,
                                                          int64_t row_begin) {
  return impl_->retrieve_layers(t, layers, row_begin);
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks,
                                   std::span<const int64_t> layers) const {
  return impl_->coverage(chunks, layers);
}
size_t HiddenStateStore::num_cached_chunks() const { return impl_->num_cached_chunks(); }
bool HiddenStateStore::has_chunk(const CacheEngineKey& key, int64_t layer) const {
  return impl_->has_chunk(key, layer);
}
bool HiddenStateStore::drop_key(const CacheEngineKey& key) { return impl_->drop_key(key); }
void HiddenStateStore::flush() { impl_->flush(); }
void HiddenStateStore::close() { impl_->close(); }
HiddenStateStats HiddenStateStore::stats() const { return impl_->stats(); }

}  // namespace hss
