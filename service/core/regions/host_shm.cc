#include "service/core/regions/host_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace samplerd::core {
namespace {

// Longest shm key: the name of a file under /dev/shm (NAME_MAX), plus the leading '/'.
constexpr size_t kMaxKeyBytes = 255;

absl::Status BadKey(absl::string_view what, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("expected a host_shm.key ", what, ", got ", got));
}

// Opens `key` read-write, else read-only when only that is allowed. Returns the descriptor or
// -1 with errno set. O_NONBLOCK: a FIFO planted under the key would otherwise block a read-only
// open until some writer appears (forever, on the gRPC thread of the call); the caller refuses
// anything but a regular file once it is open. It changes nothing for regular files and mmap.
int OpenShm(const std::string& key, bool* writable) {
  int fd = shm_open(key.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
  *writable = fd >= 0;
  if (fd < 0 && (errno == EACCES || errno == EROFS))
    fd = shm_open(key.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
  return fd;
}

absl::Status OpenError(int error) {
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(
          "expected an existing shm object for host_shm.key, got none (the engine creates it "
          "with shm_open before registering)");
    case EACCES:
      return absl::PermissionDeniedError(
          "expected a shm object samplerd may open, got one its user may not read (check the "
          "object's owner and mode)");
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(absl::StrCat(
          "expected a valid host_shm.key, got one shm_open refuses (", std::strerror(error), ")"));
    case EINVAL:  // the key passed ValidateShmKey: glibc's shm_open reports EISDIR as EINVAL
      return absl::FailedPreconditionError(
          "expected a shm object (a regular file under /dev/shm), got a key shm_open refuses "
          "with EINVAL (a directory)");
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("expected to open the shm object, got: ", std::strerror(error)));
  }
}

}  // namespace

absl::Status ValidateShmPrefix(absl::string_view prefix) {
  if (prefix.size() < 2 || prefix[0] != '/' || prefix.find('/', 1) != absl::string_view::npos ||
      absl::StrContains(prefix, "..") || absl::StrContains(prefix, absl::string_view("\0", 1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --shm_prefix to start with '/' followed by at least one character and no "
        "further '/' or \"..\" (e.g. \"/samplerd-\"), got \"",
        prefix, "\""));
  }
  return absl::OkStatus();
}

absl::Status ValidateShmKey(absl::string_view key, absl::string_view prefix) {
  if (key.empty()) return BadKey("(shm_open name)", "an empty key");
  if (!absl::StartsWith(key, prefix)) {
    return BadKey(absl::StrCat("that starts with \"", prefix, "\" (the server's --shm_prefix)"),
                  "one that does not");
  }
  if (key.size() == prefix.size()) {
    return BadKey(absl::StrCat("with a name after the prefix \"", prefix, "\""), "none");
  }
  if (key.find('/', 1) != absl::string_view::npos) {
    return BadKey("with no '/' after the leading one", "one with more");
  }
  if (absl::StrContains(key, "..")) return BadKey("without \"..\"", "one with \"..\"");
  if (absl::StrContains(key, absl::string_view("\0", 1))) {
    return BadKey("without NUL bytes", "one with a NUL byte");
  }
  if (key.size() > kMaxKeyBytes) {
    return BadKey(absl::StrCat("of at most ", kMaxKeyBytes, " bytes"),
                  absl::StrCat(key.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostShmMapping> MapHostShm(const std::string& key, uint64_t offset,
                                          uint64_t byte_size,
                                          const std::function<absl::Status()>& before_map) {
  if (byte_size == 0) {
    return absl::InvalidArgumentError("expected host_shm.byte_size >= 1, got 0");
  }
  HostShmMapping mapping;
  const int fd = OpenShm(key, &mapping.writable);
  if (fd < 0) return OpenError(errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("expected to fstat the shm object, got: ", std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode) || st.st_size < 0) {
    close(fd);
    return absl::FailedPreconditionError(
        "expected a shm object (a regular file under /dev/shm), got another kind of file");
  }
  // Overflow-safe: offset + byte_size <= object is never computed directly.
  const uint64_t object = static_cast<uint64_t>(st.st_size);
  if (offset > object || byte_size > object - offset) {
    close(fd);
    return absl::OutOfRangeError(
        absl::StrCat("expected host_shm.offset + host_shm.byte_size <= the object's size of ",
                     object, " bytes, got offset ", offset, " and byte_size ", byte_size));
  }
  if (before_map) {
    if (absl::Status status = before_map(); !status.ok()) {
      close(fd);
      return status;
    }
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t map_offset = offset - offset % page;
  const uint64_t delta = offset - map_offset;
  mapping.length = static_cast<size_t>(delta + byte_size);  // <= object: no overflow
  const int prot = PROT_READ | (mapping.writable ? PROT_WRITE : 0);
  mapping.base =
      mmap(nullptr, mapping.length, prot, MAP_SHARED, fd, static_cast<off_t>(map_offset));
  const int error = errno;
  close(fd);  // the mapping keeps the object alive
  if (mapping.base == MAP_FAILED) {
    if (error == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat("expected address space for ", mapping.length, " bytes, got ENOMEM"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("expected to map the shm object, got: ", std::strerror(error)));
  }
  mapping.data = static_cast<uint8_t*>(mapping.base) + delta;
  mapping.size = byte_size;
  mapping.object_dev = static_cast<uint64_t>(st.st_dev);
  mapping.object_ino = static_cast<uint64_t>(st.st_ino);
  mapping.object_offset = offset;
  return mapping;
}

void UnmapHostShm(const HostShmMapping& mapping) {
  if (mapping.base != nullptr) munmap(mapping.base, mapping.length);
}

}  // namespace samplerd::core
