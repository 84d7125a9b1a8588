#pragma once
// Chunk keys and chunk lists between Python and C++.

#include <nanobind/nanobind.h>

#include <cstdint>
#include <vector>

#include "hss/cache_key.hpp"

namespace hss::python {

/// None (defaults), hsstore.Metadata, a dict, or an object with LMCache's LMCacheMetadata
/// attributes (model_name, world_size, worker_id, kv_dtype as a torch dtype or a string).
[[nodiscard]] hss::Metadata metadata_from(nanobind::handle source);

/// A list of (start, end, key) tuples (what process_tokens returns) as C++ chunks.
[[nodiscard]] std::vector<hss::Chunk> chunks_from(nanobind::handle chunks, const char* name);

/// Python ints in [-2^63, 2^64) as 64-bit hashes (negatives two's complement, as Python's
/// built-in hash() gives them).
[[nodiscard]] std::vector<uint64_t> hash_list_from(nanobind::handle hashes, const char* name);

}  // namespace hss::python
