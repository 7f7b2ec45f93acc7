// What a security reviewer tries on gacd: a token file others can read,
// tokens leaking into error messages or logs, TLS with client certificates
// (mTLS), oversized request metadata, and deeply nested messages. Real gRPC
// clients against in-process servers and real gacd processes.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <vector>

#include "gac/transport/remote_controller.h"
#include "gac/transport/telemetry.h"
#include "server/src/auth.h"
#include "tests/common/test_util.h"

namespace gac::testing {
namespace {

using namespace std::chrono_literals;
using server::GacServer;

const std::vector<std::string> kAllTokens = {kWriterToken, kReaderToken, kAdminToken, kOtherToken};

void ExpectNoToken(const std::string& text, const std::string& where) {
  for (const std::string& token : kAllTokens) {
    EXPECT_EQ(text.find(token), std::string::npos) << where << " repeats a token: " << text;
  }
}

// ---- the token file's mode ----

TEST(TokenFile, OthersMayNotReadOrChangeIt) {
  ScratchDir dir;
  const std::string path = WriteTestTokens(dir);
  struct Mode {
    mode_t mode;
    bool accepted;
  };
  const Mode modes[] = {{0600, true},  {0400, true},  {0640, true},  {0440, true},
                        {0644, false}, {0604, false}, {0660, false}, {0620, false}, {0602, false}};
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.mode);
    ASSERT_EQ(chmod(path.c_str(), m.mode), 0);
    base::StatusOr<server::Authenticator> auth = server::Authenticator::FromFile(path);
    if (m.accepted) {
      EXPECT_TRUE(auth.ok()) << auth.status().ToString();
      continue;
    }
    ASSERT_FALSE(auth.ok());
    EXPECT_EQ(auth.status().code(), base::StatusCode::kFailedPrecondition) << auth.status().ToString();
    EXPECT_NE(auth.status().message().find(path), std::string::npos);
    EXPECT_NE(auth.status().message().find("chmod 600"), std::string::npos) << auth.status().ToString();
    ExpectNoToken(auth.status().message(), "the refusal");
  }
}

TEST(TokenFile, GacdRefusesToStartWithAWorldReadableOne) {
  ScratchDir dir;
  const std::string tokens = WriteTestTokens(dir);
  ASSERT_EQ(chmod(tokens.c_str(), 0644), 0);
  std::string out;
  const int rc = RunProcess({GacdProcess::Binary(), "--listen=127.0.0.1:0", "--http-listen=",
                             "--store=sqlite:" + dir.File("data"), "--token-file=" + tokens},
                            "", &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("has mode 0644"), std::string::npos) << out;
  ExpectNoToken(out, "gacd's start-up error");
}

// ---- tokens never in error messages or logs ----

// A token with its last character changed: close to a real one.
std::string Near(const std::string& token) {
  std::string t = token;
  t.back() = t.back() == 'x' ? 'y' : 'x';
  return t;
}

TEST(Secrets, NoErrorMessageOrLogLineRepeatsAToken) {
  ScratchDir dir;
  GacdProcess gacd({"--listen=127.0.0.1:0", "--http-listen=", "--store=sqlite:" + dir.File("data"),
                    "--token-file=" + WriteTestTokens(dir), "--drain-timeout=1s"});
  ASSERT_TRUE(gacd.Start(dir.File("ready"))) << gacd.error();
  std::vector<std::string> errors;
  auto record = [&](const grpc::Status& st) {
    EXPECT_FALSE(st.ok());
    errors.push_back(st.error_message());
  };
  const auto batch = [](const std::string& run) { return std::vector<v1::IngestRequest>{MakeBatch(1, {MakeStep(run, 0)})}; };
  v1::DecideRequest decide;
  decide.set_run("exp-secret");
  v1::DecideResponse decided;
  v1::SetRunConfigRequest set;
  set.set_run("exp-secret");
  set.mutable_thresholds()->set_c_low(0.1);
  set.mutable_thresholds()->set_c_high(0.5);
  set.set_mode(v1::CONTROL_MODE_REMOTE);
  v1::RunConfig cfg;
  for (const std::string& token : kAllTokens) {
    record(Client(gacd.address(), Near(token)).Ingest(batch("exp-secret")));
    record(Client(gacd.address(), Near(token)).Decide(decide, &decided));
  }
  record(Client(gacd.address(), kReaderToken).Ingest(batch("exp-secret")));   // no write right
  record(Client(gacd.address(), kWriterToken).Ingest(batch("other-secret")));  // outside its runs
  record(Client(gacd.address(), kWriterToken).SetRunConfig(set, &cfg));       // no admin right
  record(Client(gacd.address(), kReaderToken).Decide(decide, &decided));
  // A real token in a malformed header.
  for (const std::string& header : {"Token " + std::string(kAdminToken), std::string(kAdminToken),
                                    "Bearer  " + std::string(kAdminToken), "bearer " + std::string(kAdminToken)}) {
    Client raw(gacd.address(), "");
    auto ctx = raw.Context();
    ctx->AddMetadata("authorization", header);
    v1::RunConfig got;
    v1::GetRunConfigRequest get;
    get.set_run("exp-secret");
    auto stub = v1::AdminService::NewStub(raw.channel());
    record(stub->GetRunConfig(ctx.get(), get, &got));
  }
  ASSERT_GE(errors.size(), 16u);
  for (const std::string& e : errors) ExpectNoToken(e, "a gRPC error");

  // The agent's side: the sender's last error and the remote decision's.
  transport::TelemetryOptions t;
  t.address = gacd.address();
  t.token = Near(kWriterToken);
  t.flush_interval = 10ms;
  auto telemetry = transport::Telemetry::Start(t);
  ASSERT_TRUE(telemetry.ok());
  (*telemetry)->Enqueue(MakeStep("exp-secret", 1));
  EXPECT_FALSE((*telemetry)->Flush(1500ms));
  EXPECT_NE((*telemetry)->last_error().find("UNAUTHENTICATED"), std::string::npos) << (*telemetry)->last_error();
  ExpectNoToken((*telemetry)->last_error(), "Telemetry::last_error");
  ExpectNoToken(Near(kWriterToken), "");  // (the near token is no token)
  EXPECT_EQ((*telemetry)->last_error().find(Near(kWriterToken)), std::string::npos);
  (*telemetry)->Close(0ms);
  transport::RemoteControllerOptions r;
  r.address = gacd.address();
  r.token = Near(kWriterToken);
  r.run = "exp-secret";
  r.deadline = 2000ms;
  auto remote = transport::RemoteController::Create(r);
  ASSERT_TRUE(remote.ok());
  base::StatusOr<controller::Decision> d = (*remote)->Decide(1, {0.1, 1.0, 1.0, true});
  ASSERT_FALSE(d.ok());
  ExpectNoToken(d.status().ToString(), "RemoteController::Decide");
  EXPECT_EQ(d.status().ToString().find(Near(kWriterToken)), std::string::npos);

  EXPECT_EQ(gacd.Terminate(), 0);
  ExpectNoToken(gacd.Log(), "gacd's log");
}

TEST(Secrets, ATokenFileErrorNamesTheLineNotTheToken) {
  const std::string token = "0123456789abcdef-secret";
  const std::vector<std::string> bad = {
      "alice " + token + " write\n",                          // 3 fields
      "alice " + token + " write,fly *\n",                    // unknown right
      "al ice " + token + " write *\n",                       // 5 fields
      "alice " + token + " write *\nbob " + token + " read *\n",  // duplicate token
      "al!ce " + token + " write *\n",                        // bad name
      "alice " + token + " write ,\n",                        // empty run pattern
      "alice 0123456789abcdef-other " + token + " *\n",       // a token pasted over the rights
      "x " + token + " write *\nx 0123456789abcdef-other read *\n",  // duplicate name
  };
  for (const std::string& text : bad) {
    base::StatusOr<server::Authenticator> auth = server::Authenticator::FromText(text);
    ASSERT_FALSE(auth.ok()) << text;
    EXPECT_NE(auth.status().message().find("line "), std::string::npos) << auth.status().ToString();
    EXPECT_EQ(auth.status().message().find(token), std::string::npos) << auth.status().ToString();
  }
}

// ---- mTLS ----

// A CA, a server certificate for 127.0.0.1 and a client certificate it
// signed, and a client certificate of another CA. False (test skipped)
// when openssl cannot make them.
bool MakeCertificates(const ScratchDir& dir, std::string* why) {
  const std::string ext = dir.File("ext.cnf");
  WriteFile(ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  auto run = [&](std::vector<std::string> argv) {
    std::string out;
    if (RunProcess(argv, "", &out) != 0) {
      *why = out;
      return false;
    }
    return true;
  };
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
  auto req = [&](const std::string& name, const std::string& cn) {
    std::vector<std::string> argv = {"openssl", "req"};
    argv.insert(argv.end(), ec.begin(), ec.end());
    argv.insert(argv.end(), {"-subj", "/CN=" + cn, "-keyout", dir.File(name + ".key"), "-out", dir.File(name + ".csr")});
    return run(argv);
  };
  auto sign = [&](const std::string& name, const std::string& ca) {
    return run({"openssl", "x509", "-req", "-in", dir.File(name + ".csr"), "-CA", dir.File(ca + ".pem"), "-CAkey",
                dir.File(ca + ".key"), "-CAcreateserial", "-days", "1", "-extfile", ext, "-out",
                dir.File(name + ".pem")});
  };
  auto ca = [&](const std::string& name) {
    std::vector<std::string> argv = {"openssl", "req", "-x509"};
    argv.insert(argv.end(), ec.begin(), ec.end());
    argv.insert(argv.end(), {"-days", "1", "-subj", "/CN=" + name, "-keyout", dir.File(name + ".key"), "-out",
                             dir.File(name + ".pem")});
    return run(argv);
  };
  return ca("ca") && ca("other-ca") && req("server", "localhost") && sign("server", "ca") &&
         req("client", "trainer") && sign("client", "ca") && req("stranger", "stranger") &&
         sign("stranger", "other-ca");
}

std::shared_ptr<grpc::ChannelCredentials> Tls(const ScratchDir& dir, const std::string& client) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFileOrDie(dir.File("ca.pem"));
  if (!client.empty()) {
    o.pem_cert_chain = ReadFileOrDie(dir.File(client + ".pem"));
    o.pem_private_key = ReadFileOrDie(dir.File(client + ".key"));
  }
  return grpc::SslCredentials(o);
}

TEST(MutualTls, OnlyClientsWithACertificateOfTheCaConnect) {
  ScratchDir dir;
  std::string why;
  if (!MakeCertificates(dir, &why)) GTEST_SKIP() << "openssl cannot make certificates: " << why;
  server::ServerConfig config = TestConfig(dir);
  config.tls_cert = dir.File("server.pem");
  config.tls_key = dir.File("server.key");
  config.tls_client_ca = dir.File("ca.pem");
  auto s = GacServer::Start(config);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::string address = (*s)->address();

  Client trainer(address, kWriterToken, Tls(dir, "client"));
  EXPECT_TRUE(trainer.Ingest({MakeBatch(1, {MakeStep("exp-mtls", 0)})}).ok());
  grpc::health::v1::HealthCheckResponse h;
  EXPECT_EQ(Client(address, kWriterToken, Tls(dir, "")).Health(&h).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Client(address, kWriterToken, Tls(dir, "stranger")).Health(&h).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Client(address, kWriterToken).Health(&h).error_code(), grpc::StatusCode::UNAVAILABLE);  // plaintext
  // A certificate does not replace the token: both are needed.
  EXPECT_EQ(Client(address, "", Tls(dir, "client")).Ingest({MakeBatch(1, {MakeStep("exp-mtls", 1)})}).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The agent's transport with its certificate.
  transport::TelemetryOptions t;
  t.address = address;
  t.token = kWriterToken;
  t.tls_root_certs = ReadFileOrDie(dir.File("ca.pem"));
  t.tls_cert_chain = ReadFileOrDie(dir.File("client.pem"));
  t.tls_private_key = ReadFileOrDie(dir.File("client.key"));
  auto telemetry = transport::Telemetry::Start(t);
  ASSERT_TRUE(telemetry.ok());
  for (int step = 2; step < 12; ++step) (*telemetry)->Enqueue(MakeStep("exp-mtls", step));
  EXPECT_TRUE((*telemetry)->Flush(10s)) << (*telemetry)->last_error();
  (*telemetry)->Close(0ms);
  transport::RemoteControllerOptions r;
  r.address = address;
  r.token = kWriterToken;
  r.run = "exp-mtls";
  r.deadline = 5000ms;
  r.tls_root_certs = t.tls_root_certs;
  r.tls_cert_chain = t.tls_cert_chain;
  r.tls_private_key = t.tls_private_key;
  auto remote = transport::RemoteController::Create(r);
  ASSERT_TRUE(remote.ok());
  EXPECT_TRUE((*remote)->Decide(1, {0.1, 1.0, 1.0, true}).ok());
  r.tls_cert_chain.clear();
  r.tls_private_key.clear();
  auto without = transport::RemoteController::Create(r);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ((*without)->Decide(2, {0.1, 1.0, 1.0, true}).status().code(), base::StatusCode::kUnavailable);

  std::vector<v1::StepRecord> stored;
  ASSERT_TRUE(Client(address, kReaderToken, Tls(dir, "client")).AllSteps("exp-mtls", &stored).ok());
  EXPECT_EQ(stored.size(), 11u);  // step 0 and steps 2..11
}

TEST(MutualTls, ClientCaNeedsTls) {
  const char* argv[] = {"gacd", "--insecure", "--tls-client-ca=/etc/ca.pem"};
  base::StatusOr<server::Flags> flags = server::ParseFlags(3, argv);
  ASSERT_FALSE(flags.ok());
  EXPECT_NE(flags.status().message().find("--tls-client-ca needs --tls-cert"), std::string::npos)
      << flags.status().ToString();
}

// ---- oversized metadata and deep nesting ----

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = GacServer::Start(TestConfig(dir_), server::NewMemoryStore());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
  }

  // A client on a connection of its own: gRPC shares connections between
  // the channels of a process, and the one that carried the hostile call
  // may be closing (the server ends it), which would fail a new call with
  // "Broken pipe" although the server is up.
  Client FreshClient(const std::string& token) const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return Client(server_->address(), token, grpc::InsecureChannelCredentials(), args);
  }

  // Still serving, and a normal call still works.
  void ExpectHealthy() {
    Client c = FreshClient(kWriterToken);
    grpc::health::v1::HealthCheckResponse h;
    const grpc::Status hs = c.Health(&h);
    EXPECT_TRUE(hs.ok()) << hs.error_code() << " " << hs.error_message();
    v1::DecideRequest d;
    d.set_run("exp-ok");
    v1::DecideResponse r;
    EXPECT_TRUE(c.Decide(d, &r).ok());
  }

  ScratchDir dir_;
  std::unique_ptr<GacServer> server_;
};

TEST_F(Hostile, OversizedMetadataIsRefusedAndTheServerStaysUp) {
  Client c(server_->address(), "");
  v1::DecideRequest d;
  d.set_run("exp-meta");
  v1::DecideResponse r;
  {
    auto ctx = c.Context();
    ctx->AddMetadata("authorization", "Bearer " + std::string(64 * 1024, 'a'));
    const grpc::Status st = v1::ControlService::NewStub(c.channel())->Decide(ctx.get(), d, &r);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "refused before authentication";
  }
  {
    auto ctx = c.Context();
    ctx->AddMetadata("authorization", std::string("Bearer ") + kWriterToken);
    for (int i = 0; i < 400; ++i) ctx->AddMetadata("x-pad-" + std::to_string(i), std::string(100, 'p'));
    EXPECT_FALSE(v1::ControlService::NewStub(c.channel())->Decide(ctx.get(), d, &r).ok());
  }
  ExpectHealthy();
  // Just below the limit: an ordinary large header is fine.
  Client fresh = FreshClient("");
  auto ctx = fresh.Context();
  ctx->AddMetadata("authorization", std::string("Bearer ") + kWriterToken);
  ctx->AddMetadata("x-pad", std::string(4096, 'p'));
  const grpc::Status st = v1::ControlService::NewStub(fresh.channel())->Decide(ctx.get(), d, &r);
  EXPECT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
}

// Field 15 as a group opened `depth` times (unknown to every gac message):
// the parser would recurse once per level.
std::string NestedGroups(int depth) {
  std::string s;
  s.reserve(static_cast<std::size_t>(depth) * 2);
  for (int i = 0; i < depth; ++i) s += static_cast<char>((15 << 3) | 3);  // start group
  for (int i = 0; i < depth; ++i) s += static_cast<char>((15 << 3) | 4);  // end group
  return s;
}

// Field `field` as length-delimited bytes holding `payload`.
std::string LengthDelimited(int field, const std::string& payload) {
  std::string out(1, static_cast<char>((field << 3) | 2));
  std::size_t n = payload.size();
  do {
    out += static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
    n >>= 7;
  } while (n != 0);
  return out + payload;
}

// Field 2 nested `depth` times in itself: length-delimited, so an unknown
// field of this kind is skipped without being parsed (no recursion).
std::string NestedLengthDelimited(int depth) {
  std::string inner;
  for (int i = 0; i < depth; ++i) inner = LengthDelimited(2, inner);
  return inner;
}

TEST_F(Hostile, DeeplyNestedMessagesAreRefusedCleanly) {
  for (int depth : {101, 10000, 200000}) {
    SCOPED_TRACE(depth);
    const std::string groups = NestedGroups(depth);
    const grpc::Status decide = RawUnary(server_->address(), "/gac.v1.ControlService/Decide", groups);
    EXPECT_EQ(decide.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << decide.error_message();
    const grpc::Status ingest = RawIngest(server_->address(), groups);
    EXPECT_EQ(ingest.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ingest.error_message();
    // The typed handlers: gRPC's own parser refuses the request.
    EXPECT_FALSE(RawUnary(server_->address(), "/gac.v1.QueryService/ListRuns", groups).ok());
    EXPECT_FALSE(RawUnary(server_->address(), "/gac.v1.AdminService/SetRunConfig", groups).ok());
  }
  // Deep length-delimited nesting inside a record's unknown field is not
  // parsed, only skipped: the batch is refused for what it lacks, or stored.
  v1::IngestRequest batch = MakeBatch(1, {MakeStep("exp-nest", 0)});
  const std::string bytes = batch.SerializeAsString() + LengthDelimited(99, NestedLengthDelimited(5000));
  const grpc::Status st = RawIngest(server_->address(), bytes);
  EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  ExpectHealthy();
}

}  // namespace
}  // namespace gac::testing
