// The host copy strategies (src/datapath/host/host_copy.hpp) and copy threads (src/datapath/host/copy_workers.hpp): every
// strategy, vector width and thread count writes the bytes the kernels' per-element functions
// define, for every dtype pair, odd widths, strides and misaligned sides; the rule per CPU family,
// the calibration's decision and the precedence of the overrides; what stats() reports. Values
// only: no test here times anything.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "datapath/host/copy_workers.hpp"
#include "datapath/data_path.hpp"
#include "fork_child.hpp"
#include "datapath/host/host_copy.hpp"
#include "hss/hss.hpp"
#include "hss/kernels/layout.hpp"
#include "test_util.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;
using kernels::GatherSegment;
using kernels::OutputView;
using kernels::SourceView;
using kernels::WriteSegment;

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

/// Every loop this machine can run, each with every combination of stores for copies and
/// widening, all streaming from byte 0; plus one whose threshold splits the calls of the tests.
std::vector<HostCopy> every_strategy() {
  std::vector<CopyIsa> isas{CopyIsa::kPortable};
  if (this_cpu().sse2) isas.push_back(CopyIsa::kSse2);
  if (this_cpu().avx2) isas.push_back(CopyIsa::kAvx2);
  std::vector<HostCopy> out;
  for (CopyIsa isa : isas) {
    for (HostStores copies : {HostStores::kRegular, HostStores::kStreaming}) {
      for (HostStores widening : {HostStores::kRegular, HostStores::kStreaming}) {
        HostCopy h;
        h.isa = isa;
        h.info.copies = copies;
        h.info.widening = widening;
        h.info.stream_threshold_bytes = 0;
        out.push_back(h);
      }
    }
    HostCopy h;
    h.isa = isa;
    h.info.copies = h.info.widening = HostStores::kStreaming;
    h.info.stream_threshold_bytes = 64 << 10;  // some calls below, some above
    out.push_back(h);
  }
  return out;
}

std::string name_of(const HostCopy& h, int threads) {
  return std::string(to_string(h.isa)) + " copies " + std::string(to_string(h.info.copies)) +
         " widening " + std::string(to_string(h.info.widening)) + " from " +
         std::to_string(h.info.stream_threshold_bytes) + " B, " + std::to_string(threads) +
         " threads";
}

/// Runs fn(context, label) for every strategy and 1, 2, 3 and 5 threads splitting even tiny calls.
template <typename Fn>
void for_every_context(Fn&& fn) {
  CopyWorkers two(2), three(3), five(5);
  CopyWorkers* pools[] = {nullptr, &two, &three, &five};
  for (const HostCopy& strategy : every_strategy()) {
    for (CopyWorkers* workers : pools) {
      const HostCopyContext context{&strategy, workers, 1};
      fn(context, name_of(strategy, workers ? workers->threads() : 1));
    }
  }
}

/// Cuts `total` elements into segments of uneven sizes (granules of a pool), each placed in
/// `dst` at its own 64-byte-aligned spot plus `shift` elements, with gaps between them.
struct Placement {
  std::vector<int64_t> counts;
  std::vector<int64_t> offsets;  // elements into the buffer
  int64_t buffer_elems = 0;
};
Placement place(int64_t total, int64_t shift) {
  Placement p;
  const int64_t sizes[] = {4093, 1, 17, 20000, 3};
  int64_t at = 0, done = 0;
  for (size_t i = 0; done < total; ++i) {
    const int64_t n = i < std::size(sizes) ? std::min(sizes[i], total - done) : total - done;
    p.counts.push_back(n);
    p.offsets.push_back(at + shift);
    at += (n + shift + 64) / 32 * 32 + 32;  // gap, next spot 64-byte aligned for 2-byte types
    done += n;
  }
  p.buffer_elems = at + 64;
  return p;
}

struct StoreCase {
  ElemType src, dst;
};

/// Stores rows [row0, row0 + rows) of a strided, shifted source into scattered segments, every
/// way, and checks each against kernels::store_element.
void expect_store_identical(StoreCase c, int64_t cols, int64_t stride, int64_t src_shift,
                            int64_t dst_shift) {
  const int64_t rows = 37, row0 = 2, first = 5;
  const auto sesize = static_cast<int64_t>(kernels::elem_bytes(c.src));
  const auto desize = static_cast<int64_t>(kernels::elem_bytes(c.dst));
  auto source = random_bytes(static_cast<size_t>(((row0 + rows + 1) * stride + src_shift) * sesize),
                             static_cast<uint64_t>(cols * 31 + src_shift));
  const SourceView src{source.data() + src_shift * sesize, c.src, cols, stride};
  const int64_t total = rows * cols - first;
  const Placement p = place(total, dst_shift);
  std::vector<unsigned char> want(static_cast<size_t>(p.buffer_elems * desize), 0x5A);
  std::vector<unsigned char> got = want;
  auto segments_in = [&](std::vector<unsigned char>& buffer) {
    std::vector<WriteSegment> segs;
    int64_t elem = first;
    for (size_t i = 0; i < p.counts.size(); ++i) {
      segs.push_back({buffer.data() + p.offsets[i] * desize, row0, elem, p.counts[i], c.dst});
      elem += p.counts[i];
    }
    return segs;
  };
  for (const WriteSegment& seg : segments_in(want)) {
    for (int64_t i = 0; i < seg.count; ++i) {
      kernels::store_element(src, seg.src_row0, seg.src_elem + i, seg.dst, i, c.dst);
    }
  }
  const std::vector<WriteSegment> segs = segments_in(got);
  for_every_context([&](const HostCopyContext& context, const std::string& label) {
    std::fill(got.begin(), got.end(), 0x5A);
    host_store(src, segs, context);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size()))
        << label << "; src " << static_cast<int>(c.src) << " dst " << static_cast<int>(c.dst)
        << " cols " << cols << " stride " << stride << " shifts " << src_shift << "/" << dst_shift;
  });
}

TEST(HostCopyStrategies, EveryStoreIsBitIdenticalForEveryDtypePairAndLayout) {
  const StoreCase cases[] = {{ElemType::kFloat32, ElemType::kFloat32},
                             {ElemType::kBFloat16, ElemType::kBFloat16},
                             {ElemType::kFloat16, ElemType::kFloat16},
                             {ElemType::kBFloat16, ElemType::kFloat32},
                             {ElemType::kFloat16, ElemType::kFloat32}};
  for (const StoreCase& c : cases) {
    for (int64_t cols : {int64_t{1027}, int64_t{64}}) {
      for (int64_t pad : {0, 5}) {
        for (int64_t src_shift : {0, 1, 3}) {
          for (int64_t dst_shift : {0, 1}) {
            expect_store_identical(c, cols, cols + pad, src_shift, dst_shift);
          }
        }
      }
    }
  }
}

/// Restores scattered pool segments of `storage` into a strided, shifted output of `out_type`,
/// every way, and checks each against kernels::restore_element.
void expect_restore_identical(ElemType storage, ElemType out_type, int64_t cols, int64_t stride,
                              int64_t src_shift, int64_t out_shift) {
  const int64_t rows = 41, row_begin_elems = 3;
  const auto sesize = static_cast<int64_t>(kernels::elem_bytes(storage));
  const auto oesize = static_cast<int64_t>(kernels::elem_bytes(out_type));
  const int64_t total = rows * cols - row_begin_elems;
  const Placement p = place(total, src_shift);
  const auto pool = random_bytes(static_cast<size_t>(p.buffer_elems * sesize),
                                 static_cast<uint64_t>(cols + 7 * src_shift));
  std::vector<GatherSegment> segs;
  int64_t elem = row_begin_elems;
  for (size_t i = 0; i < p.counts.size(); ++i) {
    segs.push_back({pool.data() + p.offsets[i] * sesize, elem, p.counts[i], storage});
    elem += p.counts[i];
  }
  const size_t out_bytes = static_cast<size_t>((rows * stride + out_shift + 8) * oesize);
  std::vector<unsigned char> want(out_bytes, 0xC3);
  std::vector<unsigned char> got = want;
  const OutputView want_view{want.data() + out_shift * oesize, cols, stride, out_type};
  const OutputView got_view{got.data() + out_shift * oesize, cols, stride, out_type};
  for (const GatherSegment& seg : segs) {
    for (int64_t i = 0; i < seg.count; ++i) kernels::restore_element(seg, i, want_view);
  }
  for_every_context([&](const HostCopyContext& context, const std::string& label) {
    std::fill(got.begin(), got.end(), 0xC3);
    host_restore(segs, got_view, context);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size()))
        << label << "; storage " << static_cast<int>(storage) << " out "
        << static_cast<int>(out_type) << " cols " << cols << " stride " << stride << " shifts "
        << src_shift << "/" << out_shift;
  });
}

TEST(HostCopyStrategies, EveryRestoreIsBitIdenticalForEveryDtypePairAndLayout) {
  const ElemType types[] = {ElemType::kFloat32, ElemType::kBFloat16, ElemType::kFloat16};
  for (ElemType storage : types) {
    for (ElemType out : types) {
      for (int64_t cols : {int64_t{1027}, int64_t{64}}) {
        for (int64_t pad : {0, 3}) {
          for (int64_t src_shift : {0, 1}) {
            for (int64_t out_shift : {0, 1, 3}) {
              expect_restore_identical(storage, out, cols, cols + pad, src_shift, out_shift);
            }
          }
        }
      }
    }
  }
}

TEST(HostCopyStrategies, CopyLoopsHandleEveryLengthAndAlignment) {
  // The heads and tails of the vector loops: lengths 0..300 from every 0..63 byte offset.
  const auto src = random_bytes(512, 3);
  for (const HostCopy& h : every_strategy()) {
    for (bool stream : {false, true}) {
      for (size_t shift = 0; shift < 64; shift += 7) {
        for (size_t n = 0; n <= 300; ++n) {
          std::vector<unsigned char> dst(512, 0xEE);
          copy_bytes(dst.data() + shift, src.data() + 63 - shift, n, stream, h.isa);
          end_streaming(stream);
          ASSERT_EQ(0, std::memcmp(dst.data() + shift, src.data() + 63 - shift, n))
              << to_string(h.isa) << " n " << n << " shift " << shift;
          ASSERT_EQ(dst[shift + n], 0xEE) << "wrote past the end: n " << n;
          if (shift > 0) {
            ASSERT_EQ(dst[shift - 1], 0xEE) << "wrote before the start: n " << n;
          }
        }
      }
    }
  }
}

TEST(HostCopyStrategies, WideningIsExactForEveryBfloat16Pattern) {
  std::vector<uint16_t> in(65536 + 5);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i * 40503u);
  for (const HostCopy& h : every_strategy()) {
    for (bool stream : {false, true}) {
      for (int64_t shift : {0, 1, 3}) {
        std::vector<float> out(in.size() + 8, -1.0f);
        const auto n = static_cast<int64_t>(in.size()) - shift;
        widen_bf16(in.data() + shift, out.data() + shift, n, stream, h.isa);
        end_streaming(stream);
        for (int64_t i = 0; i < n; ++i) {
          uint32_t bits;
          std::memcpy(&bits, &out[static_cast<size_t>(i + shift)], 4);
          ASSERT_EQ(bits, static_cast<uint32_t>(in[static_cast<size_t>(i + shift)]) << 16)
              << to_string(h.isa) << " element " << i;
        }
        ASSERT_EQ(out[static_cast<size_t>(n + shift)], -1.0f);
      }
    }
  }
}

// ---- the choice

CpuIdentity cpu(const char* vendor, uint32_t family, uint32_t model, bool avx2 = true) {
  return {vendor, family, model, true, avx2};
}

TEST(HostCopyRule, AmdStreamsLargeCallsIntelUsesRegularStoresUnknownUsesMemcpy) {
  const HostCopy amd = rule_for(cpu("AuthenticAMD", 0x19, 0x1));  // EPYC Milan
  EXPECT_EQ(amd.info.copies, HostStores::kStreaming);
  EXPECT_EQ(amd.info.widening, HostStores::kStreaming);
  EXPECT_EQ(amd.info.stream_threshold_bytes, kDefaultStreamThresholdBytes);
  EXPECT_EQ(amd.copy_stream_bytes(), kDefaultStreamThresholdBytes);
  EXPECT_EQ(amd.isa, CopyIsa::kAvx2);
  EXPECT_EQ(amd.info.chosen_by, HostCopySource::kCpuRule);
  EXPECT_NE(amd.info.cpu.find("AuthenticAMD family 0x19 model 0x1"), std::string::npos);
  EXPECT_NE(amd.info.summary.find("AMD"), std::string::npos) << amd.info.summary;
  EXPECT_EQ(rule_for(cpu("AuthenticAMD", 0x17, 0x31)).info.copies, HostStores::kStreaming);

  const HostCopy spr = rule_for(cpu("GenuineIntel", 0x6, 0x8f));  // Sapphire Rapids
  EXPECT_EQ(spr.info.copies, HostStores::kRegular);
  EXPECT_EQ(spr.info.widening, HostStores::kRegular);
  EXPECT_EQ(spr.copy_stream_bytes(), kNeverStream);
  EXPECT_EQ(spr.widen_stream_bytes(), kNeverStream);
  EXPECT_NE(spr.info.summary.find("Sapphire Rapids"), std::string::npos) << spr.info.summary;

  const HostCopy other = rule_for(cpu("CentaurHauls", 0x7, 0x1b, false));
  EXPECT_EQ(other.info.copies, HostStores::kRegular);
  EXPECT_EQ(other.isa, CopyIsa::kSse2);
  EXPECT_EQ(rule_for(cpu("AuthenticAMD", 0x15, 0x2)).info.copies, HostStores::kRegular);

  const HostCopy arm = rule_for(CpuIdentity{});  // no x86 loops: never streams
  EXPECT_EQ(arm.isa, CopyIsa::kPortable);
  EXPECT_EQ(arm.copy_stream_bytes(), kNeverStream);
  EXPECT_NE(arm.info.cpu.find("non-x86"), std::string::npos);
}

TEST(HostCopyRule, CalibrationPicksTheFasterByMoreThanTheMarginElseTheRule) {
  const HostCopy amd = rule_for(cpu("AuthenticAMD", 0x19, 0x1));
  const HostCopy intel = rule_for(cpu("GenuineIntel", 0x6, 0x8f));
  CalibrationTimes t;
  t.bytes = kCalibrationBytes;
  // Streaming copies 2x faster, widening a near tie.
  t.regular_copy = 0.010;
  t.streaming_copy = 0.005;
  t.regular_widen = 0.0100;
  t.streaming_widen = 0.0098;
  HostCopy h = decide(t, intel);
  EXPECT_EQ(h.info.chosen_by, HostCopySource::kCalibration);
  EXPECT_EQ(h.info.copies, HostStores::kStreaming);
  EXPECT_EQ(h.info.widening, HostStores::kRegular);  // the tie keeps Intel's rule
  EXPECT_EQ(h.copy_stream_bytes(), kDefaultStreamThresholdBytes);
  EXPECT_EQ(h.widen_stream_bytes(), kNeverStream);
  EXPECT_NEAR(h.info.streaming_copy_gbps, static_cast<double>(kCalibrationBytes) / 0.005 / 1e9,
              1e-6);
  EXPECT_NEAR(h.info.regular_copy_gbps, static_cast<double>(kCalibrationBytes) / 0.010 / 1e9, 1e-6);
  EXPECT_NE(h.info.summary.find("calibration"), std::string::npos) << h.info.summary;
  EXPECT_EQ(decide(t, amd).info.widening, HostStores::kStreaming);  // the tie keeps AMD's

  // Regular stores faster: regular at every size, whatever the rule said.
  t.regular_copy = t.regular_widen = 0.004;
  t.streaming_copy = t.streaming_widen = 0.006;
  h = decide(t, amd);
  EXPECT_EQ(h.info.copies, HostStores::kRegular);
  EXPECT_EQ(h.info.widening, HostStores::kRegular);
  EXPECT_EQ(h.copy_stream_bytes(), kNeverStream);

  // The rounds' paired ratio decides over the bests: one disturbed round made the best regular
  // copy look faster, while streaming won the median round by 30%.
  t.regular_copy = 0.004;
  t.streaming_copy = 0.006;
  t.copy_ratio = 0.70;
  t.widen_ratio = 1.02;  // a near tie: the rule's
  h = decide(t, intel);
  EXPECT_EQ(h.info.copies, HostStores::kStreaming);
  EXPECT_EQ(h.info.widening, HostStores::kRegular);
  t.copy_ratio = 1.30;  // regular faster in the median round
  EXPECT_EQ(decide(t, amd).info.copies, HostStores::kRegular);
  EXPECT_EQ(decide(t, amd).info.widening, HostStores::kStreaming);

  // Nothing timed (pool too small): the rule unchanged.
  EXPECT_EQ(decide(CalibrationTimes{}, amd).info.chosen_by, HostCopySource::kCpuRule);
}

TEST(HostCopyRule, CalibrationTimesEveryCandidateInTheArena) {
  if (!this_cpu().sse2) GTEST_SKIP() << "no streaming loops on this CPU";
  std::vector<std::byte> arena(kCalibrationArenaBytes);
  const CalibrationTimes t = calibrate(arena, rule_for(this_cpu()).isa);
  EXPECT_EQ(t.bytes, kCalibrationBytes);
  for (double s : {t.regular_copy, t.streaming_copy, t.regular_widen, t.streaming_widen}) {
    EXPECT_GT(s, 0.0);
    EXPECT_LT(s, 60.0);
  }
  // The medians of the paired rounds, which decide().
  for (double r : {t.copy_ratio, t.widen_ratio}) {
    EXPECT_GT(r, 0.0);
    EXPECT_TRUE(std::isfinite(r));
  }
  // Too small an arena: nothing timed.
  std::vector<std::byte> small(kCalibrationArenaBytes - 64);
  EXPECT_EQ(calibrate(small, CopyIsa::kSse2).bytes, 0u);
}

bool env_override_set() { return std::getenv("HSS_STREAM_THRESHOLD_KB") != nullptr; }

TEST(HostCopyRule, ConfiguredThresholdOverridesCalibrationAndRule) {
  if (env_override_set()) GTEST_SKIP() << "HSS_STREAM_THRESHOLD_KB takes precedence here";
  Config config;
  config.tuning.stream_threshold_bytes = 12345;
  std::vector<std::byte> arena(kCalibrationArenaBytes);
  const HostCopy h = choose_host_copy(config, arena);
  EXPECT_EQ(h.info.chosen_by, HostCopySource::kConfig);
  EXPECT_EQ(h.info.stream_threshold_bytes, 12345u);
  if (this_cpu().sse2) {
    EXPECT_EQ(h.info.copies, HostStores::kStreaming);
    EXPECT_EQ(h.copy_stream_bytes(), 12345u);
    EXPECT_EQ(h.widen_stream_bytes(), 12345u);
  }
  EXPECT_NE(h.info.summary.find("hidden_state_stream_threshold_bytes"), std::string::npos);
  // Unset: the rule for a pool too small to calibrate, unless this process calibrated already.
  const HostCopy chosen = choose_host_copy(Config{}, std::span<std::byte>(arena.data(), 4096));
  EXPECT_TRUE(chosen.info.chosen_by == HostCopySource::kCpuRule ||
              chosen.info.chosen_by == HostCopySource::kCalibration);
  EXPECT_FALSE(chosen.info.summary.empty());
}

// ---- the store

TEST(HostCopyStore, StatsReportTheStrategyAndTheCopyThreads) {
  // Room for the largest call below (its chunk count depends on the CPU family's part size).
  Config config = test::store_config(256, 2048, 64);
  config.tuning.copy_threads = 3;
  ChunkedTokenDatabase db(256, false);
  HiddenStateStore store(config, db);
  HiddenStateStats s = store.stats();
  EXPECT_EQ(s.host_copy.copy_threads, 3);
  EXPECT_EQ(s.host_copy.split_copies, 0u);
  EXPECT_FALSE(s.host_copy.summary.empty());
  EXPECT_FALSE(s.host_copy.cpu.empty());
  if (env_override_set()) {
    EXPECT_EQ(s.host_copy.chosen_by, HostCopySource::kEnvironment);
  } else {
    EXPECT_TRUE(s.host_copy.chosen_by == HostCopySource::kCpuRule ||
                s.host_copy.chosen_by == HostCopySource::kCalibration);
  }
  // No copy yet: no worker started.
  EXPECT_EQ(s.host_copy.copy_workers_started, 0);
  EXPECT_FALSE(s.host_copy.copy_threads_auto);
  EXPECT_EQ(s.host_copy.copy_threads_reason, "hidden_state_copy_threads 3");
  const uint64_t part = s.host_copy.min_bytes_per_copy_thread;
  ASSERT_GT(part, 0u);
  // A call below two parts stays on the calling thread and starts nothing.
  const auto few = test::make_tokens(256, 4);
  const auto few_rows = test::make_rows(few, 0, 0, 2048);
  ASSERT_EQ(store.store_hidden_states(few, test::view_of(few_rows, 2048)).written, 1);
  EXPECT_EQ(store.stats().host_copy.split_copies, 0u);
  EXPECT_EQ(store.stats().host_copy.copy_workers_started, 0);
  // Chunks of 2 MiB making one call of at least three parts: split over the three threads each
  // way, the workers started by the first split.
  const int64_t chunks = static_cast<int64_t>(3 * part / (uint64_t{2} << 20)) + 1;
  const auto tokens = test::make_tokens(256 * chunks, 5);
  const auto rows = test::make_rows(tokens, 0, 0, 2048);
  ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(rows, 2048)).written, chunks);
  auto out = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  ASSERT_EQ(0, std::memcmp(out->data(), rows.data(), rows.size() * sizeof(float)));
  EXPECT_EQ(store.stats().host_copy.split_copies, 2u);
  EXPECT_EQ(store.stats().host_copy.copy_workers_started, 2);
  // One thread: never split.
  Config single = test::store_config(256, 2048, chunks + 2);
  single.tuning.copy_threads = 1;
  HiddenStateStore one(single, db);
  ASSERT_EQ(one.store_hidden_states(tokens, test::view_of(rows, 2048)).written, chunks);
  EXPECT_EQ(one.stats().host_copy.copy_threads, 1);
  EXPECT_EQ(one.stats().host_copy.split_copies, 0u);
  EXPECT_EQ(one.stats().host_copy.copy_workers_started, 0);
}

TEST(HostCopyStore, ConfiguredThresholdIsWhatStatsReport) {
  if (env_override_set()) GTEST_SKIP() << "HSS_STREAM_THRESHOLD_KB takes precedence here";
  Config config = test::store_config(16, 32, 4);
  config.tuning.stream_threshold_bytes = int64_t{1} << 20;
  ChunkedTokenDatabase db(16, false);
  HiddenStateStore store(config, db);
  const HostCopyStats s = store.stats().host_copy;
  EXPECT_EQ(s.chosen_by, HostCopySource::kConfig);
  EXPECT_EQ(s.stream_threshold_bytes, uint64_t{1} << 20);
}

struct StoreDtypes {
  DType in;
  StorageDType storage;
};

/// A 10 MiB-plus prefix (odd width) stored and restored with `threads` copy threads and
/// `threshold`: the restore is bit-identical to the input (or its exact widening), fresh and
/// into a strided caller buffer.
void expect_round_trip(StoreDtypes d, int threads, std::optional<int64_t> threshold) {
  constexpr int64_t kChunk = 256, kCols = 2051, kRows = 5 * kChunk;
  Config config = test::store_config(kChunk, kCols, 6);
  config.hidden_state_storage_dtype = d.storage;
  config.tuning.copy_threads = threads;
  // Parts of 4 MiB, so this 10 MiB prefix splits whatever the CPU family's crossover.
  config.tuning.copy_split_bytes = int64_t{4} << 20;
  config.tuning.stream_threshold_bytes = threshold;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);
  const auto tokens = test::make_tokens(kRows, 91);
  const auto rows = test::make_rows(tokens, 0, 0, kCols);
  const size_t esize = element_size(d.in);
  std::vector<unsigned char> input(rows.size() * esize);
  for (size_t i = 0; i < rows.size(); ++i) test::write_as(d.in, rows[i], &input[i * esize]);
  const TensorView view{input.data(), d.in, kRows, kCols, 0, Device::kHost, 0};
  ASSERT_EQ(store.store_hidden_states(tokens, view).cached, 5);
  // Fresh float32 result: the input's values widened exactly.
  auto fresh = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(fresh);
  for (size_t i = 0; i < rows.size(); ++i) {
    float want;
    if (d.in == DType::kFloat32) {
      std::memcpy(&want, &input[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &input[i * 2], 2);
      want = d.in == DType::kBFloat16 ? kernels::bf16_to_float(h) : kernels::f16_to_float(h);
    }
    ASSERT_EQ(0, std::memcmp(&fresh->data()[i], &want, 4)) << "element " << i;
  }
  // Into a strided buffer of the input's dtype: the input's bits.
  const int64_t stride = kCols + 3;
  std::vector<unsigned char> out(static_cast<size_t>(kRows * stride) * esize, 0x77);
  const MutableTensorView out_view{out.data(), d.in, kRows, kCols, stride, Device::kHost, 0};
  ASSERT_EQ(store.retrieve_hidden_states_into(tokens, out_view), kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(0, std::memcmp(&out[static_cast<size_t>(r * stride) * esize],
                             &input[static_cast<size_t>(r * kCols) * esize],
                             static_cast<size_t>(kCols) * esize))
        << "row " << r;
  }
  if (threads > 1) {
    EXPECT_GT(store.stats().host_copy.split_copies, 0u);
  }
}

TEST(HostCopyStore, EveryThreadCountAndThresholdRoundTripsBitIdentically) {
  const StoreDtypes cases[] = {{DType::kFloat32, StorageDType::kFloat32},
                               {DType::kBFloat16, StorageDType::kNative},
                               {DType::kBFloat16, StorageDType::kFloat32},
                               {DType::kFloat16, StorageDType::kNative},
                               {DType::kFloat16, StorageDType::kFloat32}};
  for (const StoreDtypes& d : cases) {
    for (int threads : {1, 2, 3}) {
      for (std::optional<int64_t> threshold : {std::optional<int64_t>{}, std::optional<int64_t>{0},
                                               std::optional<int64_t>{int64_t{1} << 40}}) {
        SCOPED_TRACE("dtype " + std::string(to_string(d.in)) + " storage " +
                     std::string(to_string(d.storage)) + " threads " + std::to_string(threads) +
                     " threshold " + (threshold ? std::to_string(*threshold) : "auto"));
        expect_round_trip(d, threads, threshold);
      }
    }
  }
}

// ---- the workers

TEST(CopyWorkers, EveryPartRunsOnceWhateverTheCountOfParts) {
  CopyWorkers workers(3);
  EXPECT_EQ(workers.threads(), 3);
  for (size_t parts : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}}) {
    std::vector<std::atomic<int>> runs(parts);
    auto part = [&](size_t i) { runs[i].fetch_add(1); };
    workers.run(parts, part);
    for (size_t i = 0; i < parts; ++i) EXPECT_EQ(runs[i].load(), 1) << parts << " parts, " << i;
  }
  EXPECT_EQ(workers.split_runs(), 3u);  // the calls of 2, 3 and 7 parts
}

TEST(CopyWorkers, ConcurrentCallersEachGetEveryPartRun) {
  CopyWorkers workers(2);
  constexpr int kCallers = 4, kCalls = 200;
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int k = 0; k < kCalls; ++k) {
        std::atomic<int> a{0}, b{0};
        auto part = [&](size_t i) { (i == 0 ? a : b).fetch_add(1); };
        workers.run(2, part);
        if (a.load() != 1 || b.load() != 1) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(workers.split_runs(), static_cast<uint64_t>(kCallers * kCalls));
  EXPECT_GT(workers.split_runs(), 0u);
}

TEST(CopyWorkers, AForkedChildCopiesAloneInsteadOfWaitingForWorkersItHasNot) {
  CopyWorkers workers(3);
  const auto child = test::run_in_child([&](int fd) {
    std::atomic<int> runs{0};
    auto part = [&](size_t) { runs.fetch_add(1); };
    workers.run(3, part);  // would wait forever for the parent's workers
    const char ok = runs.load() == 3 ? 'y' : 'n';
    (void)::write(fd, &ok, 1);
    std::_Exit(0);
  });
  ASSERT_TRUE(child);
  EXPECT_TRUE(WIFEXITED(child->status) && WEXITSTATUS(child->status) == 0);
  EXPECT_EQ(child->output, "y");
  EXPECT_EQ(workers.split_runs(), 0u);  // the parent's workers never ran the child's call
}

}  // namespace
}  // namespace hss::detail
