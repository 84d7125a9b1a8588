#pragma once
// Runs one test case in a forked child and collects what it wrote to a pipe, so a crash, a hang or
// a sanitizer report inside the case cannot take the runner down with it. Shared by the
// bad-input matrix and the allocation-failure sweep.

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace hss::test {

struct ChildResult {
  int status = 0;      ///< as waitpid() reports it
  std::string output;  ///< everything the child wrote to its fd
};

/// Forks; the child runs child(fd) and must exit itself (returning exits with 99). nullopt when
/// pipe() or fork() fails.
template <typename Child>
std::optional<ChildResult> run_in_child(Child&& child) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1]);
    std::_Exit(99);
  }
  ::close(fds[1]);
  ChildResult result;
  char buf[4096];
  ssize_t got = 0;
  while ((got = ::read(fds[0], buf, sizeof buf)) > 0) {
    result.output.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  ::waitpid(pid, &result.status, 0);
  return result;
}

}  // namespace hss::test
