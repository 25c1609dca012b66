// The GPU IPC transport from a raw C++ producer (no PyTorch): this process allocates device
// memory, writes logits, exports the allocation with an IPC memory handle and registers it with a
// samplerd on the GPU backend; the tokens sampled from the region must equal those of a samplerd
// on the CPU backend given the same logits inline. Also the event-ordered paths (a ready event
// the server waits on, a done event the producer waits on) and the bad inputs that need a real
// GPU: a range past the real allocation, a handle of a freed allocation, misaligned logits, an
// unregister while a request is in flight.
//
// Run by tests/gpu/run_on_gpu.sh, which starts both servers and names them like
// server_gpu_test: SAMPLERD_TEST_GPU_SERVER and SAMPLERD_TEST_CPU_SERVER (unix sockets). Every
// test skips when they are not set or this machine has no GPU, so ctest passes elsewhere. The
// producer must be a separate process from the server: the runtime refuses to open a handle in
// the process that made it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/ipc_raw_util.h"

namespace samplerd::ipc_test {
namespace {

constexpr char kGpuEnv[] = "SAMPLERD_TEST_GPU_SERVER";
constexpr char kCpuEnv[] = "SAMPLERD_TEST_CPU_SERVER";
constexpr int64_t kBatch = 8;
constexpr int64_t kVocab = 151936;
constexpr size_t kMiB = size_t{1} << 20;
// One exported allocation per test; a multiple of 2 MiB, so that the runtime's range of it is
// exactly this size.
constexpr size_t kAllocation = 64 * kMiB;
// Device-to-device copies of 256 MiB each that delay the producer's stream: ~0.1-0.2 ms each on
// an H200, so 800 of them hold back the work behind them for ~100 ms (printed by each test).
constexpr size_t kScratch = 512 * kMiB;
constexpr int kDelayCopies = 800;
// How long the unregister-in-flight test waits before unregistering (see there).
constexpr int kArrivalMs = 20;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string Code(const grpc::Status& s) {
  return std::to_string(s.error_code()) + " (" + s.error_message() + ")";
}

class GpuIpcRawTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string gpu_target = Env(kGpuEnv);
    const std::string cpu_target = Env(kCpuEnv);
    if (gpu_target.empty() || cpu_target.empty()) {
      skip_ = std::string(kGpuEnv) + " and " + kCpuEnv +
              " must name a GPU and a CPU server (tests/gpu/run_on_gpu.sh starts them)";
      return;
    }
    ClientOptions options;
    options.default_deadline = std::chrono::seconds(300);  // the CPU server samples on the host
    gpu_ = new Client(gpu_target, options);
    cpu_ = new Client(cpu_target, options);
    v1::GetServerInfoResponse info;
    const grpc::Status status = gpu_->GetServerInfo(&info);
    if (!status.ok() || info.devices_size() == 0 || info.backend() != v1::BACKEND_GPU) {
      skip_ = "the GPU server reports no GPU: " + Code(status) + " " + info.ShortDebugString();
      return;
    }
    device_ = info.devices(0).pci_bus_id();
    ipc_events_ = info.devices(0).ipc_events();
    ordinal_ = OrdinalOf(device_);
    if (ordinal_ < 0) {
      skip_ = "no GPU with bus id " + device_ + " is visible to this process";
      return;
    }
    if (gpu::SetDevice(ordinal_) != 0 || gpu::StreamCreate(&stream_) != 0 ||
        gpu::StreamCreate(&reader_) != 0) {
      skip_ = "cannot use GPU " + device_ + " in the producer";
      return;
    }
    std::printf("producer pid %d on GPU %s (ordinal %d), server ipc_events %d\n",
                static_cast<int>(getpid()), device_.c_str(), ordinal_, ipc_events_);
  }

  static void TearDownTestSuite() {
    delete gpu_;
    delete cpu_;
    gpu_ = cpu_ = nullptr;
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(gpu::SetDevice(ordinal_), 0);
  }

  // A region name unique to this process and test.
  static std::string Name(const std::string& what) {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    return "raw-" + std::to_string(getpid()) + "-" + t->name() + "-" + what;
  }

  // The CPU server's tokens for `l` sent inline.
  static std::vector<int32_t> CpuTokens(const HostLogits& l) {
    v1::SampleResponse response;
    const grpc::Status status = cpu_->Sample(InlineRequest(l), &response);
    EXPECT_TRUE(status.ok()) << "CPU server: " << Code(status);
    return {response.token_ids().begin(), response.token_ids().end()};
  }

  static std::vector<int32_t> Tokens(const v1::SampleResponse& r) {
    return {r.token_ids().begin(), r.token_ids().end()};
  }

  // Exports `buffer` and registers [offset, offset + size) of it as `name` on the GPU server.
  static grpc::Status RegisterBuffer(const DeviceBuffer& buffer, const std::string& name,
                                     uint64_t offset, uint64_t size) {
    gpu::IpcHandleBytes handle;
    const int code = gpu::IpcGetMemHandle(&handle, buffer.data());
    if (code != 0) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          std::string("IpcGetMemHandle: ") + gpu::ErrorString(code));
    }
    return RegisterGpuIpc(gpu_, name, HandleString(handle), offset, size, device_);
  }

  // A GPU server request that must succeed and carry B tokens.
  static std::vector<int32_t> SampleOk(const v1::SampleRequest& request) {
    v1::SampleResponse response;
    const grpc::Status status = gpu_->Sample(request, &response);
    EXPECT_TRUE(status.ok()) << "GPU server: " << Code(status);
    EXPECT_EQ(response.token_ids_size(), request.logits().shape(0));
    return Tokens(response);
  }

  // Holds `stream_` back for ~kDelayCopies copies; returns the milliseconds they took (after
  // the stream finished), for the log.
  struct Delay {
    DeviceBuffer scratch{kScratch};
    gpu::Event start = nullptr;
    gpu::Event end = nullptr;
    Delay() {
      (void)gpu::EventCreate(&start, false);
      (void)gpu::EventCreate(&end, false);
    }
    ~Delay() {
      (void)gpu::EventDestroy(start);
      (void)gpu::EventDestroy(end);
    }
    bool Enqueue(gpu::Stream stream) {
      return scratch.ok() && gpu::EventRecord(start, stream) == 0 &&
             EnqueueDelay(scratch, kDelayCopies, stream) == 0 && gpu::EventRecord(end, stream) == 0;
    }
    float Ms() {
      float ms = -1.0f;
      if (gpu::EventSynchronize(end) == 0) (void)gpu::EventElapsedMs(&ms, start, end);
      return ms;
    }
  };

  // An interprocess event and its handle.
  struct IpcEvent {
    gpu::Event event = nullptr;
    gpu::IpcHandleBytes handle{};
    bool ok = false;
    IpcEvent() {
      ok = gpu::EventCreate(&event, true) == 0 && gpu::IpcGetEventHandle(&handle, event) == 0;
    }
    ~IpcEvent() { (void)gpu::EventDestroy(event); }
  };

  inline static std::string skip_;
  inline static Client* gpu_ = nullptr;
  inline static Client* cpu_ = nullptr;
  inline static std::string device_;
  inline static bool ipc_events_ = false;
  inline static int ordinal_ = -1;
  inline static gpu::Stream stream_ = nullptr;  // writes the logits (and the delays)
  inline static gpu::Stream reader_ = nullptr;  // reads the outputs, never delayed itself
};

TEST_F(GpuIpcRawTest, RegionTokensEqualTheCpuServersOnTheSameLogits) {
  struct Case {
    v1::DType dtype;
    int64_t row_stride;
  };
  for (const Case& c :
       {Case{v1::DTYPE_FP32, 0}, Case{v1::DTYPE_BF16, 0}, Case{v1::DTYPE_FP32, kVocab + 64}}) {
    SCOPED_TRACE(std::string(c.dtype == v1::DTYPE_BF16 ? "bf16" : "fp32") +
                 (c.row_stride != 0 ? " strided" : " dense"));
    const HostLogits l = RandomLogits(c.dtype, kBatch, kVocab, c.row_stride, 11 + c.dtype);
    // The region starts 1 MiB + 256 bytes into the allocation; the logits 4 KiB into the region:
    // both offsets must be applied, each once.
    const uint64_t region_offset = kMiB + 256;
    const uint64_t slice_offset = 4096;
    DeviceBuffer buffer(kAllocation);
    ASSERT_TRUE(buffer.ok());
    ASSERT_EQ(Upload(buffer.data() + region_offset + slice_offset, l.bytes), 0);
    const std::string name = Name("logits");
    ASSERT_TRUE(RegisterBuffer(buffer, name, region_offset, 32 * kMiB).ok());

    const std::vector<int32_t> from_region = SampleOk(RegionRequest(l, name, slice_offset));
    const std::vector<int32_t> from_inline = SampleOk(InlineRequest(l));
    const std::vector<int32_t> cpu = CpuTokens(l);
    EXPECT_EQ(from_region, from_inline) << "the same kernels on the same bytes";
    EXPECT_EQ(from_region, cpu);
    EXPECT_TRUE(Unregister(gpu_, name).ok());
  }
}

TEST_F(GpuIpcRawTest, ReadyEventOrdersTheServersReadAfterTheProducersWrite) {
  if (!ipc_events_) GTEST_SKIP() << "the GPU server does not support IPC events";
  const HostLogits real = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 21);
  const HostLogits decoy = ConstantArgmaxLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 17);
  DeviceBuffer buffer(kAllocation);
  DeviceBuffer staging(real.bytes.size());
  ASSERT_TRUE(buffer.ok() && staging.ok());
  ASSERT_EQ(Upload(buffer.data(), decoy.bytes), 0);
  ASSERT_EQ(Upload(staging.data(), real.bytes), 0);
  const std::string name = Name("logits");
  ASSERT_TRUE(RegisterBuffer(buffer, name, 0, kAllocation).ok());
  const std::vector<int32_t> cpu = CpuTokens(real);
  ASSERT_NE(cpu[0], 17) << "the decoy must give other tokens than the real logits";

  // Not synchronized: the real logits land ~tens of ms after the request is sent.
  IpcEvent ready;
  ASSERT_TRUE(ready.ok);
  Delay delay;
  ASSERT_TRUE(delay.Enqueue(stream_));
  ASSERT_EQ(gpu::CopyDeviceToDevice(buffer.data(), staging.data(), real.bytes.size(), stream_), 0);
  ASSERT_EQ(gpu::EventRecord(ready.event, stream_), 0);
  v1::SampleRequest request = RegionRequest(real, name, 0);
  request.set_ready_event(HandleString(ready.handle));
  EXPECT_EQ(SampleOk(request), cpu);
  std::printf("producer's write was delayed by %.1f ms\n", delay.Ms());
  EXPECT_TRUE(Unregister(gpu_, name).ok());
}

TEST_F(GpuIpcRawTest, DoneEventOrdersTheProducersReadOfTheOutputRegion) {
  if (!ipc_events_) GTEST_SKIP() << "the GPU server does not support IPC events";
  const HostLogits real = RandomLogits(v1::DTYPE_BF16, kBatch, kVocab, 0, 31);
  DeviceBuffer buffer(kAllocation);
  DeviceBuffer staging(real.bytes.size());
  ASSERT_TRUE(buffer.ok() && staging.ok());
  ASSERT_EQ(Upload(staging.data(), real.bytes), 0);
  const uint64_t out_offset = 48 * kMiB;
  ASSERT_EQ(Upload(buffer.data() + out_offset, std::string(kBatch * 4, '\xf9')), 0);  // sentinel
  const std::string logits = Name("logits");
  const std::string output = Name("output");
  ASSERT_TRUE(RegisterBuffer(buffer, logits, 0, 32 * kMiB).ok());
  ASSERT_TRUE(RegisterBuffer(buffer, output, out_offset, 4096).ok());  // the same handle
  const std::vector<int32_t> cpu = CpuTokens(real);

  IpcEvent ready, done;
  ASSERT_TRUE(ready.ok && done.ok);
  Delay delay;
  ASSERT_TRUE(delay.Enqueue(stream_));
  ASSERT_EQ(gpu::CopyDeviceToDevice(buffer.data(), staging.data(), real.bytes.size(), stream_), 0);
  ASSERT_EQ(gpu::EventRecord(ready.event, stream_), 0);
  v1::SampleRequest request = RegionRequest(real, logits, 0);
  request.set_ready_event(HandleString(ready.handle));
  request.mutable_output()->set_region(output);
  request.set_done_event(HandleString(done.handle));
  v1::SampleResponse response;
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(gpu_->Sample(request, &response).ok());
  const double reply_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent).count();
  EXPECT_EQ(response.token_ids_size(), 0) << "a done-event reply carries no tokens";

  // The reader stream was never delayed: only the done event orders its read.
  ASSERT_EQ(gpu::StreamWaitEvent(reader_, done.event), 0);
  EXPECT_EQ(DownloadInt32(buffer.data() + out_offset, kBatch, reader_), cpu);
  std::printf("reply after %.2f ms; the producer's write was delayed by %.1f ms\n", reply_ms,
              delay.Ms());
  EXPECT_TRUE(Unregister(gpu_, logits).ok());
  EXPECT_TRUE(Unregister(gpu_, output).ok());
}

TEST_F(GpuIpcRawTest, OutputRegionWithoutEventsHoldsTheRepliedTokens) {
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 41);
  DeviceBuffer buffer(kAllocation);
  ASSERT_TRUE(buffer.ok());
  ASSERT_EQ(Upload(buffer.data(), l.bytes), 0);
  const uint64_t out_offset = 40 * kMiB + 4;  // int32s need no more than 4-byte alignment
  const std::string logits = Name("logits");
  const std::string output = Name("output");
  ASSERT_TRUE(RegisterBuffer(buffer, logits, 0, 32 * kMiB).ok());
  ASSERT_TRUE(RegisterBuffer(buffer, output, out_offset, 1024).ok());
  v1::SampleRequest request = RegionRequest(l, logits, 0);
  request.mutable_output()->set_region(output);
  request.mutable_output()->set_offset(8);
  const std::vector<int32_t> replied = SampleOk(request);
  EXPECT_EQ(replied, CpuTokens(l));
  EXPECT_EQ(DownloadInt32(buffer.data() + out_offset + 8, kBatch, reader_), replied);
  EXPECT_TRUE(Unregister(gpu_, logits).ok());
  EXPECT_TRUE(Unregister(gpu_, output).ok());
}

TEST_F(GpuIpcRawTest, RangePastTheRealAllocationIsOutOfRange) {
  DeviceBuffer buffer(kAllocation);
  ASSERT_TRUE(buffer.ok());
  const std::string name = Name("r");
  grpc::Status s = RegisterBuffer(buffer, name, 0, kAllocation + 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << Code(s);
  s = RegisterBuffer(buffer, name, kAllocation - 4, 8);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << Code(s);
  s = RegisterBuffer(buffer, name, kAllocation, 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << Code(s);
  // Exactly the last 4 KiB fits; a [B, V] slice of it does not.
  ASSERT_TRUE(RegisterBuffer(buffer, name, kAllocation - 4096, 4096).ok());
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 51);
  v1::SampleResponse response;
  s = gpu_->Sample(RegionRequest(l, name, 0), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << Code(s);
  EXPECT_TRUE(Unregister(gpu_, name).ok());
}

TEST_F(GpuIpcRawTest, HandleOfAFreedAllocationIsInvalidArgument) {
  gpu::IpcHandleBytes stale;
  {
    DeviceBuffer gone(8 * kMiB);
    ASSERT_TRUE(gone.ok());
    ASSERT_EQ(gpu::IpcGetMemHandle(&stale, gone.data()), 0);
  }  // freed here
  const std::string name = Name("stale");
  grpc::Status s = RegisterGpuIpc(gpu_, name, HandleString(stale), 0, 4096, device_);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Code(s);
  gpu::IpcHandleBytes garbage;
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
  s = RegisterGpuIpc(gpu_, name, HandleString(garbage), 0, 4096, device_);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Code(s);
  const std::vector<std::string> names = RegionNames(gpu_);
  EXPECT_EQ(std::count(names.begin(), names.end(), name), 0);

  // The refused opens left the server able to serve.
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, 2, kVocab, 0, 61);
  EXPECT_EQ(SampleOk(InlineRequest(l)), CpuTokens(l));
}

TEST_F(GpuIpcRawTest, MisalignedDeviceLogitsAreInvalidArgumentAndHarmless) {
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 71);
  DeviceBuffer buffer(kAllocation);
  ASSERT_TRUE(buffer.ok());
  ASSERT_EQ(Upload(buffer.data() + 4096, l.bytes), 0);
  const std::string name = Name("logits");
  ASSERT_TRUE(RegisterBuffer(buffer, name, 0, 32 * kMiB).ok());
  v1::SampleResponse response;
  const grpc::Status s = gpu_->Sample(RegionRequest(l, name, 4098), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Code(s);
  EXPECT_EQ(SampleOk(RegionRequest(l, name, 4096)), CpuTokens(l));
  EXPECT_TRUE(Unregister(gpu_, name).ok());
}

TEST_F(GpuIpcRawTest, OneHandleUnderTwoNamesSurvivesUnregisteringOne) {
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 81);
  DeviceBuffer buffer(kAllocation);
  ASSERT_TRUE(buffer.ok());
  ASSERT_EQ(Upload(buffer.data() + 32 * kMiB, l.bytes), 0);
  const std::string a = Name("a");
  const std::string b = Name("b");
  ASSERT_TRUE(RegisterBuffer(buffer, a, 0, 32 * kMiB).ok());
  ASSERT_TRUE(RegisterBuffer(buffer, b, 32 * kMiB, 32 * kMiB).ok());
  ASSERT_TRUE(Unregister(gpu_, a).ok());
  EXPECT_EQ(SampleOk(RegionRequest(l, b, 0)), CpuTokens(l));
  EXPECT_TRUE(Unregister(gpu_, b).ok());
}

TEST_F(GpuIpcRawTest, UnregisterDuringFlightDefersTheClose) {
  if (!ipc_events_) GTEST_SKIP() << "the GPU server does not support IPC events";
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 91);
  DeviceBuffer buffer(kAllocation);
  DeviceBuffer staging(l.bytes.size());
  ASSERT_TRUE(buffer.ok() && staging.ok());
  ASSERT_EQ(Upload(staging.data(), l.bytes), 0);
  const std::string name = Name("logits");
  ASSERT_TRUE(RegisterBuffer(buffer, name, 0, 32 * kMiB).ok());
  const std::vector<int32_t> cpu = CpuTokens(l);

  // The request waits on the GPU for the delayed write; meanwhile the region is unregistered.
  IpcEvent ready;
  ASSERT_TRUE(ready.ok);
  Delay delay;
  ASSERT_TRUE(delay.Enqueue(stream_));
  ASSERT_EQ(gpu::CopyDeviceToDevice(buffer.data(), staging.data(), l.bytes.size(), stream_), 0);
  ASSERT_EQ(gpu::EventRecord(ready.event, stream_), 0);
  v1::SampleRequest request = RegionRequest(l, name, 0);
  request.set_ready_event(HandleString(ready.handle));
  grpc::Status in_flight_status;
  v1::SampleResponse in_flight;
  std::thread sender([&] { in_flight_status = gpu_->Sample(request, &in_flight); });
  // Only orders the request's arrival before the unregister (a unix-socket round trip takes
  // ~0.1 ms); the request itself stays in flight for the whole delay.
  std::this_thread::sleep_for(std::chrono::milliseconds(kArrivalMs));
  const grpc::Status unregistered = Unregister(gpu_, name);
  EXPECT_TRUE(unregistered.ok()) << Code(unregistered);
  const std::vector<std::string> names = RegionNames(gpu_);
  EXPECT_EQ(std::count(names.begin(), names.end(), name), 0) << "forgotten at once";
  v1::SampleResponse response;
  const grpc::Status after = gpu_->Sample(RegionRequest(l, name, 0), &response);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::NOT_FOUND) << Code(after);
  sender.join();
  ASSERT_TRUE(in_flight_status.ok()) << Code(in_flight_status);
  EXPECT_EQ(Tokens(in_flight), cpu) << "the in-flight request read the mapping after unregister";
  const float delay_ms = delay.Ms();
  std::printf("the in-flight request waited %.1f ms for the producer\n", delay_ms);
  EXPECT_GT(delay_ms, 2.0f * kArrivalMs)
      << "the request may have finished before the unregister: raise kDelayCopies";

  // The same handle can be registered again under the same name once the close happened.
  ASSERT_TRUE(RegisterBuffer(buffer, name, 0, 32 * kMiB).ok());
  EXPECT_EQ(SampleOk(RegionRequest(l, name, 0)), cpu);
  EXPECT_TRUE(Unregister(gpu_, name).ok());
}

// A done-event reply releases the request's regions before its kernels ran: closing the
// mapping must still wait for them (GpuIpc::CloseMemory synchronizes the device), else the
// kernels read unmapped memory and the server's context faults.
TEST_F(GpuIpcRawTest, UnregisterRightAfterADoneEventReplyIsSafe) {
  if (!ipc_events_) GTEST_SKIP() << "the GPU server does not support IPC events";
  const HostLogits l = RandomLogits(v1::DTYPE_FP32, kBatch, kVocab, 0, 101);
  DeviceBuffer buffer(kAllocation);
  DeviceBuffer staging(l.bytes.size());
  ASSERT_TRUE(buffer.ok() && staging.ok());
  ASSERT_EQ(Upload(staging.data(), l.bytes), 0);
  const uint64_t out_offset = 48 * kMiB;
  const std::string logits = Name("logits");
  const std::string output = Name("output");
  ASSERT_TRUE(RegisterBuffer(buffer, logits, 0, 32 * kMiB).ok());
  ASSERT_TRUE(RegisterBuffer(buffer, output, out_offset, 4096).ok());
  const std::vector<int32_t> cpu = CpuTokens(l);

  IpcEvent ready, done;
  ASSERT_TRUE(ready.ok && done.ok);
  Delay delay;
  ASSERT_TRUE(delay.Enqueue(stream_));
  ASSERT_EQ(gpu::CopyDeviceToDevice(buffer.data(), staging.data(), l.bytes.size(), stream_), 0);
  ASSERT_EQ(gpu::EventRecord(ready.event, stream_), 0);
  v1::SampleRequest request = RegionRequest(l, logits, 0);
  request.set_ready_event(HandleString(ready.handle));
  request.mutable_output()->set_region(output);
  request.set_done_event(HandleString(done.handle));
  v1::SampleResponse response;
  ASSERT_TRUE(gpu_->Sample(request, &response).ok());
  EXPECT_TRUE(Unregister(gpu_, logits).ok());
  EXPECT_TRUE(Unregister(gpu_, output).ok());

  ASSERT_EQ(gpu::StreamWaitEvent(reader_, done.event), 0);
  EXPECT_EQ(DownloadInt32(buffer.data() + out_offset, kBatch, reader_), cpu);
  std::printf("the producer's write was delayed by %.1f ms\n", delay.Ms());
  // Still serving: a faulted context would answer UNAVAILABLE.
  const HostLogits small = RandomLogits(v1::DTYPE_FP32, 2, kVocab, 0, 102);
  EXPECT_EQ(SampleOk(InlineRequest(small)), CpuTokens(small));
}

}  // namespace
}  // namespace samplerd::ipc_test
