// The registry samplerd's metrics live in: a prometheus-cpp Registry, owned the way its HTTP
// exposer needs it and with samplerd's choice of duplicate-name policy.
//
// Why a wrapper and not prometheus::Registry itself: the exposer keeps only a weak_ptr to what it
// serves, so the registry must be held by a shared_ptr; a name registered twice must be an error
// (prometheus-cpp's default merges it silently into the first family); and tests want the text a
// scrape would answer without an HTTP round trip.
//
//   Registry registry;
//   SamplerMetrics::Create(&registry);            // families go into registry.prometheus()
//   HttpExporter::Start("0.0.0.0", 9090, &registry);
//   std::string text = registry.ExpositionText();  // what GET /metrics answers
//
// Thread-safety: as prometheus::Registry's, everything may be called from any thread.
#ifndef SAMPLERD_SERVICE_METRICS_REGISTRY_H_
#define SAMPLERD_SERVICE_METRICS_REGISTRY_H_

#include <memory>
#include <string>

#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace samplerd::metrics {

class Registry {
 public:
  // An empty registry that throws std::invalid_argument on a family name registered twice.
  Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Where metric families are built (prometheus::BuildCounter().Register(registry.prometheus())).
  prometheus::Registry& prometheus() { return *registry_; }

  // What an exposer registers; it expires with this Registry.
  std::weak_ptr<prometheus::Collectable> collectable() const { return registry_; }

  // Every family in the Prometheus text exposition format 0.0.4, as a scrape answers it.
  // Cost: proportional to the number of series; takes each family's lock briefly.
  std::string ExpositionText() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace samplerd::metrics

#endif  // SAMPLERD_SERVICE_METRICS_REGISTRY_H_
