// libFuzzer target: the pool transfer's control messages (hss/transfer_wire.hpp) as a network
// peer sends them, and what the store does with what they decode to.
//
// The first byte picks the message; the rest is it:
//   * even: a pull request (what a consumer sends a producer). decode_pull_request either throws
//     InvalidArgument or decodes to a request whose re-encoding is stable; then export_chunks on
//     a producer holding 4 chunks of 2 layers, under small transfer bounds (4 chunks, 6 entries'
//     bytes per lease, 3 leases): it leases, or refuses with InvalidArgument / hss::Error;
//   * odd: an export (what a producer answers). decode_export likewise; then reserve() on a
//     consumer store for the same prompt: it reserves (then abandons) or throws InvalidArgument.
// After every input: no more leases than the bound, every lease released, check_invariants() on
// both stores, and the consumer holds nothing (abandoned reservations leave nothing behind).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "hss/transfer_wire.hpp"

namespace {

using namespace hss;
using fuzz::require;

constexpr int64_t kChunk = 4;
constexpr int64_t kCols = 4;
constexpr int64_t kChunks = 4;
constexpr uint64_t kEntryBytes = kChunk * kCols * 4;

class AllKv final : public StorageManager {
 public:
  bool contains(const CacheEngineKey&) const override { return true; }
};

Config side_config() {
  Config c;
  c.chunk_size = kChunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = static_cast<double>(kEntryBytes * 64) / static_cast<double>(1 << 30);
  c.hidden_state_transfer_max_chunks = kChunks;
  c.hidden_state_transfer_max_lease_bytes = static_cast<int64_t>(6 * kEntryBytes);
  c.hidden_state_transfer_max_leases = 3;
  return c;
}

struct Sides {
  Sides()
      : db(kChunk, false), producer(side_config(), db), consumer(side_config(), db),
        exporter(producer), importer(consumer) {
    producer.bind_storage_manager(&kv);
    consumer.bind_storage_manager(&kv);
    for (int32_t t = 0; t < kChunk * kChunks; ++t) tokens.push_back(t * 7 + 1);
    std::vector<float> rows(tokens.size() * kCols, 0.5f);
    for (const int64_t layer : {0, 1}) {
      const TensorView view{rows.data(), DType::kFloat32, static_cast<int64_t>(tokens.size()),
                            kCols};
      StoreOptions options;
      options.layer_idx = layer;
      (void)producer.store_hidden_states(tokens, view, options);
    }
    chunks = db.process_tokens(tokens);
  }
  AllKv kv;
  ChunkedTokenDatabase db;
  HiddenStateStore producer, consumer;
  PoolTransfer exporter, importer;
  std::vector<int32_t> tokens;
  std::vector<Chunk> chunks;
};

Sides& sides() {
  static Sides* s = new Sides();  // one pair of stores for the whole run (never destroyed)
  return *s;
}

void pull_request(std::span<const std::byte> bytes) {
  Sides& s = sides();
  PullRequest q;
  try {
    q = decode_pull_request(bytes);
  } catch (const InvalidArgument&) {
    return;  // the documented failure
  }
  const std::string once = encode_pull_request(q);
  const std::string twice = encode_pull_request(
      decode_pull_request(std::as_bytes(std::span(once.data(), once.size()))));
  require(once == twice, "a decoded pull request re-encodes differently");
  const auto lease = std::chrono::milliseconds(q.lease_ms == 0 ? 1000 : q.lease_ms);
  try {
    const ChunkExport e = s.exporter.export_chunks(q.chunks, q.slots, q.first_chunk, lease);
    uint64_t leased = 0;
    for (const ExportedEntry& x : e.entries) {
      for (const Extent& extent : x.extents) leased += extent.bytes;
    }
    require(leased <= 6 * kEntryBytes, "an export past hidden_state_transfer_max_lease_bytes");
    require(s.producer.stats().transfer.leases_held <= 3, "leases past the bound");
    if (e.lease_id != 0) (void)s.exporter.release_lease(e.lease_id);
  } catch (const Error&) {
    // InvalidArgument (a bad request) or a refused export: both documented.
  }
  require(s.producer.stats().transfer.leases_held == 0, "a lease outlived its input");
}

void export_message(std::span<const std::byte> bytes) {
  Sides& s = sides();
  ChunkExport x;
  try {
    x = decode_export(bytes);
  } catch (const InvalidArgument&) {
    return;
  }
  const std::string once = encode_export(x);
  const std::string twice =
      encode_export(decode_export(std::as_bytes(std::span(once.data(), once.size()))));
  require(once == twice, "a decoded export re-encodes differently");
  try {
    Reservation r = s.importer.reserve(s.chunks, x);
    (void)transfer_pieces(x, r);
    r.abandon();
  } catch (const InvalidArgument&) {
  }
  require(s.consumer.num_entries() == 0, "an abandoned reservation left entries behind");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  if (data[0] % 2 == 0) {
    pull_request(bytes);
  } else {
    export_message(bytes);
  }
  sides().producer.check_invariants();
  sides().consumer.check_invariants();
  return 0;
}
