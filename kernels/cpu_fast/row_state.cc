// Scratch(): one ThreadScratch per thread, kept for the thread's life.
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

}  // namespace samplerd::kernels::cpu_fast_internal
