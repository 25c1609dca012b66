#include "tests/fuzz/fuzz_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace samplerd::fuzz {

void Fail(absl::string_view what) {
  std::fprintf(stderr, "FUZZ FINDING: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

void CheckError(const absl::Status& status, std::initializer_list<absl::StatusCode> codes,
                absl::string_view where) {
  if (status.ok()) return;
  if (status.message().empty()) {
    Fail(absl::StrCat(where, ": error ", absl::StatusCodeToString(status.code()),
                      " has no message"));
  }
  for (absl::StatusCode code : codes) {
    if (status.code() == code) return;
  }
  Fail(absl::StrCat(where, ": unexpected ", status.ToString()));
}

void Trace(absl::string_view what, const absl::Status& status) {
  static const bool verbose = [] {
    const char* env = std::getenv("SAMPLERD_FUZZ_VERBOSE");
    return env != nullptr && env[0] == '1';
  }();
  if (!verbose) return;
  const std::string line = absl::StrCat(what, ": ", status.ToString(), "\n");
  std::fputs(line.c_str(), stderr);
}

grpc::ByteBuffer BufferOf(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  return grpc::ByteBuffer(&slice, 1);
}

uint8_t Input::Byte() {
  if (size_ == 0) return 0;
  --size_;
  return *data_++;
}

uint64_t Input::U64(int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{Byte()} << (8 * i);
  return value;
}

std::string Input::Bytes(size_t n) {
  if (n > size_) n = size_;
  std::string out(reinterpret_cast<const char*>(data_), n);
  data_ += n;
  size_ -= n;
  return out;
}

std::string Input::Message() { return Bytes(static_cast<size_t>(U64(2))); }

std::string Input::Rest() { return Bytes(size_); }

const std::string& Prefix() {
  static const std::string prefix = absl::StrCat("/samplerd-fuzz-", getpid(), "-");
  return prefix;
}

const std::vector<uint64_t>& ObjectSizes() {
  // Around a page, a session's buffers, 64 KiB, an odd size, one byte; the last is read-only.
  static const std::vector<uint64_t> sizes = {4096, 8192, 65536, 5000, 1, 4096};
  return sizes;
}

std::string ObjectKey(size_t i) { return absl::StrCat(Prefix(), "obj", i); }

namespace {

void UnlinkObjects() {
  for (size_t i = 0; i < ObjectSizes().size(); ++i) shm_unlink(ObjectKey(i).c_str());
}

}  // namespace

void CreateObjects() {
  static const bool created = [] {
    const std::vector<uint64_t>& sizes = ObjectSizes();
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string key = ObjectKey(i);
      const mode_t mode = i + 1 == sizes.size() ? 0400 : 0600;
      const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR | O_TRUNC, mode);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(sizes[i])) != 0) {
        Fail(absl::StrCat("cannot create shm object ", key, ": ", std::strerror(errno)));
      }
      // Bytes that decode as small fp32 logits and in-range token ids: 1.0f and 0.
      void* p = mmap(nullptr, sizes[i], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) Fail("cannot map a shm object");
      for (uint64_t b = 0; b + 4 <= sizes[i]; b += 8) {
        const float one = 1.0f;
        std::memcpy(static_cast<uint8_t*>(p) + b, &one, 4);
      }
      munmap(p, sizes[i]);
      fchmod(fd, mode);
      close(fd);
    }
    std::atexit(UnlinkObjects);
    return true;
  }();
  (void)created;
}

core::SamplerCore& Core() {
  static core::SamplerCore* const core = [] {
    CreateObjects();
    core::CoreOptions options;
    options.backend = core::BackendChoice::kCpu;
    options.threads = 1;
    options.limits.max_batch = 8;
    options.limits.max_vocab = 4096;
    options.limits.max_top_logprobs = 8;
    options.regions.shm_prefix = Prefix();
    options.sessions.max_sessions = 2;
    options.sessions.host.threads = 1;
    options.sessions.host.spin_us = 0;
    absl::StatusOr<std::unique_ptr<core::SamplerCore>> created = core::SamplerCore::Create(options);
    if (!created.ok()) Fail(absl::StrCat("cannot create the core: ", created.status().ToString()));
    core::RegionRegistry& regions = (*created)->regions();
    Check(regions.RegisterHostShm("r", ObjectKey(2), 0, ObjectSizes()[2]).ok(), "region r");
    Check(regions.RegisterHostShm("ctl", ObjectKey(0), 0, ObjectSizes()[0]).ok(), "region ctl");
    Check(regions.RegisterHostShm("buf", ObjectKey(1), 0, ObjectSizes()[1]).ok(), "region buf");
    return created->release();  // lives for the process: libFuzzer exits without unwinding
  }();
  return *core;
}

}  // namespace samplerd::fuzz
