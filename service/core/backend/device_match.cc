#include "service/core/backend/device_match.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace samplerd::core {
namespace {

// Longest part of a requested name that goes into an error message.
constexpr size_t kMaxEchoed = 80;

struct PciAddress {
  uint64_t domain = 0;
  uint64_t bus = 0;
  uint64_t device = 0;
  uint64_t function = 0;
  bool operator==(const PciAddress& o) const {
    return domain == o.domain && bus == o.bus && device == o.device && function == o.function;
  }
};

// Parses 1 to `max_digits` hex digits.
std::optional<uint64_t> ParseHex(absl::string_view s, size_t max_digits) {
  if (s.empty() || s.size() > max_digits) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    const char l = absl::ascii_tolower(static_cast<unsigned char>(c));
    v = v * 16 + static_cast<uint64_t>(l <= '9' ? l - '0' : l - 'a' + 10);
  }
  return v;
}

// "[domain:]bus:device.function" in hex, as the runtimes (4-digit domain), nvidia-smi
// (8-digit domain) and lspci (no domain) print it.
std::optional<PciAddress> ParsePci(absl::string_view s) {
  const std::vector<absl::string_view> parts = absl::StrSplit(s, ':');
  if (parts.size() != 2 && parts.size() != 3) return std::nullopt;
  const std::vector<absl::string_view> dev_fn = absl::StrSplit(parts.back(), '.');
  if (dev_fn.size() != 2) return std::nullopt;
  PciAddress a;
  if (parts.size() == 3) {
    const auto domain = ParseHex(parts[0], 8);
    if (!domain) return std::nullopt;
    a.domain = *domain;
  }
  const auto bus = ParseHex(parts[parts.size() - 2], 2);
  const auto device = ParseHex(dev_fn[0], 2);
  const auto function = ParseHex(dev_fn[1], 1);
  if (!bus || !device || !function) return std::nullopt;
  a.bus = *bus;
  a.device = *device;
  a.function = *function;
  return a;
}

absl::string_view StripGpuPrefix(absl::string_view uuid) {
  return absl::StartsWithIgnoreCase(uuid, "GPU-") ? uuid.substr(4) : uuid;
}

bool IsCpu(const DeviceInfo& device) { return device.uuid == "cpu" && device.pci_bus_id.empty(); }

bool Matches(absl::string_view requested, const DeviceInfo& device) {
  if (IsCpu(device)) return absl::EqualsIgnoreCase(requested, "cpu");
  if (!device.pci_bus_id.empty()) {
    const std::optional<PciAddress> ours = ParsePci(device.pci_bus_id);
    const std::optional<PciAddress> theirs = ParsePci(requested);
    if (ours && theirs) return *ours == *theirs;
    if (absl::EqualsIgnoreCase(requested, device.pci_bus_id)) return true;
  }
  const absl::string_view uuid = StripGpuPrefix(device.uuid);
  return !uuid.empty() && absl::EqualsIgnoreCase(StripGpuPrefix(requested), uuid);
}

std::string Describe(const DeviceInfo& device) {
  if (IsCpu(device)) return "\"cpu\" (this server samples on the CPU)";
  std::string out = absl::StrCat("\"", device.pci_bus_id, "\"");
  if (!device.uuid.empty()) absl::StrAppend(&out, " or \"", device.uuid, "\"");
  return out;
}

}  // namespace

absl::Status MatchDevice(absl::string_view requested, const DeviceInfo& device) {
  if (requested.empty() || Matches(requested, device)) return absl::OkStatus();
  const bool long_name = requested.size() > kMaxEchoed;
  return absl::FailedPreconditionError(
      absl::StrCat("expected device ", Describe(device), ", got \"",
                   absl::CHexEscape(requested.substr(0, kMaxEchoed)), long_name ? "...\"" : "\"",
                   " (devices are named by PCI bus id or UUID; GetServerInfo lists them)"));
}

absl::StatusOr<size_t> SelectDevice(absl::string_view spec,
                                    const std::vector<DeviceInfo>& devices) {
  std::vector<size_t> matches;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (spec.empty() ? i == 0 : Matches(spec, devices[i])) matches.push_back(i);
  }
  if (matches.size() == 1) return matches[0];
  std::string listed;
  for (const DeviceInfo& d : devices) {
    absl::StrAppend(&listed, listed.empty() ? "" : ", ", d.pci_bus_id, " (", d.uuid, ", ", d.name,
                    ")");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected --gpu to name one GPU by PCI bus id or UUID among ",
      listed.empty() ? "none (no GPU is listed)" : listed, ", got \"", spec.substr(0, kMaxEchoed),
      "\"", matches.size() > 1 ? ", which names several" : ""));
}

}  // namespace samplerd::core
