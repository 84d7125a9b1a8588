#pragma once
// Bounded, regular-file-only reads of small input files (configs, token lists), shared by
// Config::from_file and the command-line tools.
//
// A path that names a FIFO, a socket, a device, a directory or a file of a pseudo filesystem
// (/proc, /sys) is refused before a byte is read: such a file can block for ever, never end, or
// report a size that is not its content. Regular files are read up to a limit (64 MiB by default);
// a larger file, or one that grows past the limit while it is read, is an error, as is any read
// error (the message carries strerror).
//
// Thread safety: the functions keep no state; concurrent calls are fine. They block the calling
// thread on the read (never on an open: the file is opened with O_NONBLOCK).

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace hss::detail {

/// The default limit on the size of an input file: 64 MiB.
inline constexpr size_t kMaxInputFileBytes = size_t{64} << 20;

/// The whole content of the regular file at `path`. `what` names the file in messages ("config
/// file", "token file"). Throws hss::Error naming the path and the problem.
[[nodiscard]] std::string read_regular_file(const std::filesystem::path& path,
                                            std::string_view what,
                                            size_t max_bytes = kMaxInputFileBytes);

/// Everything readable from the open descriptor `fd` (a pipe or terminal for stdin included) until
/// end of file, up to `max_bytes`; more is an error. Throws hss::Error naming `what`.
[[nodiscard]] std::string read_stream_fd(int fd, std::string_view what,
                                         size_t max_bytes = kMaxInputFileBytes);

}  // namespace hss::detail
