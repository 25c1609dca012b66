#include "service/metrics/registry.h"

#include "prometheus/text_serializer.h"

namespace samplerd::metrics {

Registry::Registry()
    : registry_(
          std::make_shared<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}

std::string Registry::ExpositionText() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace samplerd::metrics
