// GuardedCopy: copies from a mapping whose file shrank return false instead of killing the
// process, on any thread and any number of times; ordinary copies are plain memcpy.
#include "service/core/backend/guarded_copy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd::core {
namespace {

// A two-page file mapped shared, filled with 0x5a.
class ShrinkingMapping : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/samplerd-guarded-XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0);
    unlink(path);
    bytes_ = 2 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(bytes_)), 0);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    ASSERT_NE(p, MAP_FAILED);
    data_ = static_cast<char*>(p);
    std::memset(data_, 0x5a, bytes_);
  }
  void TearDown() override {
    if (data_ != nullptr) munmap(data_, bytes_);
    if (fd_ >= 0) close(fd_);
  }
  int fd_ = -1;
  size_t bytes_ = 0;
  char* data_ = nullptr;
};

TEST_F(ShrinkingMapping, CopiesLikeMemcpyWhileTheFileCoversTheMapping) {
  std::vector<char> out(bytes_, 0);
  ASSERT_TRUE(GuardedCopy(out.data(), data_, bytes_));
  EXPECT_EQ(out, std::vector<char>(bytes_, 0x5a));
  std::vector<char> in(16, 0x11);
  ASSERT_TRUE(GuardedCopy(data_ + 8, in.data(), in.size()));
  EXPECT_EQ(data_[8], 0x11);
  EXPECT_EQ(data_[24], 0x5a);
}

TEST_F(ShrinkingMapping, ReadingOrWritingPastTheEndReturnsFalseEveryTime) {
  ASSERT_EQ(ftruncate(fd_, 0), 0);
  std::vector<char> out(bytes_, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(GuardedCopy(out.data(), data_, bytes_)) << "read " << i;
    EXPECT_FALSE(GuardedCopy(data_, out.data(), 64)) << "write " << i;
  }
  // The first page back: copies from it work again, the second page still faults.
  ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(bytes_ / 2)), 0);
  EXPECT_TRUE(GuardedCopy(out.data(), data_, bytes_ / 2));
  EXPECT_FALSE(GuardedCopy(out.data(), data_, bytes_));
}

TEST_F(ShrinkingMapping, FaultsOnSeveralThreadsAtOnceAreEachCaught) {
  ASSERT_EQ(ftruncate(fd_, 0), 0);
  std::vector<int> caught(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < caught.size(); ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> out(bytes_);
      for (int i = 0; i < 50; ++i) caught[t] += GuardedCopy(out.data(), data_, bytes_) ? 0 : 1;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(caught, std::vector<int>(4, 50));
}

TEST_F(ShrinkingMapping, ABusErrorOutsideAGuardedCopyStillKillsTheProcess) {
  std::vector<char> out(8);
  ASSERT_TRUE(GuardedCopy(out.data(), data_, 8));  // the handler is installed by now
  ASSERT_EQ(ftruncate(fd_, 0), 0);
  volatile char* p = data_;
  EXPECT_DEATH({ out[0] = p[0]; }, "");
}

TEST(ShrunkShmError, SaysWhatHappenedAndWhatToDo) {
  const absl::Status s = ShrunkShmError("the logits region");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "expected the host shm object behind the logits region to cover the region, got a "
            "bus error accessing it: the object was truncated after RegisterRegion; unregister "
            "the region and register the object again");
}

}  // namespace
}  // namespace samplerd::core
