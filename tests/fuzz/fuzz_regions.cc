// Fuzz target: region registration, leases and unregistration against real host shm objects
// (under a per-process prefix, fuzz_util.h) and GPU IPC handles of a fake GpuIpc, in a fresh
// RegionRegistry per input. The input is a sequence of operations (register host shm, register
// GPU IPC, acquire, release, unregister, list); names, keys, handles, offsets and sizes come from
// the input, biased towards the interesting ones (the objects' real keys and sizes, edges, and
// values whose sum overflows).
//
// A model of the registry (names, sizes, leases) is the oracle: a host shm registration
// succeeds exactly when the name is valid and free, the key names one of our objects and the
// range fits (without overflow); an acquire exactly when the name is registered and the slice
// fits; an unregister exactly when the name is registered; List() is the model. Leased bytes are
// read (first and last) so that a view outside its mapping faults. After each input (the
// registry destroyed), no file descriptor may be left open, nor (checked after the first 64
// inputs and every 1024th) a mapping of our shm objects.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/core/regions/region_registry.h"
#include "tests/core/fake_gpu_ipc.h"
#include "tests/fuzz/fuzz_util.h"

namespace samplerd::fuzz {
namespace {

using absl::StatusCode;

constexpr char kDevice[] = "0000:00:06.0";
constexpr uint64_t kIpcBytes = 8192;

struct Ipc {
  core::FakeGpuIpc fake;
  std::vector<uint8_t> memory = std::vector<uint8_t>(kIpcBytes, 7);
  std::string handle = fake.Export(&memory);
};

Ipc& GetIpc() {
  static Ipc* const ipc = new Ipc();
  return *ipc;
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string Name(Input& in) {
  const uint8_t b = in.Byte();
  if (b < 240) return std::string(1, static_cast<char>('a' + b % 4));
  return in.Bytes(in.Byte() % 8);  // often invalid: empty, '/', NUL, non-ASCII
}

// An offset or size: small values, a page's edges, an object's size, huge values, raw bytes.
uint64_t Number(Input& in) {
  const uint8_t b = in.Byte();
  switch (b % 8) {
    case 0:
      return b / 8;
    case 1:
      return 4096 + (b / 8) - 16;
    case 2:
      return ObjectSizes()[(b / 8) % ObjectSizes().size()];
    case 3:
      return ~uint64_t{0} - (b / 8);
    case 4:
      return uint64_t{1} << (b / 8 % 64);
    case 5:
      return in.U64(2);
    default:
      return in.U64(8);
  }
}

struct Region {
  uint64_t size = 0;
  bool host = true;
};

struct Lease {
  core::RegionLease lease;
  uint64_t bytes = 0;
};

class Run {
 public:
  Run()
      : registry_(core::RegionOptions{Prefix()}, &GetIpc().fake,
                  {core::IpcDevice{0, kDevice, "GPU-fuzz"}}) {}

  void Step(Input& in) {
    switch (in.Byte() % 7) {
      case 0:
        RegisterHost(in);
        break;
      case 1:
        RegisterIpc(in);
        break;
      case 2:
        Acquire(in);
        break;
      case 3:
        if (!leases_.empty()) leases_.erase(leases_.begin() + in.Byte() % leases_.size());
        break;
      case 4:
        Unregister(in);
        break;
      case 5:
        List();
        break;
      default:
        leases_.clear();
        break;
    }
  }

 private:
  void RegisterHost(Input& in) {
    const std::string name = Name(in);
    const uint8_t k = in.Byte();
    std::string key;
    if (k < 200) {
      key = ObjectKey(k % ObjectSizes().size());
    } else if (k < 230) {
      key = Prefix() + in.Bytes(in.Byte() % 16);
    } else {
      key = in.Bytes(in.Byte() % 32);
    }
    const uint64_t offset = Number(in);
    const uint64_t size = Number(in);
    absl::StatusOr<core::RegionInfo> info = registry_.RegisterHostShm(name, key, offset, size);
    Trace(absl::StrCat("RegisterHostShm ", offset, " ", size), info.status());
    CheckError(info.status(),
               {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange,
                StatusCode::kPermissionDenied, StatusCode::kAlreadyExists},
               "RegisterHostShm");

    bool known = false;
    uint64_t object = 0;
    for (size_t i = 0; i < ObjectSizes().size(); ++i) {
      if (key == ObjectKey(i)) {
        known = true;
        object = ObjectSizes()[i];
      }
    }
    const bool fits = size > 0 && offset <= object && size <= object - offset;
    const bool expect = ValidName(name) && !regions_.count(name) && known && fits;
    Check(info.ok() == expect,
          absl::StrCat("RegisterHostShm(name ok ", ValidName(name), ", taken ",
                       regions_.count(name), ", known key ", known, ", offset ", offset, ", size ",
                       size, ", object ", object, "): ", info.status().ToString()));
    if (!info.ok()) return;
    Check(info->byte_size == size && info->name == name, "RegisterHostShm's RegionInfo");
    regions_[name] = Region{size, true};
  }

  void RegisterIpc(Input& in) {
    const std::string name = Name(in);
    const uint8_t h = in.Byte();
    std::string handle;
    if (h < 100) {
      handle = GetIpc().handle;
    } else if (h < 150) {
      handle = std::string("\x02", 1) + static_cast<char>(h < 140 ? 'c' : 'e') + GetIpc().handle;
    } else {
      handle = in.Bytes(in.Byte() % 80);
    }
    const uint8_t d = in.Byte();
    const std::string device = d < 100 ? kDevice : d < 200 ? "GPU-fuzz" : in.Bytes(d % 16);
    const uint64_t offset = Number(in);
    const uint64_t size = Number(in);
    absl::StatusOr<core::RegionInfo> info =
        registry_.RegisterGpuIpc(name, handle, offset, size, device);
    Trace(absl::StrCat("RegisterGpuIpc ", offset, " ", size), info.status());
    CheckError(info.status(),
               {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange,
                StatusCode::kFailedPrecondition, StatusCode::kAlreadyExists},
               "RegisterGpuIpc");
    if (!info.ok()) return;
    const bool fits = size > 0 && offset <= kIpcBytes && size <= kIpcBytes - offset;
    Check(ValidName(name) && !regions_.count(name) && fits,
          absl::StrCat("RegisterGpuIpc accepted a bad registration: offset ", offset, ", size ",
                       size));
    Check(info->byte_size == size && info->device == kDevice, "RegisterGpuIpc's RegionInfo");
    regions_[name] = Region{size, false};
  }

  void Acquire(Input& in) {
    const std::string name = Name(in);
    const uint64_t offset = Number(in);
    const uint64_t bytes = Number(in);
    absl::StatusOr<core::RegionLease> lease = registry_.Acquire(name, offset, bytes);
    Trace(absl::StrCat("Acquire ", offset, " ", bytes), lease.status());
    CheckError(lease.status(),
               {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange},
               "Acquire");
    auto it = regions_.find(name);
    const bool expect =
        it != regions_.end() && offset <= it->second.size && bytes <= it->second.size - offset;
    Check(lease.ok() == expect,
          absl::StrCat("Acquire(registered ", it != regions_.end(), ", offset ", offset, ", bytes ",
                       bytes, "): ", lease.status().ToString()));
    if (!lease.ok()) return;
    const core::RegionView& view = lease->view();
    Check(view.size == bytes, "the lease's view has another size");
    if (bytes > 0) {
      volatile uint8_t sum = view.data[0];
      sum = sum + view.data[bytes - 1];
      (void)sum;
    }
    if (leases_.size() < 8) leases_.push_back(Lease{std::move(*lease), bytes});
  }

  void Unregister(Input& in) {
    const std::string name = Name(in);
    const absl::Status status = registry_.Unregister(name);
    Trace("Unregister", status);
    CheckError(status, {StatusCode::kInvalidArgument, StatusCode::kNotFound}, "Unregister");
    Check(status.ok() == (regions_.erase(name) == 1),
          absl::StrCat("Unregister: ", status.ToString()));
  }

  void List() {
    const std::vector<core::RegionInfo> listed = registry_.List();
    Check(listed.size() == regions_.size(),
          absl::StrCat("List(): ", listed.size(), " regions, expected ", regions_.size()));
    auto it = regions_.begin();
    for (const core::RegionInfo& info : listed) {
      Check(info.name == it->first && info.byte_size == it->second.size &&
                (info.kind == core::RegionKind::kHostShm) == it->second.host,
            "List() differs from the registered regions");
      ++it;
    }
  }

  core::RegionRegistry registry_;
  std::map<std::string, Region> regions_;  // what is registered, by name (sorted like List())
  std::vector<Lease> leases_;              // after registry_: released first
};

// Mappings of our shm objects in this process (lines of /proc/self/maps naming the prefix).
int ShmMappings() {
  static const std::string needle = "/dev/shm" + Prefix();
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  Check(maps != nullptr, "cannot read /proc/self/maps");
  int count = 0;
  char line[4096];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    if (std::strstr(line, needle.c_str()) != nullptr) ++count;
  }
  std::fclose(maps);
  return count;
}

int LowestFreeFd() {
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  close(fd);
  return fd;
}

}  // namespace
}  // namespace samplerd::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  samplerd::fuzz::CreateObjects();
  samplerd::fuzz::GetIpc();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT
  const int baseline_fd = fuzz::LowestFreeFd();
  {
    fuzz::Input input(data, size);
    fuzz::Run run;
    for (int steps = 0; !input.empty() && steps < 64; ++steps) run.Step(input);
  }
  const int fd = fuzz::LowestFreeFd();
  if (fd != baseline_fd) {
    char target[256] = {};
    const std::string link = absl::StrCat("/proc/self/fd/", baseline_fd);
    (void)!readlink(link.c_str(), target, sizeof(target) - 1);
    fuzz::Fail(absl::StrCat("file descriptors leaked: the lowest free one is ", fd, ", was ",
                            baseline_fd, "; ", link, " is ", target));
  }
  // Reading /proc/self/maps costs ~1 ms, so it is read after the first 64 inputs and then
  // after every 1024th: a leaked mapping stays, and is found within 1024 inputs.
  static uint64_t runs = 0;
  if (++runs <= 64 || runs % 1024 == 0) {
    const int mappings = fuzz::ShmMappings();
    fuzz::Check(mappings == 0, absl::StrCat(mappings, " shm mappings left after the registry"));
  }
  return 0;
}
