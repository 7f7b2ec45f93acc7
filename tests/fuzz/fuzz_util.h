// Shared by the libFuzzer targets of tests/fuzz: a property check that
// aborts (so libFuzzer keeps the input as a crash), the input split into
// parts, and a scratch directory on tmpfs.
#ifndef GAC_TESTS_FUZZ_FUZZ_UTIL_H_
#define GAC_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace gac::fuzz {

// A broken property is a finding: print it and abort, so libFuzzer saves the
// input and the regression test that replays it fails.
#define GAC_FUZZ_CHECK(cond, what)                                                     \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property broken: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                         \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// Consumes the input front to back: a selector byte, fixed-size numbers,
// and the rest.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  std::uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return static_cast<std::uint8_t>(*data_++);
  }
  // Up to `n` bytes (fewer at the end).
  std::string_view Take(std::size_t n) {
    n = n < size_ ? n : size_;
    std::string_view out(data_, n);
    data_ += n;
    size_ -= n;
    return out;
  }
  std::string_view Rest() { return Take(size_); }
  // The rest as a Protobuf message; false when it is not one.
  template <typename Message>
  bool ParseRest(Message* message) {
    const std::string_view rest = Rest();
    return message->ParseFromArray(rest.data(), static_cast<int>(rest.size()));
  }
  std::size_t size() const { return size_; }

 private:
  const char* data_;
  std::size_t size_;
};

// A directory under /dev/shm (or $TMPDIR) made once per process, emptied by
// Clear(); the fuzzers that need files write them here.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    std::string tmpl = std::string(base) + "/gac-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  void Clear() const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path_, ec)) std::filesystem::remove_all(e.path(), ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gac::fuzz

#endif  // GAC_TESTS_FUZZ_FUZZ_UTIL_H_
