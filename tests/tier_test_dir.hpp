#pragma once
// The directory a disk-tier test stores into: a fresh one under /tmp, removed with everything in
// it at the end, also after a test made parts of it read-only.

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace hss::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/hss_tiers_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    root = pattern;
  }
  ~TempDir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    // A test may have taken write permission away (a read-only directory): give it back first.
    for (auto it = fs::recursive_directory_iterator(root, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec)) ::chmod(it->path().c_str(), 0755);
    }
    ::chmod(root.c_str(), 0755);
    fs::remove_all(root, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The disk tier's own subdirectory, where its value files are.
  [[nodiscard]] std::string values() const { return root + "/hsstore"; }
  std::string root;
};

}  // namespace hss::test
