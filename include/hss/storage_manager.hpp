#pragma once

#include "hss/cache_key.hpp"

namespace hss {

/// What the hidden-state store asks of the KV side: is KV still held for this chunk?
/// Implementations must make contains() safe to call from many threads at once; the store calls
/// it outside its own locks (docs/design.md, "What may run concurrently and what may block the
/// host").
class StorageManager {
 public:
  virtual ~StorageManager() = default;
  [[nodiscard]] virtual bool contains(const CacheEngineKey& key) const = 0;
};

}  // namespace hss
