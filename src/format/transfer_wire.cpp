#include "hss/transfer_wire.hpp"

#include <cstring>
#include <string_view>

#include "hss/error.hpp"

namespace hss {
namespace {

constexpr uint16_t kWireVersion = 1;
constexpr size_t kMaxChunks = size_t{1} << 20;
constexpr size_t kMaxSlots = 4096;
constexpr size_t kMaxEntries = size_t{1} << 24;
constexpr size_t kMaxExtents = size_t{1} << 26;
constexpr size_t kMaxString = 4096;

[[noreturn]] void malformed(const std::string& what) {
  throw InvalidArgument("transfer message: " + what);
}

class Writer {
 public:
  explicit Writer(std::string_view magic) {
    out_.append(magic);
    put<uint16_t>(kWireVersion);
    put<uint16_t>(0);
  }

  template <typename Int>
  void put(Int value) {
    using U = std::make_unsigned_t<Int>;
    auto bits = static_cast<U>(value);
    for (size_t i = 0; i < sizeof(U); ++i) {
      out_ += static_cast<char>(bits & 0xffU);
      bits = static_cast<U>(bits >> 8);
    }
  }
  void bytes(std::span<const std::byte> data) {
    out_.append(reinterpret_cast<const char*>(data.data()), data.size());
  }
  void str(const std::string& text) {
    if (text.size() > kMaxString)
      throw InvalidArgument("transfer message: a key string is over 4 KiB");
    put<uint16_t>(static_cast<uint16_t>(text.size()));
    out_ += text;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, std::string_view magic) : in_(in) {
    if (in_.size() < 8 || std::memcmp(in_.data(), magic.data(), 4) != 0) {
      malformed("not a " + std::string(magic) + " message");
    }
    at_ = 4;
    if (get<uint16_t>() != kWireVersion) malformed("unsupported version");
    (void)get<uint16_t>();
  }

  template <typename Int>
  Int get() {
    need(sizeof(Int));
    using U = std::make_unsigned_t<Int>;
    U bits = 0;
    for (size_t i = sizeof(U); i-- > 0;) {
      bits = static_cast<U>((bits << 8) | static_cast<U>(in_[at_ + i]));
    }
    at_ += sizeof(U);
    return static_cast<Int>(bits);
  }
  void bytes(std::span<std::byte> out) {
    need(out.size());
    std::memcpy(out.data(), in_.data() + at_, out.size());
    at_ += out.size();
  }
  std::string str() {
    const size_t n = get<uint16_t>();
    need(n);
    std::string text(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return text;
  }
  /// A count of items of at least `min_bytes` each, bounded by `limit` and by what is left.
  size_t count(size_t limit, size_t min_bytes, const char* what) {
    const size_t n = get<uint32_t>();
    if (n > limit || n * min_bytes > in_.size() - at_) {
      malformed(std::string(what) + " count " + std::to_string(n) +
                " is over the limit or the message");
    }
    return n;
  }
  void finish() const {
    if (at_ != in_.size()) malformed(std::to_string(in_.size() - at_) + " trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (n > in_.size() - at_) malformed("truncated");
  }
  std::span<const std::byte> in_;
  size_t at_ = 0;
};

Slot read_slot(Reader& r) {
  const auto kind = static_cast<ActivationKind>(r.get<uint8_t>());
  if (!is_valid(kind))
    malformed("unknown activation kind " + std::to_string(static_cast<int>(kind)));
  return {kind, r.get<int64_t>()};
}

}  // namespace

std::string encode_pull_request(const PullRequest& request) {
  Writer w("HSSQ");
  w.put<uint32_t>(request.first_chunk);
  w.put<uint32_t>(request.lease_ms);
  if (request.chunks.size() > kMaxChunks || request.slots.size() > kMaxSlots) {
    throw InvalidArgument("pull request: more than 2^20 chunks or 4096 slots");
  }
  w.put<uint32_t>(static_cast<uint32_t>(request.chunks.size()));
  for (const Chunk& c : request.chunks) {
    w.put<int64_t>(c.start);
    w.put<int64_t>(c.end);
    w.str(c.key.fmt);
    w.str(c.key.model_name);
    w.str(c.key.kv_dtype);
    w.put<int64_t>(c.key.world_size);
    w.put<int64_t>(c.key.worker_id);
    w.put<uint64_t>(c.key.chunk_hash);
  }
  w.put<uint32_t>(static_cast<uint32_t>(request.slots.size()));
  for (const Slot& s : request.slots) {
    w.put<uint8_t>(static_cast<uint8_t>(s.kind));
    w.put<int64_t>(s.layer_idx);
  }
  return w.take();
}

PullRequest decode_pull_request(std::span<const std::byte> bytes) {
  Reader r(bytes, "HSSQ");
  PullRequest q;
  q.first_chunk = r.get<uint32_t>();
  q.lease_ms = r.get<uint32_t>();
  const size_t chunks = r.count(kMaxChunks, 46, "chunk");
  q.chunks.reserve(chunks);
  for (size_t i = 0; i < chunks; ++i) {
    Chunk c;
    c.start = r.get<int64_t>();
    c.end = r.get<int64_t>();
    c.key.fmt = r.str();
    c.key.model_name = r.str();
    c.key.kv_dtype = r.str();
    c.key.world_size = r.get<int64_t>();
    c.key.worker_id = r.get<int64_t>();
    c.key.chunk_hash = r.get<uint64_t>();
    q.chunks.push_back(std::move(c));
  }
  const size_t slots = r.count(kMaxSlots, 9, "slot");
  for (size_t i = 0; i < slots; ++i) q.slots.push_back(read_slot(r));
  r.finish();
  return q;
}

std::string encode_export(const ChunkExport& source) {
  Writer w("HSSE");
  w.put<uint64_t>(source.lease_id);
  w.put<uint32_t>(source.first_chunk);
  w.put<uint32_t>(source.chunks);
  w.put<int64_t>(source.prefix_tokens);
  w.put<uint32_t>(source.lease_ms);
  w.put<uint32_t>(static_cast<uint32_t>(source.entries.size()));
  for (const ExportedEntry& e : source.entries) {
    w.put<uint32_t>(e.chunk);
    w.put<uint8_t>(static_cast<uint8_t>(e.slot.kind));
    w.put<int64_t>(e.slot.layer_idx);
    w.bytes(e.header);
    w.put<uint8_t>(e.mac ? 1 : 0);
    if (e.mac) w.bytes(*e.mac);
    w.put<uint32_t>(static_cast<uint32_t>(e.extents.size()));
    for (const Extent& x : e.extents) {
      w.put<uint64_t>(x.addr);
      w.put<uint64_t>(x.bytes);
    }
  }
  return w.take();
}

ChunkExport decode_export(std::span<const std::byte> bytes) {
  Reader r(bytes, "HSSE");
  ChunkExport x;
  x.lease_id = r.get<uint64_t>();
  x.first_chunk = r.get<uint32_t>();
  x.chunks = r.get<uint32_t>();
  x.prefix_tokens = r.get<int64_t>();
  x.lease_ms = r.get<uint32_t>();
  const size_t entries = r.count(kMaxEntries, 50, "entry");
  x.entries.reserve(entries);
  size_t extents_total = 0;
  for (size_t i = 0; i < entries; ++i) {
    ExportedEntry e;
    e.chunk = r.get<uint32_t>();
    e.slot = read_slot(r);
    r.bytes(e.header);
    const auto has_mac = r.get<uint8_t>();
    if (has_mac > 1) malformed("bad MAC flag");
    if (has_mac == 1) {
      e.mac.emplace();
      r.bytes(*e.mac);
    }
    const size_t extents = r.count(kMaxExtents - extents_total, 16, "extent");
    extents_total += extents;
    e.extents.reserve(extents);
    for (size_t k = 0; k < extents; ++k) {
      const uint64_t addr = r.get<uint64_t>();
      e.extents.push_back({addr, r.get<uint64_t>()});
    }
    x.entries.push_back(std::move(e));
  }
  r.finish();
  return x;
}

}  // namespace hss
