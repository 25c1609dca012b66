#include "tests/gpu/ipc_raw_util.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <random>
#include <utility>

namespace samplerd::ipc_test {
namespace {

// Round to nearest even (the logits here hold no NaN).
uint16_t FloatToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

void Store(HostLogits& l, int64_t element, float v) {
  char* at = &l.bytes[static_cast<size_t>(element) * l.ElementSize()];
  if (l.dtype == v1::DTYPE_BF16) {
    const uint16_t h = FloatToBf16(v);
    std::memcpy(at, &h, 2);
  } else {
    std::memcpy(at, &v, 4);
  }
}

HostLogits Empty(v1::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride) {
  HostLogits l;
  l.dtype = dtype;
  l.batch = batch;
  l.vocab = vocab;
  l.row_stride = row_stride == 0 ? vocab : row_stride;
  l.bytes.assign(static_cast<size_t>((batch - 1) * l.row_stride + vocab) * l.ElementSize(), '\0');
  return l;
}

v1::SamplingParams Params(float temperature, int32_t top_k, float top_p, float min_p) {
  v1::SamplingParams p;
  p.set_temperature(temperature);
  p.set_top_k(top_k);
  p.set_top_p(top_p);
  p.set_min_p(min_p);
  return p;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

HostLogits RandomLogits(v1::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride,
                        uint64_t seed) {
  HostLogits l = Empty(dtype, batch, vocab, row_stride);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t elements = (batch - 1) * l.row_stride + vocab;
  for (int64_t e = 0; e < elements; ++e) {
    const bool padding = e % l.row_stride >= vocab;
    Store(l, e, padding ? 1000.0f : normal(rng));
  }
  return l;
}

HostLogits ConstantArgmaxLogits(v1::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride,
                                int64_t column) {
  HostLogits l = Empty(dtype, batch, vocab, row_stride);
  const int64_t elements = (batch - 1) * l.row_stride + vocab;
  for (int64_t e = 0; e < elements; ++e) {
    Store(l, e, e % l.row_stride == column ? 50.0f : -50.0f);
  }
  return l;
}

v1::SampleRequest RequestShape(const HostLogits& l) {
  static const v1::SamplingParams kSettings[] = {
      Params(0.0f, 0, 1.0f, 0.0f), Params(0.8f, 0, 1.0f, 0.0f),  Params(1.0f, 50, 1.0f, 0.0f),
      Params(1.0f, 0, 0.9f, 0.0f), Params(1.0f, 50, 0.9f, 0.0f), Params(1.0f, 0, 1.0f, 0.1f),
  };
  v1::SampleRequest request;
  v1::Tensor* t = request.mutable_logits();
  t->set_dtype(l.dtype);
  t->add_shape(l.batch);
  t->add_shape(l.vocab);
  t->set_row_stride(l.row_stride == l.vocab ? 0 : l.row_stride);
  for (int64_t r = 0; r < l.batch; ++r) {
    v1::SamplingParams* p = request.add_params();
    *p = kSettings[r % (sizeof(kSettings) / sizeof(kSettings[0]))];
    p->set_seed(4242 + 7919 * static_cast<uint64_t>(r));
    p->set_position(static_cast<uint64_t>(r) * 3 + 1);
  }
  return request;
}

v1::SampleRequest InlineRequest(const HostLogits& l) {
  v1::SampleRequest request = RequestShape(l);
  request.mutable_logits()->set_inline_data(l.bytes);
  return request;
}

v1::SampleRequest RegionRequest(const HostLogits& l, const std::string& name, uint64_t offset) {
  v1::SampleRequest request = RequestShape(l);
  v1::RegionSlice* slice = request.mutable_logits()->mutable_region();
  slice->set_region(name);
  slice->set_offset(offset);
  return request;
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (gpu::DeviceMalloc(&ptr_, bytes) != 0) {
    (void)gpu::LastError();
    ptr_ = nullptr;
    return;
  }
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { Free(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Free() {
  if (ptr_ != nullptr) (void)gpu::DeviceFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

int Upload(void* device_dst, const std::string& bytes) {
  const int code = gpu::CopyToDevice(device_dst, bytes.data(), bytes.size(), nullptr);
  return code != 0 ? code : gpu::StreamSynchronize(nullptr);
}

std::vector<int32_t> DownloadInt32(const void* device_src, size_t count, gpu::Stream stream) {
  std::vector<int32_t> out(count, -2);
  if (gpu::CopyToHost(out.data(), device_src, count * sizeof(int32_t), stream) != 0 ||
      gpu::StreamSynchronize(stream) != 0) {
    out.assign(count, -3);
  }
  return out;
}

int EnqueueDelay(const DeviceBuffer& scratch, int copies, gpu::Stream stream) {
  const size_t half = scratch.size() / 2;
  for (int i = 0; i < copies; ++i) {
    char* a = scratch.data();
    char* b = scratch.data() + half;
    const int code = gpu::CopyDeviceToDevice(i % 2 == 0 ? b : a, i % 2 == 0 ? a : b, half, stream);
    if (code != 0) return code;
  }
  return 0;
}

std::string HandleString(const gpu::IpcHandleBytes& handle) {
  return std::string(reinterpret_cast<const char*>(handle.data()), handle.size());
}

grpc::Status RegisterGpuIpc(Client* client, const std::string& name, const std::string& handle,
                            uint64_t offset, uint64_t byte_size, const std::string& device) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::GpuIpcRegion* ipc = request.mutable_gpu_ipc();
  ipc->set_memory_handle(handle);
  ipc->set_offset(offset);
  ipc->set_byte_size(byte_size);
  ipc->set_device(device);
  v1::RegisterRegionResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return client->stub()->RegisterRegion(&context, request, &response);
}

grpc::Status Unregister(Client* client, const std::string& name) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  v1::UnregisterRegionResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return client->stub()->UnregisterRegion(&context, request, &response);
}

std::vector<std::string> RegionNames(Client* client) {
  v1::ListRegionsResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::vector<std::string> names;
  if (!client->stub()->ListRegions(&context, v1::ListRegionsRequest(), &response).ok()) {
    return names;
  }
  for (const v1::RegionInfo& r : response.regions()) names.push_back(r.name());
  return names;
}

int OrdinalOf(const std::string& bus_id) {
  std::string ignored;
  for (const gpu::DeviceProperties& d : gpu::ListDevices(&ignored)) {
    if (Lower(d.pci_bus_id) == Lower(bus_id)) return d.ordinal;
  }
  return -1;
}

}  // namespace samplerd::ipc_test
