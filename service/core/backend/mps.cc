// UnderMps(): looks for the MPS control pipe where a CUDA client would (see mps.h).
#include "service/core/backend/mps.h"

#include <sys/stat.h>

#include <cstdlib>

namespace samplerd::core {

std::string MpsPipeDirectory() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (dir != nullptr && dir[0] != '\0') return dir;
  return "/tmp/nvidia-mps";
}

bool MpsControlPipeIn(const std::string& pipe_directory) {
  if (pipe_directory.empty()) return false;
  const std::string path = pipe_directory + "/control";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  return S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode);
}

bool UnderMps() { return MpsControlPipeIn(MpsPipeDirectory()); }

}  // namespace samplerd::core
