// A producer process for region_owner_test.cc: registers host shm regions with a samplerd over
// its unix socket, says so, then waits to be killed (or for its stdin to close, then exits
// without unregistering: either way its regions are left to the server's owner watch).
//
//   region_owner_producer TARGET NAME=KEY:BYTES [NAME=KEY:BYTES ...]
//
// Prints "ready <pid>\n" on stdout once every region is registered; on a failed registration
// prints "error <code> <message>\n" and exits 1. The shm objects must exist (the test owns
// them).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "samplerd/client.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET NAME=KEY:BYTES [NAME=KEY:BYTES ...]\n", argv[0]);
    return 2;
  }
  samplerd::Client client(argv[1]);
  for (int i = 2; i < argc; ++i) {
    const std::string spec = argv[i];
    const size_t eq = spec.find('=');
    const size_t colon = spec.rfind(':');
    if (eq == std::string::npos || colon == std::string::npos || colon < eq) {
      std::fprintf(stderr, "expected NAME=KEY:BYTES, got %s\n", spec.c_str());
      return 2;
    }
    const grpc::Status status =
        client.RegisterHostShm(spec.substr(0, eq), spec.substr(eq + 1, colon - eq - 1), 0,
                               std::strtoull(spec.c_str() + colon + 1, nullptr, 10));
    if (!status.ok()) {
      std::printf("error %d %s\n", static_cast<int>(status.error_code()),
                  status.error_message().c_str());
      return 1;
    }
  }
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  char byte;
  while (read(STDIN_FILENO, &byte, 1) > 0) {
  }
  return 0;
}
