#pragma once
// hss-demo --remote URL: the thinker and the talker as two processes that share hidden states
// only through a Redis/Valkey server (the remote tier).
//
// The thinker process prefills every request and stores KV and hidden states (all layers, one
// full chunk at a time); the write-behind sends them to the server; it exits. The talker process
// then starts with an empty pool, prefills its own KV for each request and restores every layer
// through read-through, checking each value bit for bit against the synthetic thinker. Both run
// as children of hss-demo (fork), one after the other.

#include <cstdint>
#include <string>
#include <vector>

#include "hss/config.hpp"
#include "workload/workload.hpp"

namespace hss::demo {

struct RemoteDemoOptions {
  std::string url;
  hss::Config config;  ///< the local config of each process (the URL is added to it)
  hss::workload::WorkloadOptions workload;
  std::vector<workload::Request> requests;
  bool quiet = false;
};

/// Runs both processes and prints what each did. 0 when the talker restored every stored row
/// bit-identically with remote hits, 1 otherwise.
int run_remote_demo(const RemoteDemoOptions& options);

}  // namespace hss::demo
