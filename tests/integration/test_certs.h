// Certificates for the TLS tests, made with the openssl command-line tool in a scratch
// directory: a CA, a server certificate it signs (SAN localhost and 127.0.0.1), a client
// certificate it signs, and a client certificate signed by another CA. EC P-256, valid 2 days.
#ifndef SAMPLERD_TESTS_INTEGRATION_TEST_CERTS_H_
#define SAMPLERD_TESTS_INTEGRATION_TEST_CERTS_H_

#include <memory>
#include <string>

namespace samplerd::integration {

class TestCerts {
 public:
  // Makes the certificates in a new temporary directory. Returns null and stores the reason
  // (with openssl's output) in *error when openssl is missing or fails.
  static std::unique_ptr<TestCerts> Create(std::string* error);
  // Removes the directory.
  ~TestCerts();

  // Paths of PEM files.
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string ca_cert() const { return Path("ca.crt"); }
  std::string server_cert() const { return Path("server.crt"); }
  std::string server_key() const { return Path("server.key"); }
  std::string client_cert() const { return Path("client.crt"); }
  std::string client_key() const { return Path("client.key"); }
  std::string other_client_cert() const { return Path("other-client.crt"); }  // other CA's
  std::string other_client_key() const { return Path("other-client.key"); }

  // A file's contents ("" when unreadable).
  std::string Read(const std::string& path) const;

 private:
  TestCerts() = default;
  std::string dir_;
};

}  // namespace samplerd::integration

#endif  // SAMPLERD_TESTS_INTEGRATION_TEST_CERTS_H_
