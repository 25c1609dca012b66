// consumer TARGET: greedy-samples two rows of four fp32 logits through the installed
// samplerd::Client and checks the tokens ([2, 0]), and checks that the installed device-session
// headers agree (layout of a session's buffers). Exits 0 on success.
#include <cstdio>
#include <vector>

#include "samplerd/client.h"
#include "samplerd/device_session.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TARGET (e.g. unix:///tmp/s.sock)\n", argv[0]);
    return 2;
  }
  samplerd::Client client(argv[1]);

  samplerd::v1::GetServerInfoResponse info;
  grpc::Status status = client.GetServerInfo(&info);
  if (!status.ok()) {
    std::fprintf(stderr, "GetServerInfo: %s\n", status.error_message().c_str());
    return 1;
  }

  const std::vector<float> logits = {0.5f, 1.0f, 3.0f, 2.0f, 4.0f, -1.0f, 0.25f, 3.5f};
  samplerd::v1::SamplingParams params;
  params.set_temperature(0.0f);
  samplerd::v1::SampleResponse response;
  status = client.SampleFp32(logits.data(), /*batch=*/2, /*vocab=*/4, {params}, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "Sample: %s\n", status.error_message().c_str());
    return 1;
  }
  if (response.token_ids_size() != 2 || response.token_ids(0) != 2 || response.token_ids(1) != 0) {
    std::fprintf(stderr, "Sample: expected tokens [2, 0], got %s\n",
                 response.ShortDebugString().c_str());
    return 1;
  }
  samplerd::DeviceSessionOptions options;
  options.max_batch = 2;
  options.vocab = 4;
  const samplerd::DeviceSessionLayout layout = samplerd::ComputeDeviceSessionLayout(options);
  if (layout.params - layout.logits < 2 * 4 * sizeof(float) ||
      layout.total_bytes < layout.row_status + 2 * sizeof(int32_t) ||
      sizeof(samplerd_control) != SAMPLERD_CONTROL_BYTES) {
    std::fprintf(stderr, "DeviceSession layout: expected room for every buffer, got total %llu\n",
                 static_cast<unsigned long long>(layout.total_bytes));
    return 1;
  }
  std::printf("server %s: tokens [%d, %d]\n", info.version().c_str(), response.token_ids(0),
              response.token_ids(1));
  return 0;
}
