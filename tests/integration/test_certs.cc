#include "tests/integration/test_certs.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace samplerd::integration {
namespace {

constexpr char kNewKey[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

// `name` (a CA when `ca` is empty) signed by `ca`, with the X.509 v3 extensions `extensions`.
std::vector<std::string> Commands(const std::string& name, const std::string& subject,
                                  const std::string& ca, const std::string& extensions,
                                  int serial) {
  if (ca.empty()) {
    return {"openssl req -x509 " + std::string(kNewKey) + " -keyout " + name + ".key -out " + name +
            ".crt -days 2 -subj /CN=" + subject};
  }
  return {"printf '" + extensions + "\\n' > " + name + ".ext",
          "openssl req " + std::string(kNewKey) + " -keyout " + name + ".key -out " + name +
              ".csr -subj /CN=" + subject,
          "openssl x509 -req -in " + name + ".csr -CA " + ca + ".crt -CAkey " + ca +
              ".key -set_serial " + std::to_string(serial) + " -days 2 -out " + name +
              ".crt -extfile " + name + ".ext"};
}

}  // namespace

std::unique_ptr<TestCerts> TestCerts::Create(std::string* error) {
  std::unique_ptr<TestCerts> certs(new TestCerts());
  std::string dir = std::filesystem::temp_directory_path().string() + "/samplerd-certs-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    *error = "mkdtemp failed";
    return nullptr;
  }
  certs->dir_ = dir;
  std::vector<std::string> commands;
  for (const auto& part : {
           Commands("ca", "samplerd-test-ca", "", "", 0),
           Commands("server", "localhost", "ca",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth", 1),
           Commands("client", "engine", "ca", "extendedKeyUsage=clientAuth", 2),
           Commands("other-ca", "other-test-ca", "", "", 0),
           Commands("other-client", "engine", "other-ca", "extendedKeyUsage=clientAuth", 3),
       }) {
    commands.insert(commands.end(), part.begin(), part.end());
  }
  const std::string log = dir + "/openssl.log";
  for (const std::string& command : commands) {
    const std::string line = "cd '" + dir + "' && " + command + " >> openssl.log 2>&1";
    if (std::system(line.c_str()) != 0) {
      *error = "failed: " + command + "\n" + certs->Read(log);
      return nullptr;
    }
  }
  return certs;
}

TestCerts::~TestCerts() {
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string TestCerts::Read(const std::string& path) const {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace samplerd::integration
