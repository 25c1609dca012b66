// samplerd::HostShmBuffer: a POSIX shared-memory object owned by the engine (or a test), mapped
// read-write, ready to be registered with Client::RegisterHostShm.
//
//   std::string error;
//   std::unique_ptr<samplerd::HostShmBuffer> buffer =
//       samplerd::HostShmBuffer::Create("/samplerd-engine0", bytes, &error);
//   std::memcpy(buffer->data(), logits, bytes);
//   client.RegisterHostShm("engine0", buffer->key(), 0, buffer->size());
//
// The destructor unmaps the buffer and unlinks the key: unregister the region first (the server
// keeps its own mapping until then, so the memory stays valid for it either way).
#ifndef SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_HOST_SHM_BUFFER_H_
#define SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_HOST_SHM_BUFFER_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

namespace samplerd {

class HostShmBuffer {
 public:
  // Opens or creates (O_CREAT | O_RDWR) the shm object `key` ("/name", no further '/') with
  // `mode`, makes it at least `bytes` (> 0) long and maps `bytes` of it read-write. An existing
  // object is grown when shorter, never shrunk (another buffer on the key, or the server, may
  // map more of it). Returns null and stores the reason in *error (when not null) on failure;
  // only an object this call created is unlinked then. Two buffers on one key share the
  // object; the first destroyed unlinks the key.
  static std::unique_ptr<HostShmBuffer> Create(const std::string& key, size_t bytes,
                                               std::string* error = nullptr, mode_t mode = 0600);

  // Unmaps the buffer and unlinks its key.
  ~HostShmBuffer();
  HostShmBuffer(const HostShmBuffer&) = delete;
  HostShmBuffer& operator=(const HostShmBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& key() const { return key_; }

 private:
  HostShmBuffer(std::string key, void* data, size_t size)
      : key_(std::move(key)), data_(data), size_(size) {}

  std::string key_;
  void* data_;
  size_t size_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_HOST_SHM_BUFFER_H_
