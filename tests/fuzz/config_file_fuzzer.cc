// gacd's configuration: the input is a --config file (read through a memfd),
// parsed with ParseFlags as gacd's main does. Properties: ParseFlags never
// crashes and refuses with INVALID_ARGUMENT; what it accepts passes
// ValidateConfig; duration strings parse to what they spell.
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "gac/server/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  const int fd = memfd_create("gacd-config", MFD_CLOEXEC);
  GAC_FUZZ_CHECK(fd >= 0, "memfd_create");
  std::size_t off = 0;
  while (off < size) {
    const ssize_t n = write(fd, data + off, size - off);
    GAC_FUZZ_CHECK(n > 0, "write");
    off += static_cast<std::size_t>(n);
  }
  const std::string config = "--config=/proc/self/fd/" + std::to_string(fd);
  const char* argv[] = {"gacd", config.c_str()};
  base::StatusOr<server::Flags> flags = server::ParseFlags(2, argv);
  close(fd);
  if (!flags.ok()) {
    GAC_FUZZ_CHECK(flags.status().IsInvalidArgument(), flags.status().ToString());
    return 0;
  }
  GAC_FUZZ_CHECK(!flags->help, "a config file cannot ask for help");
  base::Status st = server::ValidateConfig(flags->config);
  GAC_FUZZ_CHECK(st.ok(), st.ToString());

  // The first line as a duration too.
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string line = text.substr(0, text.find('\n'));
  if (auto d = server::ParseSeconds(line); d.ok()) {
    GAC_FUZZ_CHECK(d->count() >= 0, "durations are never negative: '" + line + "'");
  }
  return 0;
}
