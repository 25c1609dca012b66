// NameThisThread (service/core/model/thread_name.h): the name the kernel shows for the thread,
// cut to Linux's 15 characters.
#include "service/core/model/thread_name.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

namespace samplerd {
namespace {

std::string NameOf(long tid) {
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

std::string NameInThreadNamed(const char* name) {
  std::string seen;
  std::thread t([&] {
    NameThisThread(name);
    seen = NameOf(syscall(SYS_gettid));
  });
  t.join();
  return seen;
}

TEST(NameThisThreadTest, TheKernelShowsTheName) {
  EXPECT_EQ(NameInThreadNamed("sd-test"), "sd-test");
}

TEST(NameThisThreadTest, ALongNameIsCutTo15Characters) {
  EXPECT_EQ(NameInThreadNamed("sd-a-name-longer-than-fifteen"), "sd-a-name-longe");
}

}  // namespace
}  // namespace samplerd
