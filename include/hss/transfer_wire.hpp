#pragma once
// The byte format of the pool transfer's two control messages (hss/pool_transfer.hpp), so any
// transport (hsstore.nixl's socket, a C++ transport) carries the same bytes:
//
//   pull request (consumer -> producer): magic "HSSQ", version u16, 0 u16,
//     first_chunk u32, lease_ms u32, chunk count u32, per chunk: start i64, end i64, key
//     (fmt, model_name, kv_dtype as u16 length + bytes; world_size i64, worker_id i64,
//     chunk_hash u64), slot count u32, per slot: kind u8, layer i64
//   export (producer -> consumer): magic "HSSE", version u16, 0 u16, lease_id u64,
//     first_chunk u32, chunks u32, prefix_tokens i64, lease_ms u32, entry count u32, per entry:
//     chunk u32, kind u8, layer i64, header (32 bytes), has_mac u8, [MAC (32 bytes)],
//     extent count u32, per extent: addr u64, bytes u64
//
// All integers little-endian. Decoding checks every length against the message and against
// limits (2^20 chunks, 4096 slots, 2^24 entries, 2^26 extents in all, 4 KiB strings): a malformed
// or truncated message is InvalidArgument("transfer message: ..."), never a crash or a huge
// allocation. The content is then checked again by the primitives (PoolTransfer::reserve).
// Pure functions: safe from any thread.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hss/activation.hpp"
#include "hss/cache_key.hpp"
#include "hss/pool_transfer.hpp"

namespace hss {

struct PullRequest {
  std::vector<Chunk> chunks;
  std::vector<Slot> slots;
  uint32_t first_chunk = 0;
  uint32_t lease_ms = 0;
};

[[nodiscard]] std::string encode_pull_request(const PullRequest& request);
[[nodiscard]] PullRequest decode_pull_request(std::span<const std::byte> bytes);

[[nodiscard]] std::string encode_export(const ChunkExport& source);
[[nodiscard]] ChunkExport decode_export(std::span<const std::byte> bytes);

}  // namespace hss
