// Host shm keys and mappings: prefix and key rules, overflow-safe bounds, page-aligned maps of
// unaligned offsets, the read-only fallback, and messages that never echo the key.
#include "service/core/regions/host_shm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/core/shm_test_util.h"

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPrefix[] = "/samplerd-";
constexpr char kSecret[] = "s3cr3t";  // a key part that must never appear in a message

TEST(ValidateShmPrefix, AcceptsTheDefaultAndRefusesUnsafePrefixes) {
  EXPECT_TRUE(ValidateShmPrefix("/samplerd-").ok());
  EXPECT_TRUE(ValidateShmPrefix("/e").ok());
  for (const char* bad : {"", "/", "samplerd-", "/a/b", "/..x", "/a/"}) {
    EXPECT_EQ(ValidateShmPrefix(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

struct KeyCase {
  std::string name;
  std::string key;
};

TEST(ValidateShmKey, RefusesEveryUnsafeKeyWithoutEchoingIt) {
  const std::string s = kSecret;
  const std::vector<KeyCase> cases = {
      {"empty", ""},
      {"wrong prefix", "/other-" + s},
      {"no leading slash", "samplerd-" + s},
      {"prefix only", "/samplerd-"},
      {"extra slash", "/samplerd-" + s + "/x"},
      {"dot dot", "/samplerd-.." + s},
      {"dot dot after slash", "/samplerd-/../" + s},
      {"NUL byte", std::string("/samplerd-a\0", 12) + s},
      {"too long", "/samplerd-" + s + std::string(300, 'x')},
  };
  for (const KeyCase& c : cases) {
    const absl::Status status = ValidateShmKey(c.key, kPrefix);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(status.message()), HasSubstr("expected")) << c.name;
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr(kSecret))) << c.name;
  }
  EXPECT_TRUE(ValidateShmKey("/samplerd-engine0.logits_1", kPrefix).ok());
}

TEST(MapHostShm, MapsAnUnalignedRangeFromItsPage) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  TestShm shm(3 * page + 100);
  ASSERT_TRUE(shm.ok());
  const uint64_t offset = page + 10;
  absl::StatusOr<HostShmMapping> m = MapHostShm(shm.key(), offset, 2 * page);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->base) % page, 0u);
  EXPECT_EQ(m->data, static_cast<uint8_t*>(m->base) + 10);
  EXPECT_EQ(m->size, 2 * page);
  EXPECT_TRUE(m->writable);
  for (size_t i : {size_t{0}, size_t{1}, 2 * page - 1}) {
    EXPECT_EQ(m->data[i], shm.data()[offset + i]) << i;
  }
  m->data[5] = 0xab;  // shared: the producer sees it
  EXPECT_EQ(shm.data()[offset + 5], 0xab);
  UnmapHostShm(*m);
}

TEST(MapHostShm, TheWholeObjectFits) {
  TestShm shm(4096);
  ASSERT_TRUE(shm.ok());
  absl::StatusOr<HostShmMapping> m = MapHostShm(shm.key(), 0, 4096);
  ASSERT_TRUE(m.ok()) << m.status();
  UnmapHostShm(*m);
  m = MapHostShm(shm.key(), 4095, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->data[0], shm.data()[4095]);
  UnmapHostShm(*m);
}

TEST(MapHostShm, RangesPastTheEndAreOutOfRangeWithoutOverflow) {
  TestShm shm(1000, 0600, kSecret);
  ASSERT_TRUE(shm.ok());
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 1001}, {1, 1000}, {1000, 1}, {1001, 1}, {max, 1}, {1, max}, {max, max}, {16, max - 15}};
  for (const auto& [offset, size] : ranges) {
    absl::StatusOr<HostShmMapping> m = MapHostShm(shm.key(), offset, size);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kOutOfRange) << offset << " + " << size;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("1000 bytes"));
    EXPECT_THAT(std::string(m.status().message()), Not(HasSubstr(kSecret)));
  }
}

TEST(MapHostShm, ZeroBytesIsInvalid) {
  TestShm shm(64);
  ASSERT_TRUE(shm.ok());
  EXPECT_EQ(MapHostShm(shm.key(), 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MapHostShm, AMissingObjectIsNotFoundWithoutEchoingTheKey) {
  const std::string key = UniqueShmKey(kSecret);
  absl::StatusOr<HostShmMapping> m = MapHostShm(key, 0, 64);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(m.status().message()), Not(HasSubstr(kSecret)));
}

TEST(MapHostShm, AReadOnlyObjectIsMappedReadOnly) {
  TestShm shm(4096, 0444);
  ASSERT_TRUE(shm.ok());
  const std::string key = shm.key();
  EXPECT_EQ(RunUnprivileged([&]() -> std::string {
              absl::StatusOr<HostShmMapping> m = MapHostShm(key, 0, 4096);
              if (!m.ok()) return std::string(m.status().message());
              const bool writable = m->writable;
              const uint8_t first = m->data[7];
              UnmapHostShm(*m);
              if (writable) return "mapped writable";
              return first == 7 ? "" : "wrong bytes";
            }),
            "");
}

TEST(MapHostShm, AnObjectSamplerdMayNotReadIsPermissionDenied) {
  TestShm shm(4096, 0600);
  ASSERT_TRUE(shm.ok());
  if (geteuid() != 0) GTEST_SKIP() << "needs root to test as another user";
  const std::string key = shm.key();
  EXPECT_EQ(RunUnprivileged([&]() -> std::string {
              absl::StatusOr<HostShmMapping> m = MapHostShm(key, 0, 4096);
              if (m.status().code() == absl::StatusCode::kPermissionDenied) return "";
              return "got " + m.status().ToString();
            }),
            "");
}

// A FIFO under /dev/shm that samplerd may only read: shm_open of it read-only would wait for a
// writer forever, holding the gRPC thread of the RegisterRegion call (a few of them hung the
// whole server). It must be refused at once, like any other object that is not a regular file.
TEST(MapHostShm, AFifoSamplerdMayOnlyReadIsRefusedWithoutBlocking) {
  const std::string key = UniqueShmKey("fifo");
  const std::string path = "/dev/shm" + key;
  ASSERT_EQ(mkfifo(path.c_str(), 0444), 0);
  ASSERT_EQ(chmod(path.c_str(), 0444), 0);  // the umask may have narrowed it
  EXPECT_EQ(RunUnprivileged([&]() -> std::string {
              alarm(10);  // a blocked open ends the child: "the check crashed"
              absl::StatusOr<HostShmMapping> m = MapHostShm(key, 0, 64);
              alarm(0);
              if (m.ok()) {
                UnmapHostShm(*m);
                return "mapped a FIFO";
              }
              if (m.status().code() != absl::StatusCode::kFailedPrecondition) {
                return "got " + m.status().ToString();
              }
              return "";
            }),
            "");
  unlink(path.c_str());
}

// A directory under /dev/shm is another kind of file, like a FIFO: the key itself is well formed
// (shm_open reports EISDIR as EINVAL, which said "expected a valid host_shm.key").
TEST(MapHostShm, ADirectoryIsRefusedAsAnotherKindOfFile) {
  const std::string key = UniqueShmKey("dir");
  const std::string path = "/dev/shm" + key;
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  absl::StatusOr<HostShmMapping> m = MapHostShm(key, 0, 64);
  rmdir(path.c_str());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("expected a shm object (a regular file under /dev/shm), got"));
}

}  // namespace
}  // namespace samplerd::core
