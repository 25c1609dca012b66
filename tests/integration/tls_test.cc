// TLS and mutual TLS on the real binary's TCP listener, with certificates made by openssl in the
// test: a TLS client that trusts the CA is served; a plaintext client is not; with
// --tls_client_ca, a client without a certificate or with one from another CA is refused and one
// with a certificate from the CA is served. Readiness is checked on the plaintext health port.
#include <memory>
#include <string>

#include "tests/integration/integration_fixture.h"
#include "tests/integration/test_certs.h"

namespace samplerd::integration {
namespace {

class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    certs_ = TestCerts::Create(&error);
    ASSERT_NE(certs_, nullptr) << error;
  }
  static void TearDownTestSuite() { certs_.reset(); }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::cerr << server_->Log();
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(), 0) << server_->Log();
    }
  }

  // Starts a server on 127.0.0.1:PORT with TLS, mutual when `client_ca`.
  void StartTlsServer(bool client_ca) {
    ASSERT_NE(certs_, nullptr);
    const int port = PickFreeTcpPort();
    const int health_port = PickFreeTcpPort();
    ServerProcess::Options options = CpuServerOptions();
    options.listen = "127.0.0.1:" + std::to_string(port);
    options.health_target = "127.0.0.1:" + std::to_string(health_port);
    options.extra_args.push_back("--health_port=" + std::to_string(health_port));
    options.extra_args.push_back("--health_address=127.0.0.1");
    options.extra_args.push_back("--tls_cert=" + certs_->server_cert());
    options.extra_args.push_back("--tls_key=" + certs_->server_key());
    if (client_ca) options.extra_args.push_back("--tls_client_ca=" + certs_->ca_cert());
    std::string error;
    server_ = ServerProcess::Start(options, &error);
    ASSERT_NE(server_, nullptr) << error;
  }

  // TLS credentials that trust the test CA, with the client certificate `cert` (none: "").
  static std::shared_ptr<grpc::ChannelCredentials> TlsCredentials(const std::string& cert,
                                                                  const std::string& key) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = certs_->Read(certs_->ca_cert());
    if (!cert.empty()) {
      ssl.pem_cert_chain = certs_->Read(cert);
      ssl.pem_private_key = certs_->Read(key);
    }
    return grpc::SslCredentials(ssl);
  }

  // One greedy Sample over `credentials`; expects the right tokens when it succeeds.
  grpc::Status SampleWith(const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    // The certificate names localhost (DNS) and 127.0.0.1 (IP); gRPC 1.51's client matches the
    // target's host against DNS names only, so a client dialling 127.0.0.1 names the server.
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    std::unique_ptr<v1::SamplerService::Stub> stub = v1::SamplerService::NewStub(
        grpc::CreateCustomChannel(server_->target(), credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const GreedyCase c = KnownGreedyBatch();
    v1::SampleResponse response;
    const grpc::Status status = stub->Sample(&context, c.logits.Request({Greedy()}), &response);
    if (status.ok()) {
      EXPECT_EQ(Tokens(response), c.expected);
    }
    return status;
  }

  inline static std::unique_ptr<TestCerts> certs_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(Tls, ATlsClientThatTrustsTheCaIsServed) {
  StartTlsServer(/*client_ca=*/false);
  const grpc::Status status = SampleWith(TlsCredentials("", ""));
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_TRUE(MentionsAny(server_->Log(), {"(TCP: TLS)"})) << server_->Log();
}

TEST_F(Tls, APlaintextClientIsRefused) {
  StartTlsServer(/*client_ca=*/false);
  const grpc::Status status = SampleWith(grpc::InsecureChannelCredentials());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(SampleWith(TlsCredentials("", "")).ok());  // the refusal was the plaintext
}

TEST_F(Tls, MutualTlsRefusesAClientWithoutACertificate) {
  StartTlsServer(/*client_ca=*/true);
  const grpc::Status status = SampleWith(TlsCredentials("", ""));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(SampleWith(TlsCredentials(certs_->client_cert(), certs_->client_key())).ok());
}

TEST_F(Tls, MutualTlsRefusesACertificateFromAnotherCa) {
  StartTlsServer(/*client_ca=*/true);
  const grpc::Status status =
      SampleWith(TlsCredentials(certs_->other_client_cert(), certs_->other_client_key()));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(SampleWith(TlsCredentials(certs_->client_cert(), certs_->client_key())).ok());
}

TEST_F(Tls, MutualTlsServesAClientWithACertificateFromTheCa) {
  StartTlsServer(/*client_ca=*/true);
  const grpc::Status status =
      SampleWith(TlsCredentials(certs_->client_cert(), certs_->client_key()));
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_TRUE(MentionsAny(server_->Log(), {"(TCP: mutual TLS)"})) << server_->Log();
}

TEST_F(Tls, CertWithoutKeyFailsStartupWithExitCode2AndSaysWhy) {
  ASSERT_NE(certs_, nullptr);
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--tls_cert=" + certs_->server_cert());
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"expected both --tls_cert and --tls_key, or neither"})) << error;
}

TEST_F(Tls, UnreadableKeyFailsStartupWithExitCode2) {
  ASSERT_NE(certs_, nullptr);
  ServerProcess::Options options = CpuServerOptions();
  options.listen = "127.0.0.1:" + std::to_string(PickFreeTcpPort());
  options.extra_args.push_back("--tls_cert=" + certs_->server_cert());
  options.extra_args.push_back("--tls_key=/nonexistent/server.key");
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"expected to read --tls_key=/nonexistent/server.key"})) << error;
}

TEST_F(Tls, AKeyOfAnotherCertificateFailsStartupWithExitCode2) {
  ASSERT_NE(certs_, nullptr);
  ServerProcess::Options options = CpuServerOptions();
  options.listen = "127.0.0.1:" + std::to_string(PickFreeTcpPort());
  options.extra_args.push_back("--tls_cert=" + certs_->server_cert());
  options.extra_args.push_back("--tls_key=" + certs_->client_key());
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"a TLS key that does not match its certificate"})) << error;
}

}  // namespace
}  // namespace samplerd::integration
