// Helpers shared by the fuzz targets: the checks that turn a wrong answer into a finding, gRPC
// byte buffers from fuzz input, host shm objects under a per-process prefix, and a CPU core.
#ifndef SAMPLERD_TESTS_FUZZ_FUZZ_UTIL_H_
#define SAMPLERD_TESTS_FUZZ_FUZZ_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/core/sampler_core.h"

namespace samplerd::fuzz {

// Reports a finding: prints `what` and aborts (libFuzzer saves the input as a crash).
[[noreturn]] void Fail(absl::string_view what);

// A finding unless `condition` holds.
inline void Check(bool condition, absl::string_view what) {
  if (!condition) Fail(what);
}

// A finding when `status` is an error with an empty message, or with a code outside `codes`.
// `where` names the call in the report.
void CheckError(const absl::Status& status, std::initializer_list<absl::StatusCode> codes,
                absl::string_view where);

// With SAMPLERD_FUZZ_VERBOSE=1 in the environment (e.g. when running one seed by hand), prints
// `what` with its status to stderr.
void Trace(absl::string_view what, const absl::Status& status);

// One slice holding a copy of `data`.
grpc::ByteBuffer BufferOf(const uint8_t* data, size_t size);

// Consumes fuzz input from the front.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  uint8_t Byte();           // 0 when empty
  uint64_t U64(int bytes);  // little-endian, the missing bytes 0
  // `n` bytes (fewer when the input ends).
  std::string Bytes(size_t n);
  // A length-prefixed message: a 2-byte little-endian length, then that many bytes.
  std::string Message();
  // Everything left.
  std::string Rest();

 private:
  const uint8_t* data_;
  size_t size_;
};

// Host shm objects for the process: created under Prefix() at first use, unlinked at exit.
// Object i has key Prefix() + "obj" + i and ObjectSizes()[i] bytes (mode 0600; the last one is
// read-only, 0400, owned by us).
const std::string& Prefix();
const std::vector<uint64_t>& ObjectSizes();
std::string ObjectKey(size_t i);
void CreateObjects();

// A CPU core with small limits (batch 8, vocab 4096) and the shm prefix above; its registry
// holds host shm region "r" (all of object 2, 64 KiB) and session regions ("ctl", "buf").
core::SamplerCore& Core();

}  // namespace samplerd::fuzz

#endif  // SAMPLERD_TESTS_FUZZ_FUZZ_UTIL_H_
