// The agent's spool recovery: whatever a crash, a full disk or a bad sector
// left in the spool directory. The input is: one byte L, then L bytes of the
// ACKED file (none when L is 0), two bytes (little-endian) N, N bytes of a
// first segment file, and the rest as a second segment file. Spool recovery
// must not crash or loop, and what it recovers must be usable: every entry
// it counts is handed back by ForEachUnacknowledged, a second recovery finds
// the same entries and no torn tail, and a new entry appended after
// recovery is read back after them.
#include <fstream>
#include <string>
#include <vector>

#include "gac/transport/spool.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void Write(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  static fuzz::ScratchDir* dir = new fuzz::ScratchDir();
  dir->Clear();
  fuzz::Input in(data, size);
  const std::string_view acked = in.Take(in.Byte());
  std::size_t n = in.Byte();
  n |= static_cast<std::size_t>(in.Byte()) << 8;
  const std::string_view first = in.Take(n);
  const std::string_view second = in.Rest();
  if (!acked.empty()) Write(dir->path() + "/ACKED", acked);
  Write(dir->path() + "/spool-00000000000000000001.log", first);
  if (!second.empty()) Write(dir->path() + "/spool-00000000000000000100.log", second);

  transport::SpoolOptions o;
  o.dir = dir->path();
  o.max_bytes = 1ull << 30;
  transport::SpoolRecovery rec;
  std::vector<std::pair<std::uint64_t, std::string>> entries;
  std::uint64_t last = 0;
  {
    auto spool = transport::Spool::Open(o, &rec);
    GAC_FUZZ_CHECK(spool.ok(), spool.status().ToString());
    base::Status st = (*spool)->ForEachUnacknowledged(
        [&](std::uint64_t seq, std::string&& payload) { entries.emplace_back(seq, std::move(payload)); });
    GAC_FUZZ_CHECK(st.ok(), st.ToString());
    GAC_FUZZ_CHECK(entries.size() == rec.entries, "recovery counts what it hands back");
    std::uint64_t bytes = 0;
    for (const auto& [seq, payload] : entries) {
      GAC_FUZZ_CHECK(seq > (*spool)->acknowledged_sequence(), "only unacknowledged entries");
      bytes += payload.size();
    }
    GAC_FUZZ_CHECK(bytes == rec.bytes, "recovered bytes");
    last = (*spool)->last_sequence();
  }
  // Recovery cut every torn tail: a second one finds the same entries and
  // drops only what it dropped before without cutting (checksum mismatches).
  transport::SpoolRecovery again;
  auto spool = transport::Spool::Open(o, &again);
  GAC_FUZZ_CHECK(spool.ok(), spool.status().ToString());
  GAC_FUZZ_CHECK(again.entries == rec.entries && again.bytes == rec.bytes, "a second recovery finds the same");
  GAC_FUZZ_CHECK(again.dropped_entries <= rec.dropped_entries, "nothing new is damaged");
  GAC_FUZZ_CHECK(again.detail.find("torn") == std::string::npos, "no torn entry is left behind: " + again.detail);
  // The spool still works: a new entry is read back last.
  if (last < UINT64_MAX) {
    base::Status st = (*spool)->Append(last + 1, "after recovery");
    GAC_FUZZ_CHECK(st.ok(), st.ToString());
    std::vector<std::uint64_t> seqs;
    std::string tail;
    st = (*spool)->ForEachUnacknowledged([&](std::uint64_t seq, std::string&& payload) {
      seqs.push_back(seq);
      tail = payload;
    });
    GAC_FUZZ_CHECK(st.ok(), st.ToString());
    GAC_FUZZ_CHECK(seqs.size() == entries.size() + 1 && seqs.back() == last + 1 && tail == "after recovery",
                   "the appended entry follows the recovered ones");
  }
  return 0;
}
