// Whether this process runs under CUDA MPS (the Multi-Process Service), for GetServerInfo.
//
// The heuristic: a CUDA client joins MPS when, at context creation, it finds the control
// daemon's named pipe `control` in its pipe directory: $CUDA_MPS_PIPE_DIRECTORY when set and
// non-empty, else /tmp/nvidia-mps (the daemon's default). So "under MPS" here means "that pipe
// exists now". It can be wrong both ways: a daemon started after our context was created is
// not used by us (the answer says true), and a daemon refusing clients (for example one of
// another user) also counts. It never creates a context nor talks to the daemon.
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_MPS_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_MPS_H_

#include <string>

namespace samplerd::core {

// The pipe directory a CUDA client would use: $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps.
std::string MpsPipeDirectory();

// True when `pipe_directory` holds the MPS control pipe (a FIFO or socket named "control").
bool MpsControlPipeIn(const std::string& pipe_directory);

// True when the MPS control pipe is in MpsPipeDirectory().
bool UnderMps();

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_MPS_H_
