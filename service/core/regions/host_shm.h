// Host POSIX shared memory for regions: key checks and page-aligned mappings of a byte range.
//
// docs/DESIGN.md "Transports and GPU rules": keys start with a configured prefix and hold no
// further '/' and no ".."; the object's size comes from fstat and bounds are checked without
// overflow; the mapping starts at the page holding `offset`; the descriptor is closed as soon as
// the object is mapped. Error messages never echo the key.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_HOST_SHM_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_HOST_SHM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace samplerd::core {

// One mapped byte range of a shm object.
struct HostShmMapping {
  void* base = nullptr;     // what mmap returned (page-aligned)
  size_t length = 0;        // bytes mapped from `base`
  uint8_t* data = nullptr;  // the range's first byte: base + (offset % page size)
  uint64_t size = 0;        // the range's byte size
  bool writable = false;    // mapped PROT_WRITE (the object could be opened read-write)
  // Which object and where in it: the same bytes registered under two names (or mapped twice)
  // have the same (object_dev, object_ino, object_offset).
  uint64_t object_dev = 0;
  uint64_t object_ino = 0;
  uint64_t object_offset = 0;  // of `data`
};

// OK when `prefix` can serve as --shm_prefix: it starts with '/', holds no further '/' and no
// "..", and has at least one character after the '/'. Else INVALID_ARGUMENT (the prefix is
// configuration, not a secret, and is echoed).
absl::Status ValidateShmPrefix(absl::string_view prefix);

// OK when `key` starts with `prefix`, has a non-empty name after it, holds no '/' after the
// leading one, no ".." and no NUL, and is at most 255 bytes long. Else INVALID_ARGUMENT; the
// message never contains the key.
absl::Status ValidateShmKey(absl::string_view key, absl::string_view prefix);

// Maps [offset, offset + byte_size) of the shm object `key` (already validated). Opens it
// read-write, or read-only when the object's mode allows no more (then `writable` is false).
// Errors (never echoing the key): INVALID_ARGUMENT for byte_size 0; NOT_FOUND when no object has
// this key; PERMISSION_DENIED when samplerd may not open it; OUT_OF_RANGE when the range does
// not fit in the object's size (checked without overflow); RESOURCE_EXHAUSTED when the address
// space is exhausted; FAILED_PRECONDITION for other system errors. `before_map`, when set, runs
// once the range is known to fit, right before the mapping: its error is returned as it is,
// with nothing mapped. The caller owns the mapping and releases it with UnmapHostShm. Cost: a
// few system calls.
absl::StatusOr<HostShmMapping> MapHostShm(const std::string& key, uint64_t offset,
                                          uint64_t byte_size,
                                          const std::function<absl::Status()>& before_map = {});

// Unmaps a mapping returned by MapHostShm (exactly once).
void UnmapHostShm(const HostShmMapping& mapping);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_HOST_SHM_H_
