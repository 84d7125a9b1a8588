#pragma once
// What a Reservation holds (hss/pool_transfer.hpp): the PENDING entries reserved for an import,
// with what publish(lock) checks them against. Used by store_transfer.cpp and
// transfer/pool_transfer.cpp only.

#include <optional>
#include <string>
#include <vector>

#include "format/value_codec.hpp"
#include "format/value_mac.hpp"
#include "hss/pool_transfer.hpp"
#include "index/store_index.hpp"
#include "store/transfer_side.hpp"

namespace hss {

struct Reservation::State {
  struct Item {
    size_t chunk = 0;  ///< index into `chunks`
    detail::EntryRef entry;
    detail::RemoteHeader header;
    std::array<std::byte, kEntryHeaderBytes> header_bytes{};
    std::optional<detail::Mac> mac;
    /// What check() found: not yet checked, passed, failed the checksum, failed the MAC.
    enum class Check : uint8_t { kUnchecked, kPass, kBadChecksum, kUnauthenticated };
    Check check = Check::kUnchecked;
  };

  detail::TransferSide* store = nullptr;  ///< the consumer store's transfer side
  std::vector<Chunk> chunks;          ///< the consumer's chunk list (keys of the entries)
  std::vector<Item> items;            ///< PENDING entries, parallel to `reserved`
  std::vector<Reservation::Reserved> reserved;
  size_t chunks_covered = 0;
};

}  // namespace hss
