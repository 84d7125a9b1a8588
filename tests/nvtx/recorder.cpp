// An NVTX injection library for the tests: loaded by the NVTX v3 loader from
// NVTX_INJECTION64_PATH, it records domain creation and domain range pushes/pops, so a test can
// prove that hsstore's ranges reach NVTX itself (not only hsstore's own trace hook).
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex g_mutex;
std::vector<std::string> g_events;  // "domain:<name>", "push:<domain>:<message>", "pop:<domain>"
std::vector<std::string> g_domains;

const std::string& domain_name(nvtxDomainHandle_t domain) {
  static const std::string unknown = "?";
  const auto index = reinterpret_cast<uintptr_t>(domain);
  return index >= 1 && index <= g_domains.size() ? g_domains[index - 1] : unknown;
}

nvtxDomainHandle_t NVTX_API create_domain(const char* name) {
  std::lock_guard lock(g_mutex);
  g_domains.emplace_back(name);
  g_events.push_back("domain:" + std::string(name));
  return reinterpret_cast<nvtxDomainHandle_t>(static_cast<uintptr_t>(g_domains.size()));
}

int NVTX_API push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attributes) {
  std::lock_guard lock(g_mutex);
  const char* message = attributes != nullptr && attributes->messageType == NVTX_MESSAGE_TYPE_ASCII
                            ? attributes->message.ascii
                            : "<non-ascii>";
  g_events.push_back("push:" + domain_name(domain) + ":" + message);
  return 0;
}

int NVTX_API pop(nvtxDomainHandle_t domain) {
  std::lock_guard lock(g_mutex);
  g_events.push_back("pop:" + domain_name(domain));
  return 0;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr ||
      size < NVTX_CBID_CORE2_DomainCreateA) {
    return 0;
  }
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&create_domain);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
  return 1;
}

/// The events recorded so far (the test reads them through dlsym).
__attribute__((visibility("default"))) std::vector<std::string> hss_test_nvtx_events() {
  std::lock_guard lock(g_mutex);
  return g_events;
}

}  // extern "C"
