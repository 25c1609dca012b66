// NameThisThread: names the calling thread as top, gdb and /proc/PID/task/TID/comm show it.
// Without it a thread keeps its creator's name (a registry thread started from a gRPC handler
// showed up as one more "nexting_thread"). Linux allows 15 characters; longer names are cut.
#ifndef SAMPLERD_SERVICE_CORE_MODEL_THREAD_NAME_H_
#define SAMPLERD_SERVICE_CORE_MODEL_THREAD_NAME_H_

#include <pthread.h>

#include <cstring>
#include <string>

namespace samplerd {

inline void NameThisThread(const char* name) {
  const std::string cut(name, strnlen(name, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace samplerd

#endif  // SAMPLERD_SERVICE_CORE_MODEL_THREAD_NAME_H_
