// What the benchmark programs share: timing, medians, the machine's CPU name,
// "--flag V" / "--flag=V" command-line values, and a plain HTTP GET.
// Header-only: the C++ standard library and POSIX sockets.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace gac::bench {

inline double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median of v (NaN for none).
inline double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 != 0 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The "model name" of /proc/cpuinfo, or "unknown".
inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

// Whether argv[*i] is `flag`, given as "--flag V" or "--flag=V". If so,
// *value is V (null when "--flag" is the last argument) and *i has moved past
// a separate V.
inline bool FlagValue(int argc, char** argv, int* i, const char* flag, const char** value) {
  const std::string a = argv[*i];
  const std::string prefix = std::string(flag) + "=";
  if (a.rfind(prefix, 0) == 0) {
    *value = argv[*i] + prefix.size();
    return true;
  }
  if (a != flag) return false;
  *value = *i + 1 < argc ? argv[*i + 1] : nullptr;
  ++*i;
  return true;
}

// A plain HTTP/1.0 GET of 127.0.0.1:`port` `path` (the server closes the
// connection after its answer). On a 200 answer fills *body and returns "";
// otherwise returns what went wrong.
inline std::string HttpGet(int port, const std::string& path, std::string* body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "socket: " + std::string(std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string error = "connect: " + std::string(std::strerror(errno));
    close(fd);
    return error;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "write failed";
  }
  std::string resp;
  char buf[1 << 16];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<std::size_t>(n));
  close(fd);
  const auto end = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || resp.find(" 200 ") > resp.find("\r\n") || end == std::string::npos) {
    return "unexpected answer: " + resp.substr(0, 200);
  }
  body->assign(resp, end + 4, std::string::npos);
  return "";
}

}  // namespace gac::bench
