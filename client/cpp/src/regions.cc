// samplerd::Client region calls and the region request builder.
#include <utility>

#include "samplerd/client.h"

namespace samplerd {
namespace {

grpc::Status Register(Client* client, const v1::RegisterRegionRequest& request,
                      grpc::ClientContext* context, v1::RegionInfo* info) {
  v1::RegisterRegionResponse response;
  grpc::Status status = client->stub()->RegisterRegion(context, request, &response);
  if (status.ok() && info != nullptr) *info = std::move(*response.mutable_region());
  return status;
}

}  // namespace

grpc::Status Client::RegisterHostShm(const std::string& name, const std::string& key,
                                     uint64_t offset, uint64_t byte_size, v1::RegionInfo* info) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::HostShmRegion* shm = request.mutable_host_shm();
  shm->set_key(key);
  shm->set_offset(offset);
  shm->set_byte_size(byte_size);
  grpc::ClientContext context;
  PrepareContext(&context);
  return Register(this, request, &context, info);
}

grpc::Status Client::RegisterGpuIpc(const std::string& name, const std::string& handle_bytes,
                                    uint64_t offset, uint64_t byte_size, const std::string& device,
                                    v1::RegionInfo* info) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::GpuIpcRegion* ipc = request.mutable_gpu_ipc();
  ipc->set_memory_handle(handle_bytes);
  ipc->set_offset(offset);
  ipc->set_byte_size(byte_size);
  ipc->set_device(device);
  grpc::ClientContext context;
  PrepareContext(&context);
  return Register(this, request, &context, info);
}

grpc::Status Client::Unregister(const std::string& name) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  v1::UnregisterRegionResponse response;
  grpc::ClientContext context;
  PrepareContext(&context);
  return stub_->UnregisterRegion(&context, request, &response);
}

grpc::Status Client::ListRegions(std::vector<v1::RegionInfo>* regions) {
  v1::ListRegionsResponse response;
  grpc::ClientContext context;
  PrepareContext(&context);
  grpc::Status status = stub_->ListRegions(&context, v1::ListRegionsRequest(), &response);
  regions->clear();
  if (status.ok()) {
    for (v1::RegionInfo& region : *response.mutable_regions()) {
      regions->push_back(std::move(region));
    }
  }
  return status;
}

v1::SampleRequest MakeRegionRequest(const std::string& region, uint64_t offset, v1::DType dtype,
                                    int64_t batch, int64_t vocab,
                                    const std::vector<v1::SamplingParams>& params) {
  v1::SampleRequest request;
  v1::Tensor* tensor = request.mutable_logits();
  tensor->set_dtype(dtype);
  tensor->add_shape(batch);
  tensor->add_shape(vocab);
  tensor->mutable_region()->set_region(region);
  tensor->mutable_region()->set_offset(offset);
  for (const v1::SamplingParams& p : params) *request.add_params() = p;
  return request;
}

}  // namespace samplerd
