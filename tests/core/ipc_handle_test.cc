// IPC handle parsing: raw 64-byte handles, PyTorch's 66-byte 'c' form, its refused 'e' form,
// and every other length, with messages that give lengths, never bytes.
#include "service/core/regions/ipc_handle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Handle(char fill = 'S') { return std::string(kIpcHandleBytes, fill); }

TEST(ParseIpcMemoryHandle, TakesA64ByteHandleAsIs) {
  std::string raw = Handle();
  raw[1] = 'e';  // opaque bytes: a raw handle may hold anything, 'e' included
  absl::StatusOr<IpcHandle> h = ParseIpcMemoryHandle(raw);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(std::string(h->begin(), h->end()), raw);
}

TEST(ParseIpcMemoryHandle, StripsPyTorchsCudaMallocPrefix) {
  const std::string payload = Handle('p');
  absl::StatusOr<IpcHandle> h = ParseIpcMemoryHandle(std::string("\x01") + "c" + payload);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(std::string(h->begin(), h->end()), payload);
}

TEST(ParseIpcMemoryHandle, RefusesExpandableSegmentsWithAHint) {
  for (size_t size : {size_t{66}, size_t{100}, size_t{2}}) {
    std::string bytes = std::string("\x01") + "e" + std::string(size - 2, 'S');
    absl::StatusOr<IpcHandle> h = ParseIpcMemoryHandle(bytes);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << size;
    EXPECT_THAT(std::string(h.status().message()), HasSubstr("expandable_segments"));
    EXPECT_THAT(std::string(h.status().message()), Not(HasSubstr("SSS")));
  }
}

TEST(ParseIpcMemoryHandle, RefusesOtherLengthsAndForms) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{63}, size_t{65}, size_t{67}, size_t{128}}) {
    absl::StatusOr<IpcHandle> h = ParseIpcMemoryHandle(std::string(size, 'S'));
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << size;
    EXPECT_THAT(std::string(h.status().message()),
                HasSubstr("expected a 64-byte IPC memory handle (or PyTorch's 66-byte form), got " +
                          std::to_string(size) + " bytes"));
  }
  absl::StatusOr<IpcHandle> h = ParseIpcMemoryHandle("\x01x" + Handle());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()), Not(HasSubstr("SSS")));
}

TEST(ParseIpcEventHandle, NeedsExactly64Bytes) {
  EXPECT_TRUE(ParseIpcEventHandle(Handle(), "ready_event").ok());
  for (size_t size : {size_t{63}, size_t{65}, size_t{66}}) {
    absl::StatusOr<IpcHandle> h = ParseIpcEventHandle(std::string(size, 'S'), "ready_event");
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(h.status().message()), HasSubstr("ready_event"));
    EXPECT_THAT(std::string(h.status().message()), HasSubstr(std::to_string(size) + " bytes"));
  }
}

}  // namespace
}  // namespace samplerd::core
