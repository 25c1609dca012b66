// Regions bound to their owner (issue 12, item 5), through the real samplerd (CPU backend): a
// producer process registers host shm regions over the unix socket and is SIGKILLed; its
// regions are gone within 1 s, and the server's mappings of the shm objects (/proc/PID/maps)
// and its descriptors (/proc/PID/fd) return to their baseline. A request in flight on a dead
// owner's region still completes, and the region is unmapped after it. Explicit unregister
// still works; ListRegions names each region's owner, and the region gauge follows; over TCP a
// region has no owner.
// The producer is region_owner_producer.cc (REGION_OWNER_PRODUCER).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "samplerd/host_shm_buffer.h"
#include "tests/integration/integration_fixture.h"
#include "tests/integration/metrics_scrape.h"

#ifndef REGION_OWNER_PRODUCER
#error "REGION_OWNER_PRODUCER must name the producer binary (tests/integration/CMakeLists.txt)"
#endif

namespace samplerd::integration {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string UniqueKey(const std::string& tag) {
  static int counter = 0;
  return "/samplerd-owner-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
         tag;
}

// Descriptors open in process `pid`.
int FdCount(pid_t pid) {
  int count = 0;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++count;
  }
  return count;
}

// Lines of /proc/`pid`/maps that map the shm object `key` (shown as /dev/shm/NAME).
int Mappings(pid_t pid, const std::string& key) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm" + key) != std::string::npos) ++count;
  }
  return count;
}

// Polls `done` every 2 ms until it holds or `timeout` passes; returns the time it took, or
// `timeout` + 1 ms when it never held.
milliseconds WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  const Clock::time_point start = Clock::now();
  while (!done()) {
    if (Clock::now() - start > timeout) return timeout + milliseconds(1);
    std::this_thread::sleep_for(milliseconds(2));  // another process's progress: nothing to wait on
  }
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// region_owner_producer as a child process: its stdout is read until "ready", its stdin is kept
// open (closing it lets it exit).
class Producer {
 public:
  // Starts the producer on `target` with NAME=KEY:BYTES `specs`; waits for "ready". On failure
  // returns false with the reason in *error.
  bool Start(const std::string& target, const std::vector<std::string>& specs, std::string* error) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return Fail("pipe", error);
    std::vector<std::string> args = {REGION_OWNER_PRODUCER, target};
    args.insert(args.end(), specs.begin(), specs.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    std::string line;
    pollfd fd = {out[0], POLLIN, 0};
    char c = 0;
    while (c != '\n' && poll(&fd, 1, 30000) == 1 && read(out[0], &c, 1) == 1) line += c;
    close(out[0]);
    if (line.rfind("ready ", 0) != 0) return Fail("no ready line, got '" + line + "'", error);
    return true;
  }

  // SIGKILLs the producer and reaps it.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  ~Producer() {
    Kill();
    if (stdin_ >= 0) close(stdin_);
  }

  pid_t pid() const { return pid_; }

 private:
  bool Fail(const std::string& what, std::string* error) {
    *error = "producer: " + what;
    Kill();
    return false;
  }
  pid_t pid_ = -1;
  int stdin_ = -1;
};

class RegionOwner : public ServerSuite {
 protected:
  static void SetUpTestSuite() { port_ = StartServerWithMetrics(); }

  void SetUp() override {
    ServerSuite::SetUp();
    // Warm up what the server makes once: the owner watcher's thread and epoll (at the first
    // owned registration), and this client's connection. The baseline is taken after it.
    std::string error;
    warm_ = HostShmBuffer::Create(UniqueKey("warm"), 4096, &error);
    ASSERT_NE(warm_, nullptr) << error;
    ASSERT_TRUE(client_->RegisterHostShm("warm", warm_->key(), 0, 4096).ok());
    ASSERT_TRUE(client_->Unregister("warm").ok());
    ASSERT_LE(
        WaitFor([&] { return Mappings(server().pid(), warm_->key()) == 0; }, milliseconds(1000)),
        milliseconds(1000));
    baseline_fds_ = FdCount(server().pid());
  }

  // The names of the registered regions whose owner is `pid`.
  std::vector<std::string> OwnedBy(pid_t pid) {
    std::vector<v1::RegionInfo> regions;
    EXPECT_TRUE(client_->ListRegions(&regions).ok());
    std::vector<std::string> names;
    for (const v1::RegionInfo& r : regions) {
      if (r.owner_pid() == pid) names.push_back(r.name());
    }
    return names;
  }

  // Expects the server's descriptors back at the baseline within 1 s.
  void ExpectFdsAtBaseline() {
    const pid_t server_pid = server().pid();
    const milliseconds took =
        WaitFor([&] { return FdCount(server_pid) == baseline_fds_; }, milliseconds(1000));
    EXPECT_LE(took, milliseconds(1000))
        << "descriptors: " << FdCount(server_pid) << ", baseline " << baseline_fds_;
  }

  inline static int port_ = 0;
  std::unique_ptr<HostShmBuffer> warm_;
  int baseline_fds_ = 0;
};

TEST_F(RegionOwner, KilledProducersRegionsAreGoneWithinOneSecondWithTheirMappingsAndFds) {
  std::vector<std::unique_ptr<HostShmBuffer>> objects;
  std::vector<std::string> specs;
  std::string error;
  for (int i = 0; i < 3; ++i) {
    objects.push_back(HostShmBuffer::Create(UniqueKey("p" + std::to_string(i)), 65536, &error));
    ASSERT_NE(objects.back(), nullptr) << error;
    specs.push_back("owned" + std::to_string(i) + "=" + objects.back()->key() + ":65536");
  }
  Producer producer;
  ASSERT_TRUE(producer.Start(server().target(), specs, &error)) << error;
  const pid_t producer_pid = producer.pid();
  const pid_t server_pid = server().pid();

  std::vector<v1::RegionInfo> regions;
  ASSERT_TRUE(client_->ListRegions(&regions).ok());
  ASSERT_EQ(regions.size(), 3u);
  for (const v1::RegionInfo& r : regions) {
    EXPECT_EQ(r.owner_pid(), producer_pid) << r.name();
    EXPECT_TRUE(r.owner_watched()) << r.name();
  }
  for (const auto& object : objects) EXPECT_EQ(Mappings(server_pid, object->key()), 1);
  const std::string registered = ScrapeMetrics(port_);
  EXPECT_EQ(SeriesValue(registered, "samplerd_regions{kind=\"host_shm\"}"), 3);
  EXPECT_EQ(SeriesValue(registered, "samplerd_region_bytes{kind=\"host_shm\"}"), 3 * 65536);
  EXPECT_GT(FdCount(server_pid), baseline_fds_);  // the producer's connection and its pidfd

  producer.Kill();
  const milliseconds gone =
      WaitFor([&] { return OwnedBy(producer_pid).empty(); }, milliseconds(1000));
  EXPECT_LE(gone, milliseconds(1000)) << "regions still registered a second after SIGKILL";
  const milliseconds unmapped = WaitFor(
      [&] {
        for (const auto& object : objects) {
          if (Mappings(server_pid, object->key()) != 0) return false;
        }
        return true;
      },
      milliseconds(1000));
  EXPECT_LE(unmapped, milliseconds(1000)) << "the server still maps the objects";
  ExpectFdsAtBaseline();
  // The region gauge follows releases the client did not ask for (recounted just after them).
  EXPECT_LE(WaitFor(
                [&] {
                  const std::string text = ScrapeMetrics(port_);
                  return SeriesValue(text, "samplerd_regions{kind=\"host_shm\"}") == 0 &&
                         SeriesValue(text, "samplerd_region_bytes{kind=\"host_shm\"}") == 0;
                },
                milliseconds(1000)),
            milliseconds(1000));
  std::cout << "[ measured ] regions gone " << gone.count() << " ms after SIGKILL, unmapped "
            << unmapped.count() << " ms after\n";
}

TEST_F(RegionOwner, RequestInFlightOnADeadOwnersRegionCompletesThenTheRegionIsUnmapped) {
  // Big enough to run for a while on two threads: top-k + top-p over a large vocabulary.
  constexpr int64_t kBatch = 64, kVocab = 131072;
  constexpr uint64_t kBytes = kBatch * kVocab * sizeof(float);
  std::string error;
  std::unique_ptr<HostShmBuffer> object = HostShmBuffer::Create(UniqueKey("big"), kBytes, &error);
  ASSERT_NE(object, nullptr) << error;
  auto* logits = static_cast<float*>(object->data());
  std::vector<int32_t> expected(kBatch);
  for (int64_t r = 0; r < kBatch; ++r) {
    for (int64_t v = 0; v < kVocab; ++v)
      logits[r * kVocab + v] = static_cast<float>(v % 97) * 0.01f;
    expected[r] = static_cast<int32_t>((r * 7919) % kVocab);
    logits[r * kVocab + expected[r]] = 100.0f;  // top-p 0.9 keeps only this token
  }
  Producer producer;
  ASSERT_TRUE(producer.Start(server().target(),
                             {"inflight=" + object->key() + ":" + std::to_string(kBytes)}, &error))
      << error;
  const pid_t server_pid = server().pid();

  std::atomic<bool> done{false};
  grpc::Status status;
  v1::SampleResponse response;
  std::thread request([&] {
    Client consumer(server().target(), ClientOptions{256 << 20, std::chrono::seconds(120)});
    status = consumer.Sample(
        MakeRegionRequest("inflight", 0, v1::DTYPE_FP32, kBatch, kVocab, {TopKTopP(5)}), &response);
    done = true;
  });
  const milliseconds started =
      WaitFor([&] { return SeriesValue(ScrapeMetrics(port_), "samplerd_inflight_requests") >= 1; },
              milliseconds(10000));
  ASSERT_LE(started, milliseconds(10000)) << "the request never showed in flight";

  producer.Kill();
  const milliseconds gone = WaitFor(
      [&] {
        std::vector<v1::RegionInfo> regions;
        return client_->ListRegions(&regions).ok() && regions.empty();
      },
      milliseconds(1000));
  EXPECT_LE(gone, milliseconds(1000)) << "the dead owner's region is still listed";
  ASSERT_FALSE(done) << "the request ended before the test could see it in flight: make it bigger";
  EXPECT_EQ(Mappings(server_pid, object->key()), 1) << "unmapped under a request in flight";

  request.join();
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(Tokens(response), expected);
  const milliseconds unmapped =
      WaitFor([&] { return Mappings(server_pid, object->key()) == 0; }, milliseconds(1000));
  EXPECT_LE(unmapped, milliseconds(1000)) << "the region outlived its last request";
  ExpectFdsAtBaseline();
  std::cout << "[ measured ] region unlisted " << gone.count()
            << " ms after SIGKILL with the request in flight\n";
}

TEST_F(RegionOwner, ListRegionsNamesTheOwnerAndExplicitUnregisterStillWorks) {
  std::string error;
  std::unique_ptr<HostShmBuffer> mine = HostShmBuffer::Create(UniqueKey("mine"), 4096, &error);
  std::unique_ptr<HostShmBuffer> theirs = HostShmBuffer::Create(UniqueKey("theirs"), 4096, &error);
  ASSERT_NE(mine, nullptr);
  ASSERT_NE(theirs, nullptr);
  v1::RegionInfo info;
  ASSERT_TRUE(client_->RegisterHostShm("mine", mine->key(), 0, 4096, &info).ok());
  EXPECT_EQ(info.owner_pid(), getpid());
  EXPECT_TRUE(info.owner_watched());

  Producer producer;
  ASSERT_TRUE(producer.Start(server().target(), {"theirs=" + theirs->key() + ":4096"}, &error))
      << error;
  EXPECT_EQ(OwnedBy(getpid()), std::vector<std::string>{"mine"});
  EXPECT_EQ(OwnedBy(producer.pid()), std::vector<std::string>{"theirs"});

  // Anyone on the socket may still unregister any region, and the name is free again.
  ASSERT_TRUE(client_->Unregister("theirs").ok());
  EXPECT_TRUE(OwnedBy(producer.pid()).empty());
  EXPECT_EQ(Mappings(server().pid(), theirs->key()), 0);
  ASSERT_TRUE(client_->RegisterHostShm("theirs", theirs->key(), 0, 4096, &info).ok());
  EXPECT_EQ(info.owner_pid(), getpid());

  // The producer's death now touches nothing of ours.
  producer.Kill();
  ASSERT_TRUE(client_->Unregister("mine").ok());
  EXPECT_EQ(OwnedBy(getpid()), std::vector<std::string>{"theirs"});
  ASSERT_TRUE(client_->Unregister("theirs").ok());
  EXPECT_EQ(client_->Unregister("theirs").error_code(), grpc::StatusCode::NOT_FOUND);
  ExpectFdsAtBaseline();
}

TEST(RegionOwnerTcp, RegionsRegisteredOverTcpHaveNoOwnerAndStay) {
  const int port = PickFreeTcpPort();
  ServerProcess::Options options = CpuServerOptions();
  options.listen = "127.0.0.1:" + std::to_string(port);
  options.extra_args.push_back("--allow_remote_regions");
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  std::unique_ptr<HostShmBuffer> object = HostShmBuffer::Create(UniqueKey("tcp"), 4096, &error);
  ASSERT_NE(object, nullptr) << error;
  {
    Client client(server->target());
    v1::RegionInfo info;
    ASSERT_TRUE(client.RegisterHostShm("tcp", object->key(), 0, 4096, &info).ok());
    EXPECT_EQ(info.owner_pid(), 0);
    EXPECT_FALSE(info.owner_watched());
  }  // the registering client disconnects
  {
    Client other(server->target());
    std::vector<v1::RegionInfo> regions;
    ASSERT_TRUE(other.ListRegions(&regions).ok());
    ASSERT_EQ(regions.size(), 1u);
    EXPECT_EQ(regions[0].owner_pid(), 0);
    EXPECT_FALSE(regions[0].owner_watched());
    EXPECT_EQ(Mappings(server->pid(), object->key()), 1);
    ASSERT_TRUE(other.Unregister("tcp").ok());
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

}  // namespace
}  // namespace samplerd::integration
