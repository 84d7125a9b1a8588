// Workload `mac`: what authenticating a remote value costs per byte. HMAC-SHA256 (the keyed MAC
// of both remote paths, src/format/value_mac.hpp) and xxHash3 (the checksum every value carries) over
// a 256 MiB payload in 64 KiB pool granules, against memcpy of the same bytes in the same run.
// The cost per GB is 1 / (GB/s): docs/perf.md sets it beside the transfer it protects.

#include <algorithm>
#include <array>
#include <memory>
#include <span>
#include <vector>

#include "common.hpp"
#include "format/value_codec.hpp"
#include "format/value_mac.hpp"

namespace hss::bench {
namespace {

constexpr size_t kGranule = size_t{64} << 10;

std::vector<std::span<const std::byte>> granules(const std::vector<float>& data) {
  std::vector<std::span<const std::byte>> pieces;
  const auto bytes = std::as_bytes(std::span(data));
  for (size_t at = 0; at < bytes.size(); at += kGranule) {
    pieces.push_back(bytes.subspan(at, std::min(kGranule, bytes.size() - at)));
  }
  return pieces;
}

}  // namespace

void run_mac(Context& ctx) {
  if (!detail::value_mac_available()) {
    ctx.report.skip("mac", "hmac-sha256", "built without OpenSSL (libssl-dev)");
    ctx.report.print_workload("mac");
    return;
  }
  const int64_t tokens = ctx.quick ? 1024 : 16384;
  const int64_t hidden = 4096;
  auto data = std::make_shared<std::vector<float>>(random_f32(tokens * hidden, 5));
  auto pieces = std::make_shared<std::vector<std::span<const std::byte>>>(granules(*data));
  auto mac = std::make_shared<detail::ValueMac>("a-benchmark-key-of-32-bytes-long");
  const double bytes = static_cast<double>(data->size() * sizeof(float));
  Params p;
  p.chunk_size = 256;
  p.hidden_dim = hidden;
  p.tokens = tokens;
  Timed ref = memcpy_reference(data->data(), data->size() * sizeof(float));
  const std::array<std::byte, detail::kRemoteHeaderBytes> header{};
  Timed hmac;
  hmac.name = "hmac-sha256";
  hmac.run = [mac, pieces, header] {
    const detail::Mac tag = mac->compute("hss:v1:bench:hidden:0", header, *pieces);
    do_not_optimize(tag.data());
  };
  hmac.bytes = bytes;
  hmac.tokens = static_cast<double>(tokens);
  (void)ctx.report.measure("mac", "hmac-sha256", p, hmac, std::span<const Timed>(&ref, 1));
  Timed xxh;
  xxh.name = "xxhash3";
  xxh.run = [pieces] {
    const uint64_t h = detail::hash_pieces(*pieces);
    do_not_optimize(&h);
  };
  xxh.bytes = bytes;
  xxh.tokens = static_cast<double>(tokens);
  (void)ctx.report.measure("mac", "xxhash3", p, xxh, std::span<const Timed>(&ref, 1));
  ctx.report.print_workload("mac");
}

}  // namespace hss::bench
