#include "server/src/http/http_server.h"

#include <civetweb.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <prometheus/summary.h>
#include <prometheus/text_serializer.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "gac/proto/convert.h"
#include "server/src/http/web_assets.h"

namespace gac::server {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The page may load and contact nothing but gacd itself.
constexpr const char* kPagePolicy =
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

// gzip (RFC 1952) of `input` at zlib's `level`; empty when zlib fails.
std::string Gzip(std::string_view input, int level) {
  z_stream zs{};
  // 15 window bits + 16: a gzip header and trailer instead of zlib's.
  if (deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK) return {};
  std::string out(deflateBound(&zs, static_cast<uLong>(input.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
  zs.avail_in = static_cast<uInt>(input.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return rc == Z_STREAM_END ? out : std::string();
}

bool AcceptsGzip(mg_connection* conn) {
  const char* accept = mg_get_header(conn, "Accept-Encoding");
  return accept != nullptr && std::strstr(accept, "gzip") != nullptr;
}

// Writes a whole response (status line, headers, body; no keep-alive).
// Returns `status` for civetweb's log.
int Send(mg_connection* conn, int status, std::string_view content_type, std::string_view body,
         const Headers& headers, bool head_only = false) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + mg_get_response_code_text(conn, status) +
                     "\r\nConnection: close\r\nX-Content-Type-Options: nosniff\r\n";
  if (!content_type.empty()) head.append("Content-Type: ").append(content_type).append("\r\n");
  for (const auto& [name, value] : headers) head.append(name).append(": ").append(value).append("\r\n");
  head.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n\r\n");
  mg_write(conn, head.data(), head.size());
  if (!head_only && !body.empty()) mg_write(conn, body.data(), body.size());
  return status;
}

int SendError(mg_connection* conn, const base::Status& status) {
  return Send(conn, proto::ToHttpStatus(status.code()), "application/json", EncodeError(status), {});
}

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& o, Core* c)
      : options(o), core(c), api(c, o.api_enabled, o.api_disabled_reason) {}

  int Dispatch(mg_connection* conn);
  int ServeMetrics(mg_connection* conn, bool head_only);
  int ServeApi(mg_connection* conn, const mg_request_info& ri, std::string path);
  int ServeAsset(mg_connection* conn, const mg_request_info& ri, std::string_view path);

  const HttpServerOptions options;
  Core* const core;
  HttpApi api;
  mg_context* ctx = nullptr;

  // The scrape counters prometheus-cpp's exposer exported beside the
  // registry: kept so that /metrics stays what it was.
  std::shared_ptr<prometheus::Registry> exposer_registry = std::make_shared<prometheus::Registry>();
  prometheus::Counter* transferred_bytes = nullptr;
  prometheus::Counter* scrapes = nullptr;
  prometheus::Summary* latencies = nullptr;

  std::vector<std::string> gzipped;  // per WebAssets() entry; "" when not worth it
};

int HttpServer::Impl::Dispatch(mg_connection* conn) {
  const mg_request_info& ri = *mg_get_request_info(conn);
  // local_uri_raw is decoded but not normalised: "a/../b" is a valid run id.
  const char* raw = ri.local_uri_raw != nullptr ? ri.local_uri_raw : ri.local_uri;
  std::string path = raw != nullptr ? raw : "/";
  const std::string_view method = ri.request_method != nullptr ? ri.request_method : "";
  if (path == "/metrics") {
    if (method != "GET" && method != "HEAD") return Send(conn, 405, "text/plain", "GET only\n", {{"Allow", "GET, HEAD"}});
    return ServeMetrics(conn, method == "HEAD");
  }
  if (path.rfind("/api/", 0) == 0) return ServeApi(conn, ri, std::move(path));
  return ServeAsset(conn, ri, path);
}

int HttpServer::Impl::ServeMetrics(mg_connection* conn, bool head_only) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<prometheus::MetricFamily> families = exposer_registry->Collect();
  std::vector<prometheus::MetricFamily> gac = core->metrics().Collect();
  families.insert(families.end(), std::make_move_iterator(gac.begin()), std::make_move_iterator(gac.end()));
  std::string body = prometheus::TextSerializer().Serialize(families);
  Headers headers;
  if (AcceptsGzip(conn)) {
    if (std::string z = Gzip(body, Z_DEFAULT_COMPRESSION); !z.empty()) {
      body = std::move(z);
      headers.emplace_back("Content-Encoding", "gzip");
    }
  }
  const int status = Send(conn, 200, "text/plain; charset=utf-8", body, headers, head_only);
  latencies->Observe(static_cast<double>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count()));
  transferred_bytes->Increment(static_cast<double>(body.size()));
  scrapes->Increment();
  return status;
}

int HttpServer::Impl::ServeApi(mg_connection* conn, const mg_request_info& ri, std::string path) {
  HttpRequest req;
  req.method = ri.request_method != nullptr ? ri.request_method : "";
  req.path = std::move(path);
  req.query = ri.query_string != nullptr ? ri.query_string : "";
  if (const char* auth = mg_get_header(conn, "Authorization"); auth != nullptr) req.authorization = auth;
  // The body, up to the same limit as a gRPC message.
  const std::size_t max = options.max_body_bytes;
  const auto too_large = [&] {
    core->metrics().ObserveRpcError("http", base::StatusCodeName(base::StatusCode::kResourceExhausted));
    return SendError(conn, base::Status::ResourceExhausted("request body larger than " + std::to_string(max) +
                                                     " bytes (--max-message-bytes)"));
  };
  if (ri.content_length > 0 && static_cast<unsigned long long>(ri.content_length) > max) return too_large();
  char buf[16384];
  for (int n; (n = mg_read(conn, buf, sizeof buf)) > 0;) {
    req.body.append(buf, static_cast<std::size_t>(n));
    if (req.body.size() > max) return too_large();
  }
  const HttpResponse resp = api.Handle(req);
  return Send(conn, resp.status, resp.content_type, resp.body, resp.headers);
}

int HttpServer::Impl::ServeAsset(mg_connection* conn, const mg_request_info& ri, std::string_view path) {
  const std::string_view method = ri.request_method != nullptr ? ri.request_method : "";
  const WebAsset* asset = FindWebAsset(path);
  if (asset == nullptr) return Send(conn, 404, "text/plain; charset=utf-8", "not found\n", {});
  if (method != "GET" && method != "HEAD") {
    return Send(conn, 405, "text/plain; charset=utf-8", "GET only\n", {{"Allow", "GET, HEAD"}});
  }
  Headers headers = {{"ETag", asset->etag}, {"Cache-Control", "no-cache"}, {"Referrer-Policy", "no-referrer"}};
  if (std::string_view(asset->content_type).rfind("text/html", 0) == 0) {
    headers.emplace_back("Content-Security-Policy", kPagePolicy);
  }
  if (const char* match = mg_get_header(conn, "If-None-Match"); match != nullptr && asset->etag == std::string(match)) {
    return Send(conn, 304, "", "", headers, /*head_only=*/true);
  }
  std::size_t count = 0;
  const WebAsset* all = WebAssets(&count);
  const std::string& z = gzipped[static_cast<std::size_t>(asset - all)];
  std::string_view body(reinterpret_cast<const char*>(asset->data), asset->size);
  if (!z.empty() && AcceptsGzip(conn)) {
    body = z;
    headers.emplace_back("Content-Encoding", "gzip");
  }
  headers.emplace_back("Vary", "Accept-Encoding");
  return Send(conn, 200, asset->content_type, body, headers, method == "HEAD");
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

base::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, Core* core) {
  auto impl = std::make_unique<Impl>(options, core);
  Impl& s = *impl;
  auto& transferred = prometheus::BuildCounter()
                          .Name("exposer_transferred_bytes_total")
                          .Help("Transferred bytes to metrics services")
                          .Register(*s.exposer_registry);
  s.transferred_bytes = &transferred.Add({});
  auto& scrapes = prometheus::BuildCounter()
                      .Name("exposer_scrapes_total")
                      .Help("Number of times metrics were scraped")
                      .Register(*s.exposer_registry);
  s.scrapes = &scrapes.Add({});
  auto& latencies = prometheus::BuildSummary()
                        .Name("exposer_request_latencies")
                        .Help("Latencies of serving scrape requests, in microseconds")
                        .Register(*s.exposer_registry);
  s.latencies = &latencies.Add({}, prometheus::Summary::Quantiles{{0.5, 0.05}, {0.9, 0.01}, {0.99, 0.001}});

  // Compressed once here; a compressed copy is kept when it saves a tenth.
  std::size_t count = 0;
  const WebAsset* assets = WebAssets(&count);
  for (std::size_t i = 0; i < count; ++i) {
    std::string z = Gzip(std::string_view(reinterpret_cast<const char*>(assets[i].data), assets[i].size),
                         Z_BEST_COMPRESSION);
    s.gzipped.push_back(z.size() * 10 < assets[i].size * 9 ? std::move(z) : std::string());
  }

  mg_init_library(0);
  const std::string threads = std::to_string(options.threads);
  const char* mg_options[] = {"listening_ports", options.listen.c_str(),
                              "num_threads", threads.c_str(),
                              "request_timeout_ms", "30000",
                              nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = [](const mg_connection*, const char* message) {
    std::fprintf(stderr, "gacd: http: %s\n", message);
    return 1;
  };
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = impl.get();
  init.configuration_options = mg_options;
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error{};
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof error_text;
  s.ctx = mg_start2(&init, &error);
  if (s.ctx == nullptr) {
    return base::Status::Unavailable("cannot serve HTTP on '" + options.listen + "': " +
                               (error_text[0] != '\0' ? error_text : "civetweb failed to start"));
  }
  mg_set_request_handler(
      s.ctx, "/", [](mg_connection* conn, void* self) { return static_cast<Impl*>(self)->Dispatch(conn); },
      impl.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(s.ctx, 4, ports);
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(impl)));
  server->port_ = n > 0 ? ports[0].port : 0;
  return server;
}

void HttpServer::Stop() {
  if (impl_ == nullptr || impl_->ctx == nullptr) return;
  mg_stop(impl_->ctx);
  impl_->ctx = nullptr;
}

}  // namespace gac::server
