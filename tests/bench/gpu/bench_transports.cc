// Transport benchmark: Sample round trips to a running samplerd on the GPU backend, through the
// C++ client over a unix socket, by how the logits travel, beside the bare kernel time of the
// same shapes on the same GPU. A program, not a test; tests/gpu/run_on_gpu.sh runs it against
// the GPU server it starts and writes transports.json / transports.md into $OUT.
//
// Transports (fp32 [B, V] logits, one SamplingParams for all rows: T = 0.8, top-k 50, top-p 0.9,
// fixed seed):
//   inline          the bytes in the request (serialised, sent, staged to the device)
//   host_shm        a POSIX shm region registered once; the server stages it to the device
//   gpu_ipc         a device allocation of this process registered once by IPC handle; the
//                   producer has finished writing before it sends (baseline contract)
//   gpu_ipc_ready   gpu_ipc plus an IPC ready event recorded before each request, which the
//                   server's stream waits on
//   gpu_ipc_done    gpu_ipc_ready plus an output region and an IPC done event: the server replies
//                   at once; timed until this process's stream has waited on the done event
//                   (tokens usable on the GPU)
//   kernel          kernels::gpu::Sample on the same device logits in this process, between two
//                   timing events (no RPC, no parameter copy, no host synchronisation cost)
//
// Each cell: a few untimed calls, then calls until --iters or --seconds. Latency p50 / p99 /
// mean of the round trip at the client, calls/s and rows/s of back-to-back calls from one
// thread, the logits' GB/s at p50, and the server's own compute p50 (SampleResponse.timings).
// L2 is not flushed between calls: B = 1 (0.6 MB) stays cached in every row alike.
//
//   bench_transports --target unix:///tmp/samplerd-gpu/s.sock [--batches 1,32,128]
//     [--vocab 151936] [--iters 2000] [--seconds 2] [--json out.json] [--markdown out.md]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/sample.h"
#include "samplerd/client.h"
#include "tests/bench/gpu/transport_report.h"

namespace samplerd::bench {
namespace {

namespace gpu = kernels::gpu;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string target;
  std::vector<int64_t> batches = {1, 32, 128};
  int64_t vocab = 151936;
  int iters = 2000;
  double seconds = 2.0;
  std::string json;
  std::string markdown;
};

// Runs `call` (returns "" or an error) a few times untimed, then timed; fills the statistics.
// `server_us` (may be null) receives the server's compute time of each timed call.
Row Measure(const std::string& transport, int64_t batch, const Flags& flags,
            const std::function<std::string(double* server_us)>& call) {
  Row row;
  row.transport = transport;
  row.batch = batch;
  double ignored = 0;
  for (int i = 0; i < 5; ++i) {
    row.error = call(&ignored);
    if (!row.error.empty()) return row;
  }
  std::vector<double> us, server;
  const Clock::time_point end =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(flags.seconds * 1e6));
  while (static_cast<int>(us.size()) < flags.iters && (us.size() < 20 || Clock::now() < end)) {
    double server_us = -1;
    const Clock::time_point t0 = Clock::now();
    row.error = call(&server_us);
    const double elapsed = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!row.error.empty()) return row;
    us.push_back(elapsed);
    if (server_us >= 0) server.push_back(server_us);
  }
  row.calls = static_cast<int>(us.size());
  row.p50_us = Percentile(us, 0.5);
  row.p99_us = Percentile(us, 0.99);
  row.mean_us = Mean(us);
  if (!server.empty()) row.server_compute_p50_us = Percentile(server, 0.5);
  return row;
}

std::string Describe(const grpc::Status& s) {
  return "code " + std::to_string(s.error_code()) + ": " + s.error_message();
}

grpc::Status Register(Client* client, const v1::RegisterRegionRequest& request) {
  v1::RegisterRegionResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return client->stub()->RegisterRegion(&context, request, &response);
}

void Unregister(Client* client, const std::string& name) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  v1::UnregisterRegionResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  (void)client->stub()->UnregisterRegion(&context, request, &response);
}

v1::SamplingParams Setting() {
  v1::SamplingParams p;
  p.set_temperature(0.8f);
  p.set_top_k(50);
  p.set_top_p(0.9f);
  p.set_seed(42);
  return p;
}

v1::SampleRequest Shape(int64_t batch, int64_t vocab) {
  v1::SampleRequest request;
  request.mutable_logits()->set_dtype(v1::DTYPE_FP32);
  request.mutable_logits()->add_shape(batch);
  request.mutable_logits()->add_shape(vocab);
  *request.add_params() = Setting();
  return request;
}

v1::SampleRequest RegionRequest(int64_t batch, int64_t vocab, const std::string& region) {
  v1::SampleRequest request = Shape(batch, vocab);
  request.mutable_logits()->mutable_region()->set_region(region);
  return request;
}

std::string Bytes(const gpu::IpcHandleBytes& h) {
  return std::string(reinterpret_cast<const char*>(h.data()), h.size());
}

// A Sample call that must return B tokens equal to `expected` (when given).
std::string SampleChecked(Client* client, const v1::SampleRequest& request,
                          const std::vector<int32_t>* expected, bool expect_tokens,
                          double* server_us) {
  v1::SampleResponse response;
  const grpc::Status s = client->Sample(request, &response);
  if (!s.ok()) return Describe(s);
  *server_us = static_cast<double>(response.timings().compute_ns()) / 1e3;
  const int64_t b = request.logits().shape(0);
  if (!expect_tokens) return response.token_ids_size() == 0 ? "" : "done reply carried tokens";
  if (response.token_ids_size() != b) return "expected B tokens in the reply";
  if (expected != nullptr &&
      !std::equal(expected->begin(), expected->end(), response.token_ids().begin())) {
    return "tokens differ from the inline transport's";
  }
  return "";
}

// Everything one batch size needs, created once and reused by every transport.
class Cell {
 public:
  Cell(Client* client, const std::string& device, int64_t batch, int64_t vocab)
      : client_(client), device_(device), batch_(batch), vocab_(vocab) {
    std::mt19937 rng(2024);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    logits_.resize(static_cast<size_t>(batch * vocab));
    for (float& x : logits_) x = 3.0f * normal(rng);
    prefix_ = "bench-" + std::to_string(getpid()) + "-" + std::to_string(batch) + "-";
  }
  ~Cell() {
    for (const std::string& name : regions_) Unregister(client_, name);
    if (shm_ != nullptr) munmap(shm_, bytes());
    if (!shm_key_.empty()) shm_unlink(shm_key_.c_str());
    for (void* p : {device_logits_, device_out_, device_params_, workspace_}) {
      if (p != nullptr) (void)gpu::DeviceFree(p);
    }
    for (gpu::Event e : {ready_, done_, start_, end_}) {
      if (e != nullptr) (void)gpu::EventDestroy(e);
    }
    if (stream_ != nullptr) (void)gpu::StreamDestroy(stream_);
  }

  size_t bytes() const { return logits_.size() * sizeof(float); }

  Row Inline(const Flags& flags) {
    v1::SampleRequest request = MakeFp32Request(logits_.data(), batch_, vocab_, {Setting()});
    // The reference tokens of every other transport.
    v1::SampleResponse response;
    const grpc::Status s = client_->Sample(request, &response);
    if (s.ok()) expected_.assign(response.token_ids().begin(), response.token_ids().end());
    return Measure("inline", batch_, flags, [&](double* server_us) {
      return SampleChecked(client_, request, &expected_, true, server_us);
    });
  }

  Row HostShm(const Flags& flags) {
    Row fail;
    fail.transport = "host_shm";
    fail.batch = batch_;
    shm_key_ = "/samplerd-" + prefix_ + "shm";
    const int fd = shm_open(shm_key_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes())) != 0) {
      fail.error = std::string("shm_open/ftruncate: ") + std::strerror(errno);
      if (fd >= 0) close(fd);
      return fail;
    }
    void* p = mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      fail.error = std::string("mmap: ") + std::strerror(errno);
      return fail;
    }
    shm_ = p;
    std::memcpy(shm_, logits_.data(), bytes());
    v1::RegisterRegionRequest reg;
    reg.set_name(prefix_ + "shm");
    reg.mutable_host_shm()->set_key(shm_key_);
    reg.mutable_host_shm()->set_byte_size(bytes());
    if (grpc::Status s = Register(client_, reg); !s.ok()) {
      fail.error = "RegisterRegion(host_shm): " + Describe(s);
      return fail;
    }
    regions_.push_back(reg.name());
    const v1::SampleRequest request = RegionRequest(batch_, vocab_, reg.name());
    return Measure("host_shm", batch_, flags, [&](double* server_us) {
      return SampleChecked(client_, request, &expected_, true, server_us);
    });
  }

  // Device logits, an output slot, the events and a stream of this process; registered once.
  std::string SetUpDevice() {
    if (gpu::StreamCreate(&stream_) != 0) return "StreamCreate failed";
    if (gpu::DeviceMalloc(&device_logits_, bytes()) != 0 ||
        gpu::DeviceMalloc(&device_out_, 4096) != 0) {
      return "DeviceMalloc failed";
    }
    if (gpu::CopyToDevice(device_logits_, logits_.data(), bytes(), stream_) != 0 ||
        gpu::StreamSynchronize(stream_) != 0) {
      return "copying the logits to the device failed";
    }
    if (gpu::EventCreate(&ready_, true) != 0 || gpu::EventCreate(&done_, true) != 0 ||
        gpu::IpcGetEventHandle(&ready_handle_, ready_) != 0 ||
        gpu::IpcGetEventHandle(&done_handle_, done_) != 0) {
      return "creating the IPC events failed";
    }
    for (const auto& [name, ptr, size] :
         {std::make_tuple(prefix_ + "ipc", device_logits_, bytes()),
          std::make_tuple(prefix_ + "out", device_out_, size_t{4096})}) {
      gpu::IpcHandleBytes handle;
      if (gpu::IpcGetMemHandle(&handle, ptr) != 0) return "IpcGetMemHandle failed";
      v1::RegisterRegionRequest reg;
      reg.set_name(name);
      reg.mutable_gpu_ipc()->set_memory_handle(Bytes(handle));
      reg.mutable_gpu_ipc()->set_byte_size(size);
      reg.mutable_gpu_ipc()->set_device(device_);
      if (grpc::Status s = Register(client_, reg); !s.ok()) {
        return "RegisterRegion(gpu_ipc): " + Describe(s);
      }
      regions_.push_back(name);
    }
    return "";
  }

  Row GpuIpc(const Flags& flags, bool ready, bool done) {
    const std::string transport = done ? "gpu_ipc_done" : ready ? "gpu_ipc_ready" : "gpu_ipc";
    if (!device_error_.empty()) return Failed(transport, device_error_);
    v1::SampleRequest request = RegionRequest(batch_, vocab_, prefix_ + "ipc");
    if (ready) request.set_ready_event(Bytes(ready_handle_));
    if (done) {
      request.mutable_output()->set_region(prefix_ + "out");
      request.set_done_event(Bytes(done_handle_));
    }
    Row row = Measure(transport, batch_, flags, [&](double* server_us) -> std::string {
      if (ready && gpu::EventRecord(ready_, stream_) != 0) return "EventRecord failed";
      std::string error =
          SampleChecked(client_, request, done ? nullptr : &expected_, !done, server_us);
      if (!error.empty() || !done) return error;
      // Tokens usable on the GPU: this process's stream has waited on the done event.
      if (gpu::StreamWaitEvent(stream_, done_) != 0 || gpu::StreamSynchronize(stream_) != 0) {
        return "waiting on the done event failed";
      }
      return "";
    });
    if (done && row.error.empty()) {
      std::vector<int32_t> out(static_cast<size_t>(batch_));
      if (gpu::CopyToHost(out.data(), device_out_, out.size() * 4, stream_) != 0 ||
          gpu::StreamSynchronize(stream_) != 0 || out != expected_) {
        row.error = "the output region does not hold the inline transport's tokens";
      }
    }
    return row;
  }

  Row Kernel(const Flags& flags) {
    if (!device_error_.empty()) return Failed("kernel", device_error_);
    kernels::RowParams params;
    params.temperature = 0.8f;
    params.top_k = 50;
    params.top_p = 0.9f;
    params.seed = 42;
    const size_t workspace_bytes = gpu::SampleWorkspaceBytes(batch_, vocab_, -1);
    if (gpu::DeviceMalloc(&device_params_, sizeof(params) + 8 * static_cast<size_t>(batch_)) != 0 ||
        gpu::DeviceMalloc(&workspace_, workspace_bytes) != 0 ||
        gpu::ZeroDevice(workspace_, workspace_bytes, stream_) != 0 ||
        gpu::CopyToDevice(device_params_, &params, sizeof(params), stream_) != 0 ||
        gpu::EventCreate(&start_, false) != 0 || gpu::EventCreate(&end_, false) != 0) {
      return Failed("kernel", "setting up the kernel run failed");
    }
    kernels::SampleArgs args;
    args.logits = device_logits_;
    args.dtype = kernels::DType::kFp32;
    args.batch = batch_;
    args.vocab = vocab_;
    args.row_stride = vocab_;
    args.params = static_cast<const kernels::RowParams*>(device_params_);
    args.params_count = 1;
    args.token_ids =
        reinterpret_cast<int32_t*>(static_cast<char*>(device_params_) + sizeof(params));
    args.status = reinterpret_cast<kernels::RowStatus*>(static_cast<char*>(device_params_) +
                                                        sizeof(params) + 4 * batch_);
    return Measure("kernel", batch_, flags, [&](double* gpu_us) -> std::string {
      float ms = 0;
      if (gpu::EventRecord(start_, stream_) != 0 ||
          gpu::Sample(args, workspace_, workspace_bytes, stream_) != 0 ||
          gpu::EventRecord(end_, stream_) != 0 || gpu::EventSynchronize(end_) != 0 ||
          gpu::EventElapsedMs(&ms, start_, end_) != 0) {
        return "kernel launch failed";
      }
      *gpu_us = ms * 1e3;  // the GPU's own time, reported as the "server" column
      return "";
    });
  }

  void set_device_error(std::string e) { device_error_ = std::move(e); }

 private:
  Row Failed(const std::string& transport, const std::string& error) const {
    Row row;
    row.transport = transport;
    row.batch = batch_;
    row.error = error;
    return row;
  }

  Client* client_;
  std::string device_;
  int64_t batch_, vocab_;
  std::vector<float> logits_;
  std::vector<int32_t> expected_;
  std::string prefix_;
  std::vector<std::string> regions_;
  std::string shm_key_;
  void* shm_ = nullptr;
  gpu::Stream stream_ = nullptr;
  void* device_logits_ = nullptr;
  void* device_out_ = nullptr;
  void* device_params_ = nullptr;
  void* workspace_ = nullptr;
  gpu::Event ready_ = nullptr, done_ = nullptr, start_ = nullptr, end_ = nullptr;
  gpu::IpcHandleBytes ready_handle_{}, done_handle_{};
  std::string device_error_;
};

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(std::strtoll(s.substr(at, comma - at).c_str(), nullptr, 10));
    at = comma + 1;
  }
  return out;
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string v;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (i + 1 < argc) {
      v = argv[++i];
    }
    if (a == "--target")
      f->target = v;
    else if (a == "--batches")
      f->batches = ParseList(v);
    else if (a == "--vocab")
      f->vocab = std::strtoll(v.c_str(), nullptr, 10);
    else if (a == "--iters")
      f->iters = std::atoi(v.c_str());
    else if (a == "--seconds")
      f->seconds = std::atof(v.c_str());
    else if (a == "--json")
      f->json = v;
    else if (a == "--markdown")
      f->markdown = v;
    else {
      std::fprintf(stderr, "bench_transports: unknown flag %s\n", argv[i]);
      return false;
    }
  }
  return !f->target.empty() && !f->batches.empty() && f->vocab > 0 && f->iters > 0;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: bench_transports --target TARGET [--batches 1,32,128] [--vocab V] "
                 "[--iters N] [--seconds S] [--json FILE] [--markdown FILE]\n");
    return 2;
  }
  ClientOptions options;
  options.default_deadline = std::chrono::seconds(60);
  Client client(flags.target, options);
  v1::GetServerInfoResponse info;
  if (grpc::Status s = client.GetServerInfo(&info); !s.ok() || info.devices_size() == 0) {
    std::fprintf(stderr, "bench_transports: GetServerInfo: %s\n", Describe(s).c_str());
    return 1;
  }
  const v1::Device& device = info.devices(0);
  std::string why;
  int ordinal = -1;
  for (const gpu::DeviceProperties& d : gpu::ListDevices(&why)) {
    std::string a = d.pci_bus_id, b = device.pci_bus_id();
    std::transform(a.begin(), a.end(), a.begin(), ::tolower);
    std::transform(b.begin(), b.end(), b.begin(), ::tolower);
    if (a == b) ordinal = d.ordinal;
  }
  std::printf("server: %s on %s (%s); this process: ordinal %d\n",
              info.backend() == v1::BACKEND_GPU ? "GPU backend" : "not the GPU backend",
              device.name().c_str(), device.pci_bus_id().c_str(), ordinal);
  std::fflush(stdout);

  std::vector<Row> rows;
  bool failed = false;
  for (int64_t b : flags.batches) {
    Cell cell(&client, device.pci_bus_id(), b, flags.vocab);
    if (ordinal < 0 || gpu::SetDevice(ordinal) != 0) {
      cell.set_device_error("the server's GPU is not visible to this process");
    } else {
      cell.set_device_error(cell.SetUpDevice());
    }
    for (Row row :
         {cell.Inline(flags), cell.HostShm(flags), cell.GpuIpc(flags, false, false),
          cell.GpuIpc(flags, true, false), cell.GpuIpc(flags, true, true), cell.Kernel(flags)}) {
      std::printf("B=%-4lld %-14s %s\n", static_cast<long long>(b), row.transport.c_str(),
                  row.error.empty() ? (std::to_string(row.calls) + " calls, p50 " +
                                       std::to_string(static_cast<int64_t>(row.p50_us)) + " us")
                                          .c_str()
                                    : ("FAILED: " + row.error).c_str());
      std::fflush(stdout);
      failed = failed || !row.error.empty();
      rows.push_back(row);
    }
  }
  WriteReport(rows, flags.vocab, device.name() + " " + device.pci_bus_id(), flags.json,
              flags.markdown);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace samplerd::bench

int main(int argc, char** argv) { return samplerd::bench::Main(argc, argv); }
