// The device path against the host path, on a GPU (label gpu) and on the CUDA runtime model
// (label gpu-model): random shapes (hidden dims from 1 to 2051, partial chunks, row strides,
// views one element into their allocation), every input and output dtype, both storage dtypes,
// both store implementations and all three restore implementations, token_offset and row_begin,
// single calls, batches and retrieve_layers_into. Two stores with the same config get the same
// calls, one with device tensors and one with host tensors: every result, every output byte
// (guard bytes around the rows included) and the traffic counters must be equal.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceDifferential, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

/// A tensor held twice, on the host and in device memory, `offset` elements into both buffers
/// (guard bytes 0x5a around it).
struct Twin {
  std::vector<unsigned char> host;
  std::unique_ptr<DeviceBytes> device;
  size_t offset_bytes = 0;
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0, stride = 0;

  Twin(DType d, int64_t r, int64_t c, int64_t s, int64_t offset_elems, std::mt19937& rng,
       bool random)
      : dtype(d), rows(r), cols(c), stride(s) {
    const size_t esize = element_size(d);
    offset_bytes = static_cast<size_t>(offset_elems) * esize;
    host.assign(offset_bytes + static_cast<size_t>(r * s) * esize + 16, 0x5a);
    if (random) {
      std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < c; ++j) {
          test::write_as(d, dist(rng), host.data() + offset_bytes + (i * s + j) * esize);
        }
      }
    }
    device = std::make_unique<DeviceBytes>(host.size());
    test::upload(*device, host.data(), host.size());
  }
  [[nodiscard]] TensorView view(Device where) const {
    const auto* base =
        where == Device::kCuda ? static_cast<const unsigned char*>(device->ptr) : host.data();
    return {base + offset_bytes, dtype, rows, cols, stride, where, 0};
  }
  [[nodiscard]] MutableTensorView out(Device where) {
    auto* base = where == Device::kCuda ? static_cast<unsigned char*>(device->ptr) : host.data();
    return {base + offset_bytes, dtype, rows, cols, stride, where, 0};
  }
  /// The device copy's bytes equal the host copy's, guards included.
  [[nodiscard]] bool same_bytes() const { return test::download(device->ptr, host.size()) == host; }
};

struct Case {
  int64_t chunk, cols, chunks, partial, token_offset_chunks, row_begin;
  DType in, out;
  StorageDType storage;
  StoreImpl store_impl;
  RestoreImpl restore_impl;
  int64_t in_pad, out_pad, in_offset, out_offset;
  bool batch;
};

Case random_case(std::mt19937& rng) {
  const auto pick = [&](int64_t n) {
    return static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
  };
  const int64_t widths[] = {1, 7, 64, 130, 2051};
  Case c{};
  c.chunk = pick(2) == 0 ? 16 : 32;
  c.cols = widths[pick(5)];
  c.chunks = 1 + pick(3);
  c.partial = pick(2) == 0 ? 0 : 1 + pick(c.chunk - 1);
  c.token_offset_chunks = pick(c.chunks);
  c.row_begin = pick(c.chunks * c.chunk);
  c.in = kDTypes[pick(3)];
  c.out = kDTypes[pick(3)];
  c.storage = pick(2) == 0 ? StorageDType::kFloat32 : StorageDType::kNative;
  c.store_impl = pick(2) == 0 ? StoreImpl::kStaging : StoreImpl::kMapped;
  const RestoreImpl impls[] = {RestoreImpl::kKernel, RestoreImpl::kCopyEngine, RestoreImpl::kCub};
  c.restore_impl = impls[pick(3)];
  c.in_pad = pick(2) == 0 ? 0 : 1 + pick(9);
  c.out_pad = pick(2) == 0 ? 0 : 1 + pick(9);
  c.in_offset = pick(2);
  c.out_offset = pick(2);
  c.batch = pick(2) == 0;
  return c;
}

std::string describe(const Case& c) {
  return "chunk " + std::to_string(c.chunk) + " cols " + std::to_string(c.cols) + " chunks " +
         std::to_string(c.chunks) + "+" + std::to_string(c.partial) + " offset " +
         std::to_string(c.token_offset_chunks) + " row_begin " + std::to_string(c.row_begin) +
         " in " + std::string(to_string(c.in)) + " out " + std::string(to_string(c.out)) +
         " storage " + std::string(to_string(c.storage)) + " store " +
         std::string(to_string(c.store_impl)) + " restore " +
         std::string(to_string(c.restore_impl)) + " pads " + std::to_string(c.in_pad) + "/" +
         std::to_string(c.out_pad) + " offsets " + std::to_string(c.in_offset) + "/" +
         std::to_string(c.out_offset) + (c.batch ? " batch" : " single");
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  Config config = test::store_config(c.chunk, c.cols, 64);
  // A case stages at most ~1 MiB: 64 MiB of staging, not the default 1 GiB, for each of the 96
  // stores (one device state each). The counters compared below do not include staging waits.
  config.tuning.staging_bytes = int64_t{64} << 20;
  config.hidden_state_storage_dtype = c.storage;
  config.tuning.store_impl = c.store_impl;
  config.tuning.restore_impl = c.restore_impl;
  ChunkedTokenDatabase db(c.chunk, false);
  HiddenStateStore device(config, db), host(config, db);
  const int64_t n_tokens = c.chunks * c.chunk + c.partial;
  const auto t32 = test::make_tokens(n_tokens, seed);
  const std::vector<int64_t> tokens(t32.begin(), t32.end());
  const int64_t token_offset = c.token_offset_chunks * c.chunk;
  const int64_t rows = n_tokens - token_offset;
  StreamHolder s;

  // Two layers: layer 0 stored from token_offset, layer 1 whole, so that a retrieve of layer 0
  // finds the prefix before token_offset missing and stops there, as the host store does.
  Twin in0(c.in, rows, c.cols, c.cols + c.in_pad, c.in_offset, rng, true);
  Twin in1(c.in, n_tokens, c.cols, c.cols + c.in_pad, c.in_offset, rng, true);
  StoreOptions o0{0, token_offset, ActivationKind::kHidden, s.stream};
  StoreOptions o1{1, 0, ActivationKind::kHidden, s.stream};
  StoreOptions h0 = o0, h1 = o1;
  h0.stream = h1.stream = nullptr;
  if (c.batch) {
    const StoreItem d_items[] = {{tokens, in0.view(Device::kCuda), o0},
                                 {tokens, in1.view(Device::kCuda), o1}};
    const StoreItem h_items[] = {{tokens, in0.view(Device::kHost), h0},
                                 {tokens, in1.view(Device::kHost), h1}};
    EXPECT_EQ(device.store_batch(d_items), host.store_batch(h_items));
  } else {
    EXPECT_EQ(device.store_hidden_states(tokens, in0.view(Device::kCuda), o0),
              host.store_hidden_states(tokens, in0.view(Device::kHost), h0));
    EXPECT_EQ(device.store_hidden_states(tokens, in1.view(Device::kCuda), o1),
              host.store_hidden_states(tokens, in1.view(Device::kHost), h1));
  }

  // Retrieve both layers into device and host outputs of the case's dtype, from row_begin.
  Twin out0(c.out, n_tokens, c.cols, c.cols + c.out_pad, c.out_offset, rng, false);
  Twin out1(c.out, n_tokens, c.cols, c.cols + c.out_pad, c.out_offset, rng, false);
  RetrieveOptions r0{0, c.row_begin, ActivationKind::kHidden, s.stream};
  RetrieveOptions r1{1, c.row_begin, ActivationKind::kHidden, s.stream};
  RetrieveOptions q0 = r0, q1 = r1;
  q0.stream = q1.stream = nullptr;
  if (c.batch) {
    const RetrieveItem d_reads[] = {{tokens, out0.out(Device::kCuda), r0},
                                    {tokens, out1.out(Device::kCuda), r1}};
    const RetrieveItem h_reads[] = {{tokens, out0.out(Device::kHost), q0},
                                    {tokens, out1.out(Device::kHost), q1}};
    EXPECT_EQ(device.retrieve_batch_into(d_reads), host.retrieve_batch_into(h_reads));
  } else {
    const Slot slots[] = {{ActivationKind::kHidden, 1}};
    const MutableTensorView d_outs[] = {out1.out(Device::kCuda)};
    const MutableTensorView h_outs[] = {out1.out(Device::kHost)};
    EXPECT_EQ(device.retrieve_hidden_states_into(tokens, out0.out(Device::kCuda), r0),
              host.retrieve_hidden_states_into(tokens, out0.out(Device::kHost), q0));
    EXPECT_EQ(device.retrieve_layers_into(tokens, slots, d_outs, {c.row_begin, s.stream}),
              host.retrieve_layers_into(tokens, slots, h_outs, {c.row_begin, nullptr}));
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_TRUE(out0.same_bytes());
  EXPECT_TRUE(out1.same_bytes());
  // And a host-output retrieve from the device store equals the host store's.
  const auto got = device.retrieve_hidden_states(tokens, {1, c.row_begin});
  const auto want = host.retrieve_hidden_states(tokens, {1, c.row_begin});
  ASSERT_EQ(got.has_value(), want.has_value());
  if (got) {
    ASSERT_EQ(got->rows(), want->rows());
    EXPECT_EQ(std::memcmp(got->data(), want->data(), got->bytes()), 0);
  }
  const HiddenStateStats ds = device.stats(), hs = host.stats();
  EXPECT_EQ(ds.chunks_written, hs.chunks_written);
  EXPECT_EQ(ds.hit_tokens, hs.hit_tokens);
  EXPECT_EQ(ds.miss_tokens, hs.miss_tokens);
  EXPECT_EQ(ds.entries_held, hs.entries_held);
  EXPECT_EQ(ds.bytes_held, hs.bytes_held);
  EXPECT_EQ(ds.copy_failures, 0u);
  device.check_invariants();
}

TEST(DeviceDifferential, RandomCasesEqualTheHostPath) {
  HSS_REQUIRE_DEVICE();
  std::mt19937 rng(20261201);
  for (uint32_t i = 0; i < 48; ++i) {
    const Case c = random_case(rng);
    run_case(c, 1000 + i);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
