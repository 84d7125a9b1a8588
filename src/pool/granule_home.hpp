#pragma once
// Where an entry's bytes reside: the granule pool that lent them and takes them back. An entry
// holds its home through this interface, not a BlockPool&, so that the device (HBM) pool of the
// tiers issue is one more home rather than a second kind of entry.
//
// Thread safety: release may run on any thread (an entry's last reference drops wherever the
// last reader was); a home synchronises it itself.

#include <cstdint>
#include <span>

namespace hss::detail {

/// The memory an entry's granules are in.
enum class Residency : uint8_t {
  kHostPool,    ///< the store's host pool (page-locked and device-mapped when a device was found)
  kDevicePool,  ///< the device-resident tier (pool/device_tier.hpp): device memory of one device
};

class GranuleHome {
 public:
  [[nodiscard]] virtual Residency residency() const noexcept = 0;
  /// Takes granules back (an entry's, once no copy may still write them). Never throws.
  virtual void release(std::span<const uint32_t> blocks) noexcept = 0;

 protected:
  GranuleHome() = default;
  ~GranuleHome() = default;  // not owned through this interface
  GranuleHome(const GranuleHome&) = default;
  GranuleHome& operator=(const GranuleHome&) = default;
};

}  // namespace hss::detail
