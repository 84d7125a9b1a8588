// The device-path and host-copy Config keys (hidden_state_restore_impl, hidden_state_staging_bytes,
// hidden_state_output_cache_bytes, hidden_state_stream_threshold_bytes, hidden_state_copy_threads):
// defaults, parsing,
// validation with the key and value named, and to_yaml round trips.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hss/config.hpp"
#include "hss/error.hpp"
#include "config_errors.hpp"

namespace hss {
namespace {

using test::expect_mentions;
using test::yaml_error;

TEST(ConfigDevice, Defaults) {
  const Config c;
  EXPECT_EQ(c.tuning.restore_impl, RestoreImpl::kKernel);
  EXPECT_EQ(c.tuning.store_impl, StoreImpl::kStaging);
  EXPECT_EQ(c.tuning.staging_bytes, int64_t{1} << 30);
  EXPECT_EQ(c.tuning.output_cache_bytes, int64_t{2048} << 20);
  EXPECT_EQ(c.tuning.stream_threshold_bytes, std::nullopt);  // chosen for the machine
  EXPECT_EQ(c.tuning.copy_threads, std::nullopt);  // auto: chosen for the CPUs of the process
  EXPECT_NO_THROW(c.validate());
}

TEST(ConfigDevice, KeysParse) {
  const Config c = Config::from_yaml(
      "hidden_state_restore_impl: copy_engine\n"
      "hidden_state_staging_bytes: 4096\n"
      "hidden_state_output_cache_bytes: 0\n"
      "hidden_state_stream_threshold_bytes: 65536\n"
      "hidden_state_copy_threads: 3\n");
  EXPECT_EQ(c.tuning.restore_impl, RestoreImpl::kCopyEngine);
  EXPECT_EQ(c.tuning.staging_bytes, 4096);
  EXPECT_EQ(c.tuning.output_cache_bytes, 0);
  EXPECT_EQ(c.tuning.stream_threshold_bytes, 65536);
  EXPECT_EQ(c.tuning.copy_threads, 3);
  EXPECT_TRUE(c.unknown_keys.empty());
  EXPECT_EQ(Config::from_yaml("hidden_state_restore_impl: cub").tuning.restore_impl,
            RestoreImpl::kCub);
  EXPECT_EQ(Config::from_yaml("hidden_state_restore_impl: kernel").tuning.restore_impl,
            RestoreImpl::kKernel);
}

TEST(ConfigDevice, RestoreImplNames) {
  for (RestoreImpl impl : {RestoreImpl::kKernel, RestoreImpl::kCopyEngine, RestoreImpl::kCub}) {
    EXPECT_EQ(restore_impl_from_string(to_string(impl)), impl);
  }
  EXPECT_EQ(restore_impl_from_string("memcpy"), std::nullopt);
  EXPECT_EQ(restore_impl_from_string(""), std::nullopt);
}

TEST(ConfigDevice, StoreImplParsesRoundTripsAndRejectsOtherNames) {
  const Config c = Config::from_yaml("hidden_state_store_impl: mapped\n");
  EXPECT_EQ(c.tuning.store_impl, StoreImpl::kMapped);
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).tuning.store_impl, StoreImpl::kMapped);
  for (StoreImpl impl : {StoreImpl::kStaging, StoreImpl::kMapped}) {
    EXPECT_EQ(store_impl_from_string(to_string(impl)), impl);
  }
  EXPECT_EQ(store_impl_from_string("kernel"), std::nullopt);
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_store_impl: zero_copy\n"),
                  {"hidden_state_store_impl", "zero_copy", "line 2", "staging", "mapped"});
  Config bad;
  bad.tuning.store_impl = static_cast<StoreImpl>(7);
  EXPECT_THROW(bad.validate(), ConfigError);
}

TEST(ConfigDevice, LaunchSlotsParseAndAreBounded) {
  EXPECT_EQ(Config().tuning.launch_slots, 64);
  const Config c = Config::from_yaml("hidden_state_launch_slots: 8\n");
  EXPECT_EQ(c.tuning.launch_slots, 8);
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).tuning.launch_slots, 8);
  expect_mentions(yaml_error("hidden_state_launch_slots: 0\n"),
                  {"hidden_state_launch_slots", "0", "line 1", "1..4096"});
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_launch_slots: 5000\n"),
                  {"hidden_state_launch_slots", "5000", "line 2"});
}

TEST(ConfigDevice, DeviceCacheSizeIsOffByDefaultParsesRoundTripsAndRejectsNegatives) {
  EXPECT_EQ(Config().hidden_state_device_cache_size, 0.0);
  EXPECT_EQ(Config().device_cache_bytes(), 0u);
  const Config c = Config::from_yaml("hidden_state_device_cache_size: 0.5\n");
  EXPECT_EQ(c.hidden_state_device_cache_size, 0.5);
  EXPECT_EQ(c.device_cache_bytes(), uint64_t{1} << 29);
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).hidden_state_device_cache_size, 0.5);
  expect_mentions(yaml_error("hidden_state_device_cache_size: -1\n"),
                  {"hidden_state_device_cache_size", "-1", "line 1", ">= 0"});
}

TEST(ConfigDevice, StreamThresholdAutoIsUnset) {
  for (const char* text : {"auto", "AUTO", "null", "~"}) {
    const Config c =
        Config::from_yaml(std::string("hidden_state_stream_threshold_bytes: ") + text + "\n");
    EXPECT_EQ(c.tuning.stream_threshold_bytes, std::nullopt) << text;
  }
  const Config c;
  EXPECT_NE(c.to_yaml().find("hidden_state_stream_threshold_bytes: auto\n"), std::string::npos);
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).tuning.stream_threshold_bytes, std::nullopt);
  EXPECT_EQ(Config::from_yaml("hidden_state_stream_threshold_bytes: 0\n")
                .tuning.stream_threshold_bytes,
            0);
}

TEST(ConfigDevice, CopyThreadsAreBounded) {
  EXPECT_EQ(Config::from_yaml("hidden_state_copy_threads: 64\n").tuning.copy_threads, 64);
  expect_mentions(yaml_error("hidden_state_copy_threads: 0\n"),
                  {"hidden_state_copy_threads", "0", "line 1", "1..64"});
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_copy_threads: 65\n"),
                  {"hidden_state_copy_threads", "65", "line 2"});
  expect_mentions(yaml_error("hidden_state_copy_threads: two\n"),
                  {"hidden_state_copy_threads", "two", "line 1"});
  Config c;
  c.tuning.copy_threads = -1;
  EXPECT_THROW(c.validate(), ConfigError);
  // auto (or null) is the default, and round-trips as auto.
  EXPECT_EQ(Config::from_yaml("hidden_state_copy_threads: auto\n").tuning.copy_threads,
            std::nullopt);
  EXPECT_EQ(Config::from_yaml("hidden_state_copy_threads: AUTO\n").tuning.copy_threads,
            std::nullopt);
  EXPECT_EQ(Config::from_yaml("hidden_state_copy_threads: null\n").tuning.copy_threads,
            std::nullopt);
  EXPECT_NE(Config().to_yaml().find("hidden_state_copy_threads: auto\n"), std::string::npos);
  expect_mentions(yaml_error("hidden_state_copy_threads: automatic\n"),
                  {"hidden_state_copy_threads", "automatic", "auto"});
  // What a store built here with the config gets.
  Config three;
  three.tuning.copy_threads = 3;
  EXPECT_EQ(three.effective_copy_threads(), 3);
  EXPECT_GE(Config().effective_copy_threads(), 1);
  EXPECT_LE(Config().effective_copy_threads(), 8);
}

TEST(ConfigDevice, TheStoresDeviceParsesAndIsBounded) {
  EXPECT_EQ(Config().hidden_state_device, -1);  // the constructing thread's current device
  const Config c = Config::from_yaml("hidden_state_device: 3\n");
  EXPECT_EQ(c.hidden_state_device, 3);
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).hidden_state_device, 3);
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_device: -2\n"),
                  {"hidden_state_device", "-2", "line 2", "device index"});
  expect_mentions(yaml_error("hidden_state_device: gpu1\n"), {"hidden_state_device", "gpu1"});
}

TEST(ConfigDeviceErrors, BadValuesNameKeyValueAndLine) {
  expect_mentions(yaml_error("hidden_state_restore_impl: memcpy\n"),
                  {"hidden_state_restore_impl", "memcpy", "line 1", "copy_engine"});
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_staging_bytes: 0\n"),
                  {"hidden_state_staging_bytes", "0", "line 2", "> 0"});
  expect_mentions(yaml_error("hidden_state_staging_bytes: lots\n"),
                  {"hidden_state_staging_bytes", "lots", "line 1"});
  expect_mentions(yaml_error("hidden_state_output_cache_bytes: -1\n"),
                  {"hidden_state_output_cache_bytes", "-1", "line 1"});
  expect_mentions(yaml_error("hidden_state_stream_threshold_bytes: -8\n"),
                  {"hidden_state_stream_threshold_bytes", "-8", "line 1"});
  expect_mentions(yaml_error("hidden_state_stream_threshold_bytes: sometimes\n"),
                  {"hidden_state_stream_threshold_bytes", "sometimes", "line 1", "auto"});
}

TEST(ConfigDeviceErrors, ValidateInCode) {
  Config c;
  c.tuning.staging_bytes = -5;
  try {
    c.validate();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    expect_mentions(e.what(), {"hidden_state_staging_bytes", "-5"});
  }
  c = Config{};
  c.tuning.restore_impl = static_cast<RestoreImpl>(9);
  EXPECT_THROW(c.validate(), ConfigError);
}

TEST(ConfigDevice, ToYamlRoundTrips) {
  Config c;
  c.tuning.restore_impl = RestoreImpl::kCub;
  c.tuning.staging_bytes = 123456;
  c.tuning.output_cache_bytes = 7;
  c.tuning.stream_threshold_bytes = 0;
  c.tuning.copy_threads = 2;
  const std::string text = c.to_yaml();
  EXPECT_NE(text.find("hidden_state_restore_impl: cub\n"), std::string::npos) << text;
  const Config back = Config::from_yaml(text);
  EXPECT_EQ(back.tuning.restore_impl, RestoreImpl::kCub);
  EXPECT_EQ(back.tuning.staging_bytes, 123456);
  EXPECT_EQ(back.tuning.output_cache_bytes, 7);
  EXPECT_EQ(back.tuning.stream_threshold_bytes, 0);
  EXPECT_EQ(back.tuning.copy_threads, 2);
}

}  // namespace
}  // namespace hss
