#include "service/core/regions/ipc_event_cache.h"

#include "absl/strings/str_cat.h"

namespace samplerd::core {

absl::StatusOr<void*> IpcEventCache::Get(int ordinal, const IpcHandle& handle) {
  std::lock_guard<std::mutex> lock(mu_);  // held across OpenEvent: each handle opens once
  const auto key = std::make_pair(ordinal, handle);
  auto it = events_.find(key);
  if (it != events_.end()) return it->second;
  if (events_.size() >= kMaxEvents) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected at most ", kMaxEvents,
        " distinct IPC events per server, got more: reuse the engine's events across steps"));
  }
  absl::StatusOr<void*> event = ipc_->OpenEvent(ordinal, handle);
  if (event.ok()) events_.emplace(key, *event);
  return event;
}

void IpcEventCache::CloseAll() {
  std::map<std::pair<int, IpcHandle>, void*> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(events_);
  }
  for (const auto& [key, event] : events) ipc_->CloseEvent(key.first, event);
}

}  // namespace samplerd::core
