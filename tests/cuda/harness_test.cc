// The host half of the CUDA harness, on the CPU (no GPU needed): the chunk
// tables, their change detection (what decides a re-upload), the inline
// limit, 64-bit chunk offsets, the work split of VisitChunk (the very
// function the kernels call) emulated for every thread of a block, and the
// statistics kernel's fp32 summation order emulated against fp64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "agent/src/cuda/chunk_table.h"
#include "agent/src/cuda/multi_tensor.h"

namespace gac::agent::cuda {
namespace {

using Change = ChunkTable::Change;

// Distinct fake addresses: the table never dereferences them.
void* Addr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

TensorRef Ref(std::uintptr_t g, std::uintptr_t p, std::int64_t n, ElemType gt = ElemType::kF32,
              std::int32_t segment = -1) {
  TensorRef r;
  r.g = g == 0 ? nullptr : Addr(g);
  r.p = p == 0 ? nullptr : Addr(p);
  r.n = n;
  r.gt = gt;
  r.segment = segment;
  return r;
}

Change MustUpdate(ChunkTable& table, const std::vector<TensorRef>& refs) {
  base::StatusOr<Change> c = table.Update(refs.data(), refs.size());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Change::kNone;
}

// Every element of every listed tensor, once, through the chunks in order:
// the tensors' chunks grouped by segment (none first, then 0, 1, ...), each
// tensor's chunks together, in list order within a segment.
void ExpectCovers(const ChunkTable& table, const std::vector<TensorRef>& refs) {
  std::vector<const TensorRef*> listed;
  for (const TensorRef& r : refs) {
    if (r.g != nullptr && r.n > 0) listed.push_back(&r);
  }
  ASSERT_EQ(table.tensors().size(), listed.size());
  std::int32_t max_segment = -1;
  for (std::size_t t = 0; t < listed.size(); ++t) {
    const TensorDesc& d = table.tensors()[t];
    EXPECT_EQ(d.g, listed[t]->g);
    EXPECT_EQ(d.p, listed[t]->p);
    EXPECT_EQ(d.n, listed[t]->n);
    EXPECT_EQ(d.gt, static_cast<std::uint8_t>(listed[t]->gt));
    EXPECT_EQ(d.segment, listed[t]->segment);
    max_segment = std::max(max_segment, d.segment);
  }
  std::size_t c = 0;
  for (std::int32_t segment = -1; segment <= max_segment; ++segment) {
    for (std::size_t t = 0; t < listed.size(); ++t) {
      const TensorDesc& d = table.tensors()[t];
      if (d.segment != segment) continue;
      std::int64_t next = 0;
      while (next < d.n) {
        ASSERT_LT(c, table.chunks().size());
        const ChunkDesc& chunk = table.chunks()[c++];
        EXPECT_EQ(chunk.tensor, static_cast<std::int32_t>(t));
        EXPECT_EQ(ChunkOffset(chunk), next);
        const int len = ChunkLength(d, chunk);
        EXPECT_GT(len, 0);
        EXPECT_LE(len, kChunkElements);
        if (next + kChunkElements < d.n) {
          EXPECT_EQ(len, kChunkElements);
        }
        next += len;
      }
      EXPECT_EQ(next, d.n);
    }
  }
  EXPECT_EQ(c, table.chunks().size());
}

TEST(ChunkTableTest, KernelArgumentsFitTheParameterLimit) {
  EXPECT_LE(sizeof(InlineTable) + sizeof(PassArgs), kKernelParamBytes);
  EXPECT_EQ(sizeof(TensorDesc), 32u);
  EXPECT_EQ(sizeof(ChunkDesc), 8u);
  EXPECT_EQ(sizeof(ChunkPartial), 16u);
  // Chunk offsets keep 16-byte alignment for every element type.
  EXPECT_EQ(kChunkElements * 2 % 16, 0);
  EXPECT_EQ(kBlockThreads % 32, 0);
}

TEST(ChunkTableTest, SkipsEmptyAndAbsentTensors) {
  ChunkTable table(2);
  const std::vector<TensorRef> refs = {
      Ref(0x1000, 0x9000, 0),                      // empty
      Ref(0x2000, 0xA000, 5, ElemType::kBF16, 1),  // one short chunk
      Ref(0, 0xB000, 70000),                       // no gradient this step
      Ref(0x4000, 0xC000, 3 * kChunkElements, ElemType::kF16, 0),
      Ref(0x5000, 0xD000, kChunkElements + 1),  // a 1-element last chunk
      Ref(0x6000, 0, 0),                        // empty, no snapshot: fine
  };
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
  ExpectCovers(table, refs);
  EXPECT_EQ(table.tensors().size(), 3u);
  EXPECT_EQ(table.num_chunks(), 1 + 3 + 2);
  // Segment order: tensor 2 (no segment) first, then tensor 1 (0), tensor 0 (1).
  EXPECT_EQ(ChunkLength(table.tensors()[2], table.chunks()[1]), 1);
  EXPECT_EQ(table.chunks()[5].tensor, 0);
  EXPECT_TRUE(table.fits_inline());
}

TEST(ChunkTableTest, EmptyListHasNoChunks) {
  ChunkTable table(0);
  EXPECT_EQ(MustUpdate(table, {}), Change::kLayout);
  EXPECT_EQ(table.num_chunks(), 0);
  EXPECT_EQ(MustUpdate(table, {}), Change::kNone);
  EXPECT_EQ(MustUpdate(table, {Ref(0x1000, 0x2000, 0)}), Change::kLayout);  // count changed
  EXPECT_EQ(table.num_chunks(), 0);
}

TEST(ChunkTableTest, ReportsWhatChanged) {
  ChunkTable table(1);
  std::vector<TensorRef> refs = {Ref(0x1000, 0x9000, 100), Ref(0x2000, 0xA000, 40000), Ref(0x3000, 0xB000, 0)};
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
  EXPECT_EQ(MustUpdate(table, refs), Change::kNone);

  refs[1].g = Addr(0x2800);  // a new gradient allocation, same size
  EXPECT_EQ(MustUpdate(table, refs), Change::kTensors);
  ExpectCovers(table, refs);
  EXPECT_EQ(MustUpdate(table, refs), Change::kNone);

  refs[0].gt = ElemType::kBF16;
  EXPECT_EQ(MustUpdate(table, refs), Change::kTensors);
  refs[0].segment = 0;  // the chunks move to the segment's range
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
  ExpectCovers(table, refs);
  refs[0].p = Addr(0x9800);
  EXPECT_EQ(MustUpdate(table, refs), Change::kTensors);

  refs[2].g = Addr(0x3800);  // an empty tensor moved: nothing the kernels read
  EXPECT_EQ(MustUpdate(table, refs), Change::kNone);

  refs[1].n = 40001;
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
  ExpectCovers(table, refs);

  refs[0].g = nullptr;  // gradient gone this step
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
  ExpectCovers(table, refs);
  refs[0].g = Addr(0x1000);  // and back
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
  ExpectCovers(table, refs);

  refs.push_back(Ref(0x4000, 0xC000, 0));
  EXPECT_EQ(MustUpdate(table, refs), Change::kLayout);
}

TEST(ChunkTableTest, RejectsBadInputAndKeepsThePreviousTables) {
  ChunkTable table(2);
  const std::vector<TensorRef> good = {Ref(0x1000, 0x9000, 100, ElemType::kF32, 1)};
  EXPECT_EQ(MustUpdate(table, good), Change::kLayout);
  const std::vector<std::vector<TensorRef>> bad = {
      {Ref(0x1000, 0x9000, -1)},
      {Ref(0x1000, 0, 100)},                          // no snapshot
      {Ref(0x1000, 0x9000, 100, ElemType::kF32, 2)},  // segment out of range
      {Ref(0x1000, 0x9000, 100, ElemType::kF32, -2)},
      {Ref(0x1000, 0x9000, 100, static_cast<ElemType>(7))},
  };
  for (const auto& refs : bad) {
    base::StatusOr<Change> c = table.Update(refs.data(), refs.size());
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), base::StatusCode::kInvalidArgument);
    EXPECT_EQ(MustUpdate(table, good), Change::kNone) << "the failed update changed the tables";
  }
}

TEST(ChunkTableTest, InlineLimit) {
  ChunkTable table(0);
  std::vector<TensorRef> refs;
  for (int i = 0; i < kInlineTensors; ++i) refs.push_back(Ref(0x1000 + 0x100 * i, 0x900000 + 0x100 * i, 10));
  MustUpdate(table, refs);
  EXPECT_TRUE(table.fits_inline());
  refs.push_back(Ref(0x80000, 0x980000, 10));
  MustUpdate(table, refs);
  EXPECT_FALSE(table.fits_inline()) << "one tensor too many";

  // Chunks: one tensor of exactly kInlineChunks chunks fits, one more element does not.
  refs = {Ref(0x1000, 0x2000, std::int64_t{kInlineChunks} * kChunkElements)};
  MustUpdate(table, refs);
  EXPECT_EQ(table.num_chunks(), kInlineChunks);
  EXPECT_TRUE(table.fits_inline());
  refs[0].n += 1;
  MustUpdate(table, refs);
  EXPECT_EQ(table.num_chunks(), kInlineChunks + 1);
  EXPECT_FALSE(table.fits_inline());

  InlineTable inline_table{};
  refs = {Ref(0x1000, 0x2000, 3), Ref(0x3000, 0x4000, 2 * kChunkElements)};
  MustUpdate(table, refs);
  table.FillInline(&inline_table);
  EXPECT_EQ(inline_table.tensors[1].g, Addr(0x3000));
  EXPECT_EQ(inline_table.chunks[2].tensor, 1);
  EXPECT_EQ(inline_table.chunks[2].chunk, 1);
  EXPECT_EQ(table.tensor_bytes(), 2 * sizeof(TensorDesc));
  EXPECT_EQ(table.chunk_bytes(), 3 * sizeof(ChunkDesc));
}

TEST(ChunkTableTest, TensorsBeyond32BitIndexing) {
  ChunkTable table(0);
  const std::int64_t n = (std::int64_t{1} << 31) + 4099;
  const std::vector<TensorRef> refs = {Ref(0x1000, 0x2000, 17), Ref(0x10000, 0x20000, n, ElemType::kBF16)};
  MustUpdate(table, refs);
  ExpectCovers(table, refs);
  const ChunkDesc& last = table.chunks().back();
  EXPECT_EQ(ChunkOffset(last), (std::int64_t{1} << 31));
  EXPECT_EQ(ChunkLength(table.tensors()[1], last), 4099);
  EXPECT_EQ(table.num_chunks(), 1 + (n + kChunkElements - 1) / kChunkElements);
}

TEST(ChunkTableTest, TooManyChunksIsOutOfRange) {
  ChunkTable table(0);
  const std::vector<TensorRef> refs = {Ref(0x1000, 0x2000, std::int64_t{1} << 46)};
  base::StatusOr<Change> c = table.Update(refs.data(), refs.size());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), base::StatusCode::kOutOfRange);
}

TEST(ChunkTableTest, RandomListsAreCoveredExactly) {
  std::mt19937_64 rng(42);
  ChunkTable table(4);
  for (int round = 0; round < 50; ++round) {
    std::vector<TensorRef> refs;
    const int count = static_cast<int>(rng() % 900);
    for (int i = 0; i < count; ++i) {
      const std::int64_t n = rng() % 4 == 0 ? 0 : static_cast<std::int64_t>(rng() % (3 * kChunkElements + 5));
      const bool present = rng() % 8 != 0;
      refs.push_back(Ref(present ? 0x1000 + 0x10 * i : 0, 0x800000 + 0x10 * i, n, static_cast<ElemType>(rng() % 3),
                         static_cast<std::int32_t>(rng() % 5) - 1));
    }
    MustUpdate(table, refs);
    ExpectCovers(table, refs);
  }
}

// Emulates one block of VisitChunk: every thread, in any order (the threads
// are independent), recording which elements each hands out.
struct Recorder {
  std::vector<int>* hits;
  int head = 0;
  int vector_groups = 0;
  int len = 0;
  void Vector(int i) {
    EXPECT_EQ((i - head) % kVecElements, 0);
    EXPECT_LE(i + kVecElements, len);
    for (int j = 0; j < kVecElements; ++j) ++(*hits)[static_cast<std::size_t>(i + j)];
    ++vector_groups;
  }
  void Scalar(int i, int lane) {
    EXPECT_GE(lane, 0);
    EXPECT_LT(lane, kVecElements);
    ++(*hits)[static_cast<std::size_t>(i)];
  }
};

TEST(VisitChunkTest, EveryElementOnceForAnyLength) {
  std::vector<int> lengths = {0, 1, 7, 8, 9, 255, 256, 257, 2047, 2048, 2049, 2055, 4096, 10000, 16383, kChunkElements};
  for (int len = 0; len < 600; ++len) lengths.push_back(len);
  for (int len : lengths) {
    // -1: scalar only; 0: aligned; 1-7: a scalar prologue first.
    for (int head = -1; head < kVecElements; ++head) {
      const int h = std::min(head, len);
      SCOPED_TRACE("len " + std::to_string(len) + " head " + std::to_string(h));
      std::vector<int> hits(static_cast<std::size_t>(len), 0);
      int groups = 0;
      for (int tid = kBlockThreads - 1; tid >= 0; --tid) {
        Recorder r{&hits, h, 0, len};
        VisitChunk(tid, kBlockThreads, len, h, r);
        groups += r.vector_groups;
      }
      for (int i = 0; i < len; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)], 1) << "element " << i;
      EXPECT_EQ(groups, h >= 0 ? (len - h) / kVecElements : 0);
    }
  }
}

// The prologue puts both arrays on a 16-byte boundary, or there is none.
TEST(VisitChunkTest, VectorHeadAlignsBothArrays) {
  for (int g_size : {2, 4}) {
    for (int p_size : {2, 4}) {
      for (std::uintptr_t g = 0x1000; g < 0x1010; g += static_cast<std::uintptr_t>(g_size)) {
        for (std::uintptr_t p = 0x9000; p < 0x9010; p += static_cast<std::uintptr_t>(p_size)) {
          const int head = VectorHead(g, g_size, p, p_size, kChunkElements);
          SCOPED_TRACE("g " + std::to_string(g % 16) + "/" + std::to_string(g_size) + ", p " + std::to_string(p % 16) +
                       "/" + std::to_string(p_size) + ": head " + std::to_string(head));
          int fewest = -1;
          for (int h = kVecElements - 1; h >= 0; --h) {
            if ((g + static_cast<std::uintptr_t>(h * g_size)) % 16 == 0 &&
                (p + static_cast<std::uintptr_t>(h * p_size)) % 16 == 0) {
              fewest = h;
            }
          }
          const bool exists = fewest >= 0;
          if (!exists) {
            EXPECT_EQ(head, -1);
            continue;
          }
          EXPECT_EQ(head, fewest);
        }
      }
    }
  }
  EXPECT_EQ(VectorHead(0x1004, 4, 0x2004, 4, 2), 2) << "at most the chunk's length";
  EXPECT_EQ(VectorHead(0x1001, 2, 0x2001, 2, 100), -1) << "an element straddling the boundary";
}

// Warp accesses stay contiguous: the k-th vector group of thread t is t
// groups after thread 0's, the k-th single element t elements after.
struct AccessRecorder {
  std::vector<int> vectors, scalars;
  void Vector(int i) { vectors.push_back(i); }
  void Scalar(int i, int) { scalars.push_back(i); }
};

TEST(VisitChunkTest, WarpAccessesAreContiguous) {
  for (int len : {3 * kBlockThreads * kVecElements + 37, 1000, kChunkElements, 5}) {
    for (int head : {-1, 0}) {
      std::vector<AccessRecorder> threads(32);
      for (int tid = 0; tid < 32; ++tid) {
        VisitChunk(tid, kBlockThreads, len, head, threads[static_cast<std::size_t>(tid)]);
      }
      const AccessRecorder& first = threads[0];
      for (int tid = 1; tid < 32; ++tid) {
        const AccessRecorder& r = threads[static_cast<std::size_t>(tid)];
        ASSERT_LE(r.vectors.size(), first.vectors.size());
        ASSERT_LE(r.scalars.size(), first.scalars.size());
        for (std::size_t k = 0; k < r.vectors.size(); ++k)
          EXPECT_EQ(r.vectors[k], first.vectors[k] + kVecElements * tid);
        for (std::size_t k = 0; k < r.scalars.size(); ++k) EXPECT_EQ(r.scalars[k], first.scalars[k] + tid);
      }
    }
  }
}

// The whole harness on the CPU: a list through the chunk table, each chunk
// through VisitChunk for every thread of its block, elements addressed as
// the kernels do (tensor base + 64-bit chunk offset + in-chunk index).
TEST(HarnessEmulationTest, ListCoverageThroughTablesAndBlocks) {
  std::mt19937_64 rng(7);
  std::vector<std::int64_t> sizes = {
      0, 1, 8, kChunkElements - 1, kChunkElements, kChunkElements + 1, 5, 2 * kChunkElements + 9};
  for (int i = 0; i < 60; ++i) sizes.push_back(static_cast<std::int64_t>(rng() % 50000));
  std::vector<std::vector<int>> hits;
  std::vector<TensorRef> refs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    hits.emplace_back(static_cast<std::size_t>(sizes[i]), 0);
    // The index stands in for the address; the element offset is added to it.
    refs.push_back(Ref(i + 1, 0x100 + i, sizes[i]));
  }
  ChunkTable table(0);
  MustUpdate(table, refs);
  EXPECT_FALSE(table.fits_inline());
  struct ElementRecorder {
    std::vector<int>* hits;
    std::int64_t offset;
    void Vector(int i) {
      for (int j = 0; j < kVecElements; ++j) ++(*hits)[static_cast<std::size_t>(offset + i + j)];
    }
    void Scalar(int i, int) { ++(*hits)[static_cast<std::size_t>(offset + i)]; }
  };
  for (std::size_t block = 0; block < table.chunks().size(); ++block) {
    const ChunkDesc c = table.chunks()[block];
    const TensorDesc t = table.tensors()[static_cast<std::size_t>(c.tensor)];
    const std::size_t which = reinterpret_cast<std::uintptr_t>(t.g) - 1;
    const int head = static_cast<int>(block % 4) - 1;  // scalar, aligned, two prologues
    for (int tid = 0; tid < kBlockThreads; ++tid) {
      ElementRecorder r{&hits[which], ChunkOffset(c)};
      VisitChunk(tid, kBlockThreads, ChunkLength(t, c), std::min(head, ChunkLength(t, c)), r);
    }
  }
  for (std::size_t i = 0; i < hits.size(); ++i) {
    for (std::size_t e = 0; e < hits[i].size(); ++e) {
      ASSERT_EQ(hits[i][e], 1) << "tensor " << i << " element " << e;
    }
  }
}

TEST(ResultLayoutTest, SegmentsThenNonFiniteCount) {
  EXPECT_EQ(ResultSize(0), 4u);
  EXPECT_EQ(ResultNonFinite(0), 3u);
  EXPECT_EQ(ResultSegment(0), 3u);
  EXPECT_EQ(ResultSegment(2), 9u);
  EXPECT_EQ(ResultNonFinite(3), 12u);
  EXPECT_EQ(ResultSize(3), 13u);
}

// The statistics kernel's arithmetic, step for step, on the CPU: per thread
// 4 fp32 lanes fed by fused multiply-adds in VisitChunk's order, lanes summed
// (0 + 2) + (1 + 3), a butterfly over each warp's 32 threads, warp 0's
// butterfly over the 8 warp sums, and the chunks summed in fp64. The error
// against fp64 must stay within the 1e-6 the GPU tests assert.
struct EmulatedLanes {
  const float* g;
  const float* p;
  float dot[4] = {}, gg[4] = {}, pp[4] = {};
  void Add(float x, float y, int lane) {
    gg[lane] = std::fma(x, x, gg[lane]);
    dot[lane] = std::fma(x, y, dot[lane]);
    pp[lane] = std::fma(y, y, pp[lane]);
  }
  void Vector(int i) {
    for (int j = 0; j < kVecElements; ++j) Add(g[i + j], p[i + j], j % 4);
  }
  void Scalar(int i, int lane) { Add(g[i], p[i], lane % 4); }
};

float Butterfly(std::vector<float> v) {  // lane 0's result of the xor-shuffle tree
  for (std::size_t o = 16; o > 0; o >>= 1) {
    std::vector<float> next(32);
    for (std::size_t l = 0; l < 32; ++l) next[l] = v[l] + v[l ^ o];
    v = next;
  }
  return v[0];
}

void EmulateChunk(const float* g, const float* p, int len, bool vector, double* out) {
  std::vector<float> thread_sums[3];
  for (int tid = 0; tid < kBlockThreads; ++tid) {
    EmulatedLanes v{g, p};
    VisitChunk(tid, kBlockThreads, len, vector ? 0 : -1, v);
    const float* lanes[3] = {v.dot, v.gg, v.pp};
    for (int k = 0; k < 3; ++k) thread_sums[k].push_back((lanes[k][0] + lanes[k][2]) + (lanes[k][1] + lanes[k][3]));
  }
  for (int k = 0; k < 3; ++k) {
    std::vector<float> warp_sums(32, 0.0f);
    for (int w = 0; w < kBlockThreads / 32; ++w) {
      warp_sums[static_cast<std::size_t>(w)] =
          Butterfly(std::vector<float>(thread_sums[k].begin() + 32 * w, thread_sums[k].begin() + 32 * (w + 1)));
    }
    out[k] += static_cast<double>(Butterfly(warp_sums));
  }
}

float ToBf16(float f) {  // round to nearest even
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  b = ((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16) << 16;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(HarnessEmulationTest, Fp32PartialsStayWithinTheTestTolerance) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  double worst = 0.0;
  for (std::int64_t n : {1, 100, 2049, 16384, 50000, 1 << 20}) {
    for (bool bf16 : {false, true}) {
      std::vector<float> g(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n));
      double want[3] = {0.0, 0.0, 0.0};
      for (std::size_t i = 0; i < g.size(); ++i) {
        const double base = normal(rng) + 0.25;
        g[i] = static_cast<float>(base + 0.5 * normal(rng));
        p[i] = static_cast<float>(2.0 * base);
        if (bf16) {
          g[i] = ToBf16(g[i]);
          p[i] = ToBf16(p[i]);
        }
        want[0] += static_cast<double>(g[i]) * p[i];
        want[1] += static_cast<double>(g[i]) * g[i];
        want[2] += static_cast<double>(p[i]) * p[i];
      }
      for (bool vector : {true, false}) {
        double got[3] = {0.0, 0.0, 0.0};
        for (std::int64_t off = 0; off < n; off += kChunkElements) {
          const int len = static_cast<int>(std::min<std::int64_t>(kChunkElements, n - off));
          EmulateChunk(g.data() + off, p.data() + off, len, vector, got);
        }
        const double dot_err = std::fabs(got[0] - want[0]) / std::sqrt(want[1] * want[2]);
        const double gg_err = std::fabs(got[1] - want[1]) / want[1];
        const double pp_err = std::fabs(got[2] - want[2]) / want[2];
        EXPECT_LE(dot_err, 1e-6) << "n " << n;
        EXPECT_LE(gg_err, 1e-6) << "n " << n;
        EXPECT_LE(pp_err, 1e-6) << "n " << n;
        worst = std::max({worst, dot_err, gg_err, pp_err});
      }
    }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("worst relative error of the emulated fp32 partials: %.2e\n", worst);
}

}  // namespace
}  // namespace gac::agent::cuda
