// samplerd::HostShmBuffer: shm_open + ftruncate + mmap, undone by munmap + shm_unlink.
#include "samplerd/host_shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

namespace samplerd {
namespace {

std::unique_ptr<HostShmBuffer> Fail(std::string* error, const char* what, int code) {
  if (error != nullptr) *error = std::string(what) + ": " + std::strerror(code);
  return nullptr;
}

}  // namespace

std::unique_ptr<HostShmBuffer> HostShmBuffer::Create(const std::string& key, size_t bytes,
                                                     std::string* error, mode_t mode) {
  if (bytes == 0) return Fail(error, "HostShmBuffer needs at least one byte", EINVAL);
  // Created here, or opened as it is: only an object made here is unlinked on failure.
  bool created = true;
  int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, mode);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = shm_open(key.c_str(), O_RDWR | O_CLOEXEC, mode);
  }
  if (fd < 0) return Fail(error, "shm_open", errno);
  const auto fail = [&](const char* what, int code) {
    close(fd);
    if (created) shm_unlink(key.c_str());
    return Fail(error, what, code);
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return fail("fstat", errno);
  // Grow only: an existing object may be mapped further by another buffer on the key, or by
  // the server as a registered region, and shrinking it would fault their accesses (SIGBUS).
  if (static_cast<uint64_t>(st.st_size) < bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail("ftruncate", errno);
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap", errno);
  close(fd);
  return std::unique_ptr<HostShmBuffer>(new HostShmBuffer(key, data, bytes));
}

HostShmBuffer::~HostShmBuffer() {
  munmap(data_, size_);
  shm_unlink(key_.c_str());
}

}  // namespace samplerd
