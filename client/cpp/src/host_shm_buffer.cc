// samplerd::HostShmBuffer: shm_open + ftruncate + mmap, undone by munmap + shm_unlink.
#include "samplerd/host_shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
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
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, mode);
  if (fd < 0) return Fail(error, "shm_open", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int code = errno;
    close(fd);
    shm_unlink(key.c_str());
    return Fail(error, "ftruncate", code);
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int code = errno;
  close(fd);
  if (data == MAP_FAILED) {
    shm_unlink(key.c_str());
    return Fail(error, "mmap", code);
  }
  return std::unique_ptr<HostShmBuffer>(new HostShmBuffer(key, data, bytes));
}

HostShmBuffer::~HostShmBuffer() {
  munmap(data_, size_);
  shm_unlink(key_.c_str());
}

}  // namespace samplerd
