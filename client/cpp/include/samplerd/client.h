// samplerd C++ client: a thin, synchronous wrapper over the generated samplerd.v1 stubs.
//
//   samplerd::Client client("unix:///run/samplerd/samplerd.sock");
//   samplerd::v1::SampleResponse response;
//   grpc::Status status = client.SampleFp32(logits.data(), batch, vocab, {params}, &response);
//
// Errors are grpc::Status values whose messages come from the server ("expected X, got Y").
// Everything here is a convenience: the generated stub (Client::stub()) stays available for
// anything the wrapper does not cover (per-call contexts, async calls).
//
// Zero-copy logits through a registered region (see also samplerd/host_shm_buffer.h):
//
//   client.RegisterHostShm("engine0", "/samplerd-engine0", 0, buffer.size());
//   v1::SampleRequest request = MakeRegionRequest("engine0", 0, v1::DTYPE_FP32, batch, vocab);
//   client.Sample(request, &response);
#ifndef SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_CLIENT_H_
#define SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "samplerd/v1/sampler.grpc.pb.h"

namespace samplerd {

// How a Client talks to the server.
struct ClientOptions {
  // Largest message sent or received, in bytes. Inline logits are B * V * sizeof(dtype) bytes
  // plus a little framing: 128 x 151,936 fp32 is ~74 MiB. Keep it <= the server's limit
  // (GetServerInfo().limits().max_message_bytes) or the server answers RESOURCE_EXHAUSTED.
  int max_message_bytes = 256 << 20;
  // Deadline of each unary call (Sample, GetServerInfo), from the moment it is made.
  // Zero means none. Streams never get a deadline: they live as long as the engine.
  std::chrono::milliseconds default_deadline{10000};
  // SampleSession steps whose inline logits exceed this many bytes are split into chunk
  // messages that the server reassembles (see SampleStreamRequest). Zero: never split.
  size_t stream_chunk_bytes = 0;
};

// One bidirectional SampleStream call: one synchronous Step per decode step, answered in order.
//
// Not thread-safe: one Step at a time (the stream's order is the caller's order). Obtained from
// Client::OpenStream(); the Client may be destroyed first (the session holds the channel).
class SampleSession {
 public:
  ~SampleSession();
  SampleSession(const SampleSession&) = delete;
  SampleSession& operator=(const SampleSession&) = delete;

  // Sends one step and waits for its answer.
  //
  // Returns OK and fills *response when the step was sampled. A step the server rejected (its
  // StepStatus is not OK) returns that code and message; *response then holds what the server
  // sent (at least the request_id) and the session stays usable. So does a step whose message
  // is larger than ClientOptions::max_message_bytes: RESOURCE_EXHAUSTED, nothing sent
  // (stream_chunk_bytes splits such steps). A broken stream returns the call's final status
  // (never OK) and the session is closed: later Steps fail at once.
  // `response` must not be null. Cost: one copy of the request (inline bytes included) into the
  // stream message, then its serialisation.
  grpc::Status Step(const v1::SampleRequest& request, v1::SampleResponse* response);

  // Half-closes the stream and returns the call's final status. Idempotent: a second Close, or
  // a Close after a broken stream, returns the same status.
  grpc::Status Close();

  // Whether Steps can still be sent (not closed, not broken).
  bool open() const { return !done_; }

 private:
  friend class Client;
  SampleSession(std::shared_ptr<grpc::Channel> channel, v1::SamplerService::Stub* stub,
                size_t chunk_bytes, int max_message_bytes);

  enum class Written { kSent, kTooLarge, kBroken };
  // Sends `request`, splitting inline logits into chunk messages when they exceed
  // chunk_bytes_ (0: never split). kTooLarge (nothing sent, *bytes set) when the first message
  // is larger than max_message_bytes_, which gRPC would fail the whole call for; kBroken when
  // the stream broke.
  Written WriteStep(const v1::SampleRequest& request, size_t* bytes);
  // Ends the call after a failed read or write; returns the final status (never OK).
  grpc::Status Fail();

  std::shared_ptr<grpc::Channel> channel_;  // keeps the connection alive
  grpc::ClientContext context_;             // must outlive stream_
  std::unique_ptr<grpc::ClientReaderWriter<v1::SampleStreamRequest, v1::SampleStreamResponse>>
      stream_;
  size_t chunk_bytes_;
  int max_message_bytes_;
  bool done_ = false;          // Close() ran or the stream broke
  grpc::Status final_status_;  // the call's status once done_
};

// A connection to one samplerd server. Thread-safe: calls may be made from many threads.
class Client {
 public:
  // `target` is a gRPC target: "unix:///run/samplerd/samplerd.sock" or "host:port". The
  // connection is made lazily, at the first call. Plaintext only (samplerd is a sidecar).
  explicit Client(const std::string& target, const ClientOptions& options = {});

  // Samples one token per row. Returns OK and fills *response, or the server's status (e.g.
  // INVALID_ARGUMENT "expected ..., got ..."). `response` must not be null.
  grpc::Status Sample(const v1::SampleRequest& request, v1::SampleResponse* response);

  // Sample() for host fp32 logits [batch, vocab] (row-major, `batch * vocab` floats at `logits`,
  // copied into the request). `params` is empty (defaults), one entry (every row) or `batch`
  // entries (one per row).
  grpc::Status SampleFp32(const float* logits, int64_t batch, int64_t vocab,
                          const std::vector<v1::SamplingParams>& params,
                          v1::SampleResponse* response);

  // Describes the server: version, backend, devices, limits. `info` must not be null.
  grpc::Status GetServerInfo(v1::GetServerInfoResponse* info);

  // Opens a SampleStream call. Never null; a server that cannot be reached makes the first Step
  // fail (UNAVAILABLE).
  std::unique_ptr<SampleSession> OpenStream();

  // ---- Regions ----------------------------------------------------------------------------
  // Served over the server's unix socket; over TCP only when it runs with
  // --allow_remote_regions (else PERMISSION_DENIED). Names are 1-128 characters [A-Za-z0-9._-].
  // `info` may be null; when not, it receives the server's description of the new region.

  // Registers [offset, offset + byte_size) of the POSIX shm object `key` (created by the
  // caller, e.g. with HostShmBuffer; the key must start with the server's --shm_prefix,
  // "/samplerd-" by default). The server maps it read-write when it may, so that the region
  // can also receive token ids as an output region. Do not shrink the object while registered.
  grpc::Status RegisterHostShm(const std::string& name, const std::string& key, uint64_t offset,
                               uint64_t byte_size, v1::RegionInfo* info = nullptr);

  // Registers GPU memory of another process: `handle_bytes` is the allocation's IPC memory
  // handle (64 bytes, e.g. cudaIpcMemHandle_t; or PyTorch's 66-byte shareable form), `offset`
  // the region's start from the allocation's base, `device` the GPU's PCI bus id or UUID as
  // GetServerInfo lists it.
  grpc::Status RegisterGpuIpc(const std::string& name, const std::string& handle_bytes,
                              uint64_t offset, uint64_t byte_size, const std::string& device,
                              v1::RegionInfo* info = nullptr);

  // Forgets region `name`; requests still using it finish first, then the server unmaps it.
  grpc::Status Unregister(const std::string& name);

  // The registered regions, sorted by name. `regions` must not be null.
  grpc::Status ListRegions(std::vector<v1::RegionInfo>* regions);

  // The generated stub, for everything else (custom contexts, async calls).
  v1::SamplerService::Stub* stub() { return stub_.get(); }
  // The channel (e.g. to share it with a health-check stub).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  // Applies the default deadline to a unary call's context.
  void PrepareContext(grpc::ClientContext* context) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SamplerService::Stub> stub_;
};

// Builds a request for host fp32 logits [batch, vocab] (row-major): dtype FP32, shape
// {batch, vocab}, the `batch * vocab` floats copied as little-endian inline bytes, and `params`
// (see Client::SampleFp32). Does not validate: the server does.
v1::SampleRequest MakeFp32Request(const float* logits, int64_t batch, int64_t vocab,
                                  const std::vector<v1::SamplingParams>& params = {});

// Builds a request whose logits are a dense [batch, vocab] tensor of `dtype` at byte `offset`
// of region `region`, with `params` (see Client::SampleFp32). For an output slice, set
// request.mutable_output() (region and offset; B int32 token ids are written there). Does not
// validate: the server does.
v1::SampleRequest MakeRegionRequest(const std::string& region, uint64_t offset, v1::DType dtype,
                                    int64_t batch, int64_t vocab,
                                    const std::vector<v1::SamplingParams>& params = {});

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_CLIENT_H_
