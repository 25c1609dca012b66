// MatchDevice: requests name devices by PCI bus id or UUID (never by ordinal); a mismatch is
// FAILED_PRECONDITION, also through SamplerCore::SampleAsync.
#include "service/core/backend/device_match.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "service/core/backend/cpu_sampler.h"
#include "service/core/sampler_core.h"
#include "tests/core/test_util.h"

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;

DeviceInfo H200() {
  DeviceInfo d;
  d.ordinal = 0;
  d.pci_bus_id = "0000:00:06.0";
  d.uuid = "GPU-6a1c2f3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b";
  d.name = "NVIDIA H200";
  d.ipc_memory = true;
  d.ipc_events = true;
  return d;
}

DeviceInfo Cpu() {
  DeviceInfo d;
  d.uuid = "cpu";
  d.name = "CPU";
  return d;
}

TEST(MatchDevice, EmptyMeansAnyDevice) {
  EXPECT_TRUE(MatchDevice("", H200()).ok());
  EXPECT_TRUE(MatchDevice("", Cpu()).ok());
}

TEST(MatchDevice, AcceptsThePciBusIdInAnyCommonSpelling) {
  EXPECT_TRUE(MatchDevice("0000:00:06.0", H200()).ok());
  EXPECT_TRUE(MatchDevice("00000000:00:06.0", H200()).ok());  // nvidia-smi
  EXPECT_TRUE(MatchDevice("00:06.0", H200()).ok());           // lspci
}

TEST(MatchDevice, ComparesPciBusIdsCaseInsensitively) {
  DeviceInfo d = H200();
  d.pci_bus_id = "0000:c1:00.0";
  EXPECT_TRUE(MatchDevice("0000:C1:00.0", d).ok());
}

TEST(MatchDevice, AcceptsTheUuidWithOrWithoutPrefixInAnyCase) {
  EXPECT_TRUE(MatchDevice("GPU-6a1c2f3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b", H200()).ok());
  EXPECT_TRUE(MatchDevice("gpu-6A1C2F3E-0B4D-4E5F-8A9B-0C1D2E3F4A5B", H200()).ok());
  EXPECT_TRUE(MatchDevice("6a1c2f3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b", H200()).ok());  // PyTorch
}

TEST(MatchDevice, RefusesAnotherGpuWithExpectedAndGot) {
  const absl::Status status = MatchDevice("0000:00:07.0", H200());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected device \"0000:00:06.0\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("got \"0000:00:07.0\""));
}

TEST(MatchDevice, RefusesOrdinals) {
  EXPECT_EQ(MatchDevice("0", H200()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MatchDevice("cuda:0", H200()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MatchDevice, RefusesAnEmptyUuidMatch) {
  DeviceInfo d = H200();
  d.uuid.clear();  // a runtime without UUIDs
  EXPECT_EQ(MatchDevice("GPU-", d).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MatchDevice, CpuBackendAcceptsOnlyCpu) {
  EXPECT_TRUE(MatchDevice("cpu", Cpu()).ok());
  EXPECT_TRUE(MatchDevice("CPU", Cpu()).ok());
  const absl::Status status = MatchDevice("GPU-6a1c2f3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b", Cpu());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected device \"cpu\""));
  EXPECT_EQ(MatchDevice("0000:00:06.0", Cpu()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MatchDevice, ShortensAndEscapesWhatItEchoes) {
  const std::string requested = std::string(1000, 'x') + "\n";
  const absl::Status status = MatchDevice(requested, Cpu());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(status.message().size(), 300u);
  EXPECT_THAT(std::string(status.message()), HasSubstr("...\""));
  EXPECT_EQ(MatchDevice("a\nb", Cpu()).message().find('\n'), absl::string_view::npos);
}

// The check is wired into SamplerCore: a mismatch is refused up front, never sampled.
DeviceInfo SecondGpu() {
  DeviceInfo d = H200();
  d.ordinal = 1;
  d.pci_bus_id = "0000:3b:00.0";
  d.uuid = "GPU-11111111-2222-3333-4444-555555555555";
  return d;
}

TEST(SelectDevice, EmptyNamesTheFirst) {
  EXPECT_EQ(SelectDevice("", {H200(), SecondGpu()}).value(), 0u);
}

TEST(SelectDevice, NamesADeviceByBusIdOrUuidInAnySpelling) {
  const std::vector<DeviceInfo> both = {H200(), SecondGpu()};
  EXPECT_EQ(SelectDevice("0000:3b:00.0", both).value(), 1u);
  EXPECT_EQ(SelectDevice("00000000:3B:00.0", both).value(), 1u);  // nvidia-smi's spelling
  EXPECT_EQ(SelectDevice("3b:00.0", both).value(), 1u);           // lspci's
  EXPECT_EQ(SelectDevice("11111111-2222-3333-4444-555555555555", both).value(), 1u);
  EXPECT_EQ(SelectDevice("gpu-6A1C2F3E-0B4D-4E5F-8A9B-0C1D2E3F4A5B", both).value(), 0u);
}

TEST(SelectDevice, AnUnknownDeviceListsTheDevices) {
  const absl::StatusOr<size_t> got = SelectDevice("1", {H200(), SecondGpu()});  // an ordinal
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "expected --gpu to name one GPU by PCI bus id or UUID among 0000:00:06.0 "
            "(GPU-6a1c2f3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b, NVIDIA H200), 0000:3b:00.0 "
            "(GPU-11111111-2222-3333-4444-555555555555, NVIDIA H200), got \"1\"");
}

TEST(SelectDevice, NoDevicesIsAnError) {
  const absl::StatusOr<size_t> got = SelectDevice("0000:00:06.0", {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("among none (no GPU is listed)"));
  EXPECT_FALSE(SelectDevice("", {}).ok());
}

TEST(SelectDevice, AmbiguousNamesAreRefused) {
  DeviceInfo twin = SecondGpu();
  twin.pci_bus_id = H200().pci_bus_id;  // a runtime listing one device twice
  const absl::StatusOr<size_t> got = SelectDevice("0000:00:06.0", {H200(), twin});
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("which names several"));
}

TEST(SamplerCoreGpuFlag, IsRefusedWithTheCpuBackend) {
  CoreOptions options;
  options.backend = BackendChoice::kCpu;
  options.gpu = "0000:00:06.0";
  const auto core = SamplerCore::Create(options);
  EXPECT_EQ(core.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core.status().message(),
            "expected --gpu only with --backend=gpu or auto, got --backend=cpu");
}

#if !SAMPLERD_HAVE_GPU
TEST(SamplerCoreGpuFlag, IsRefusedByACpuOnlyBuild) {
  CoreOptions options;
  options.gpu = "0000:00:06.0";
  const auto core = SamplerCore::Create(options);
  EXPECT_EQ(core.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(core.status().message()), HasSubstr("CPU-only build"));
}
#endif

TEST(SamplerCoreDevice, RefusesARequestForAnotherDevice) {
  SamplerCore core(CoreOptions{}, std::make_unique<CpuSampler>(1), /*seed_start=*/1);
  const std::string bytes(4 * 3, '\0');
  SampleRequest r;
  r.dtype = kernels::DType::kFp32;
  r.shape = {1, 3};
  r.inline_data = bytes;
  r.has_inline_data = true;
  r.device = "0000:00:06.0";
  bool called = false;
  const absl::Status status =
      core.SampleAsync(r, [&called](absl::StatusOr<SampleResult>) { called = true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(called);

  r.device = "cpu";
  const absl::StatusOr<SampleResult> got = SampleAndWait(core, r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids.size(), 1u);
}

}  // namespace
}  // namespace samplerd::core
