// The CUDA passes (MultiTensorPasses) on a GPU against an fp64 CPU
// reference: every gradient/snapshot type pair, awkward and misaligned
// lengths, zero-size and absent tensors, more than 770 tensors (device
// table), lists around the inline-table limits, a tensor of more than 2^31
// elements, non-finite input, segments, the launch count per step, the
// chunk-table cache, several streams and NCCL. Every case is skipped when
// there is no usable GPU (no device, or no driver at all). Built against the
// host emulation of CUDA (tests/cuda/emu, GAC_CUDA_EMU), every case runs in
// every test run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#ifdef GAC_TEST_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/src/cuda/cuda_passes.h"
#include "tests/cuda/host_codecs.h"
#ifdef GAC_CUDA_EMU
#include "gac_cuda_emu/control.h"
#endif

namespace gac::agent::cuda {
namespace {

bool HaveGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
    }
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::uint8_t* get() const { return ptr_; }

 private:
  std::uint8_t* ptr_ = nullptr;
};

struct Spec {
  std::int64_t n = 0;
  ElemType gt = ElemType::kF32;
  int g_shift = 0;  // elements past a 256-byte boundary (misaligned: scalar path)
  int p_shift = 0;
  std::int32_t segment = -1;
  bool present = true;  // false: no gradient this step (g == null)
};

struct Sums {
  double dot = 0.0, gg = 0.0, pp = 0.0;
};

// Host gradients and snapshots of a list of tensors, packed in two arenas,
// mirrored on the device. g and p are correlated with a non-zero mean, so
// that dot is far from zero.
class Workload {
 public:
  Workload(std::vector<Spec> specs, ElemType pt, std::uint64_t seed) : specs_(std::move(specs)), pt_(pt) {
    std::size_t g_bytes = 0, p_bytes = 0;
    for (const Spec& s : specs_) {
      g_off_.push_back(g_bytes + static_cast<std::size_t>(s.g_shift) * Size(s.gt));
      g_bytes = RoundUp(g_off_.back() + static_cast<std::size_t>(s.n) * Size(s.gt));
      p_off_.push_back(p_bytes + static_cast<std::size_t>(s.p_shift) * Size(pt));
      p_bytes = RoundUp(p_off_.back() + static_cast<std::size_t>(s.n) * Size(pt));
    }
    g_.assign(g_bytes, 0);
    p_.assign(p_bytes, 0);
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal;
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      for (std::int64_t i = 0; i < specs_[t].n; ++i) {
        const double base = normal(rng) + 0.25;
        Store(specs_[t].gt, g_.data() + g_off_[t], i, static_cast<float>(base + 0.5 * normal(rng)));
        Store(pt_, p_.data() + p_off_[t], i, static_cast<float>(2.0 * base));
      }
    }
  }

  // Copies the host arenas to (fresh) device arenas.
  ::testing::AssertionResult Upload() {
    g_dev_ = std::make_unique<DeviceBuffer>(g_.size());
    p_dev_ = std::make_unique<DeviceBuffer>(p_.size());
    if (g_dev_->get() == nullptr || p_dev_->get() == nullptr) return ::testing::AssertionFailure() << "cudaMalloc";
    if (cudaMemcpy(g_dev_->get(), g_.data(), g_.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(p_dev_->get(), p_.data(), p_.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      return ::testing::AssertionFailure() << "cudaMemcpy";
    }
    return ::testing::AssertionSuccess();
  }
  std::vector<TensorRef> Refs() const {
    std::vector<TensorRef> refs;
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      TensorRef r;
      r.g = specs_[t].present ? g_dev_->get() + g_off_[t] : nullptr;
      r.p = p_dev_->get() + p_off_[t];
      r.n = specs_[t].n;
      r.gt = specs_[t].gt;
      r.segment = specs_[t].segment;
      refs.push_back(r);
    }
    return refs;
  }
  // The device arenas, after the passes.
  ::testing::AssertionResult Download(std::vector<std::uint8_t>* g, std::vector<std::uint8_t>* p) const {
    g->assign(g_.size(), 0);
    p->assign(p_.size(), 0);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(g->data(), g_dev_->get(), g_.size(), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(p->data(), p_dev_->get(), p_.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      return ::testing::AssertionFailure() << "download";
    }
    return ::testing::AssertionSuccess();
  }

  // fp64 statistics of the host data: all tensors (segment -1 = any) or one
  // segment's.
  Sums Reference(bool with_p, int segment = -2) const {
    Sums s;
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      if (!specs_[t].present || (segment != -2 && specs_[t].segment != segment)) continue;
      for (std::int64_t i = 0; i < specs_[t].n; ++i) {
        const double x = G(g_, t, i);
        s.gg += x * x;
        if (with_p) {
          const double y = P(p_, t, i);
          s.dot += x * y;
          s.pp += y * y;
        }
      }
    }
    return s;
  }

  float G(const std::vector<std::uint8_t>& arena, std::size_t t, std::int64_t i) const {
    return Load(specs_[t].gt, arena.data() + g_off_[t], i);
  }
  float P(const std::vector<std::uint8_t>& arena, std::size_t t, std::int64_t i) const {
    return Load(pt_, arena.data() + p_off_[t], i);
  }
  std::uint32_t GBits(const std::vector<std::uint8_t>& arena, std::size_t t, std::int64_t i) const {
    return Bits(specs_[t].gt, arena.data() + g_off_[t], i);
  }
  std::uint32_t PBits(const std::vector<std::uint8_t>& arena, std::size_t t, std::int64_t i) const {
    return Bits(pt_, arena.data() + p_off_[t], i);
  }
  void SetG(std::size_t t, std::int64_t i, float v) { Store(specs_[t].gt, g_.data() + g_off_[t], i, v); }
  void SetP(std::size_t t, std::int64_t i, float v) { Store(pt_, p_.data() + p_off_[t], i, v); }

  const std::vector<Spec>& specs() const { return specs_; }
  const std::vector<std::uint8_t>& host_g() const { return g_; }
  const std::vector<std::uint8_t>& host_p() const { return p_; }
  ElemType pt() const { return pt_; }

 private:
  static std::size_t RoundUp(std::size_t b) { return (b + 255) / 256 * 256; }

  std::vector<Spec> specs_;
  ElemType pt_;
  std::vector<std::size_t> g_off_, p_off_;  // bytes
  std::vector<std::uint8_t> g_, p_;
  std::unique_ptr<DeviceBuffer> g_dev_, p_dev_;
};

double RelErr(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-300); }

void ExpectStats(double dot, double gg, double pp, const Sums& want, bool with_p) {
  if (want.gg == 0.0) {
    EXPECT_EQ(gg, 0.0);
  } else {
    EXPECT_LE(RelErr(gg, want.gg), 1e-6) << "gg " << gg << " want " << want.gg;
  }
  if (!with_p) {
    EXPECT_EQ(dot, 0.0);
    EXPECT_EQ(pp, 0.0);
    return;
  }
  if (want.pp == 0.0) {
    EXPECT_EQ(pp, 0.0);
    EXPECT_EQ(dot, 0.0);
    return;
  }
  EXPECT_LE(RelErr(pp, want.pp), 1e-6) << "pp " << pp << " want " << want.pp;
  // Relative to the norms: a dot near zero is only accurate that far.
  EXPECT_LE(std::fabs(dot - want.dot) / std::sqrt(want.gg * want.pp), 1e-6) << "dot " << dot << " want " << want.dot;
}

class CudaPassesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device: the GPU cases are skipped";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::unique_ptr<MultiTensorPasses> MakePasses(ElemType pt, int segments = 0) {
    base::StatusOr<std::unique_ptr<MultiTensorPasses>> p = MultiTensorPasses::Create(pt, segments);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // SetTensors + EnqueueStatistics + ReadResult.
  base::StatusOr<StatsView> Stats(MultiTensorPasses& passes, const std::vector<TensorRef>& refs, bool with_p,
                            cudaStream_t stream = nullptr) {
    if (stream == nullptr) stream = stream_;
    base::Status st = passes.SetTensors(refs.data(), refs.size(), stream);
    if (st.ok()) st = passes.EnqueueStatistics(with_p, stream);
    if (!st.ok()) return st;
    return passes.ReadResult(stream);
  }

  // Statistics (with and without p, per segment) of w against its reference.
  void CheckStats(MultiTensorPasses& passes, const Workload& w, int segments) {
    const std::vector<TensorRef> refs = w.Refs();
    for (bool with_p : {true, false}) {
      SCOPED_TRACE(with_p ? "with p" : "g only");
      base::StatusOr<StatsView> got = Stats(passes, refs, with_p);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectStats(got->dot(), got->gg(), got->pp(), w.Reference(with_p), with_p);
      EXPECT_EQ(got->non_finite_chunks(), 0);
      for (int s = 0; s < segments; ++s) {
        SCOPED_TRACE("segment " + std::to_string(s));
        ExpectStats(got->segment_dot(s), got->segment_gg(s), got->segment_pp(s), w.Reference(with_p, s), with_p);
      }
    }
  }

  // Snapshot only: p == g converted, bit for bit; g untouched; absent tensors keep p.
  void CheckSnapshot(MultiTensorPasses& passes, Workload& w) {
    ASSERT_TRUE(w.Upload());
    const std::vector<TensorRef> refs = w.Refs();
    ASSERT_TRUE(passes.SetTensors(refs.data(), refs.size(), stream_).ok());
    ASSERT_TRUE(passes.EnqueueSnapshot(stream_).ok());
    std::vector<std::uint8_t> g, p;
    ASSERT_TRUE(w.Download(&g, &p));
    EXPECT_EQ(g, w.host_g());
    for (std::size_t t = 0; t < w.specs().size(); ++t) {
      for (std::int64_t i = 0; i < w.specs()[t].n; ++i) {
        const std::uint32_t want =
            w.specs()[t].present ? Encode(w.pt(), w.G(w.host_g(), t, i)) : w.PBits(w.host_p(), t, i);
        ASSERT_EQ(w.PBits(p, t, i), want) << "tensor " << t << " element " << i;
      }
    }
  }

  // Projection: g' = g - coeff * p within one rounding of the gradient's type
  // (relative to the tensor's largest value); p = the old g, or exactly the
  // stored new g converted.
  void CheckProject(MultiTensorPasses& passes, Workload& w, bool snapshot_projected) {
    SCOPED_TRACE(snapshot_projected ? "applied-update snapshot" : "raw snapshot");
    ASSERT_TRUE(w.Upload());
    const float coeff = 0.37f;
    const std::vector<TensorRef> refs = w.Refs();
    ASSERT_TRUE(passes.SetTensors(refs.data(), refs.size(), stream_).ok());
    ASSERT_TRUE(passes.EnqueueProjectSnapshot(coeff, snapshot_projected, stream_).ok());
    std::vector<std::uint8_t> g, p;
    ASSERT_TRUE(w.Download(&g, &p));
    for (std::size_t t = 0; t < w.specs().size(); ++t) {
      const Spec& s = w.specs()[t];
      if (!s.present) {
        for (std::int64_t i = 0; i < s.n; ++i) {
          ASSERT_EQ(w.GBits(g, t, i), w.GBits(w.host_g(), t, i));
          ASSERT_EQ(w.PBits(p, t, i), w.PBits(w.host_p(), t, i));
        }
        continue;
      }
      for (std::int64_t i = 0; i < s.n; ++i) {
        const float x = static_cast<float>(w.G(w.host_g(), t, i));
        const float y = static_cast<float>(w.P(w.host_p(), t, i));
        // The kernel's arithmetic exactly: one fused multiply-add in fp32,
        // then a round-to-nearest-even store as the gradient's type.
        ASSERT_EQ(w.GBits(g, t, i), Encode(s.gt, std::fmaf(-coeff, y, x))) << "tensor " << t << " element " << i;
        const std::uint32_t want_p =
            snapshot_projected ? Encode(w.pt(), w.G(g, t, i)) : Encode(w.pt(), static_cast<float>(x));
        ASSERT_EQ(w.PBits(p, t, i), want_p) << "tensor " << t << " element " << i;
      }
    }
  }

  cudaStream_t stream_ = nullptr;
};

std::vector<Spec> AwkwardSpecs(ElemType gt) {
  std::vector<Spec> specs;
  int k = 0;
  for (std::int64_t n : {0, 1, 7, 8, 9, 100, 255, 2048, 2049, 16383, 16384, 16385, 40000, 3 * 16384 + 5}) {
    Spec s;
    s.n = n;
    s.gt = gt;
    s.segment = k++ % 3 - 1;  // -1, 0, 1
    specs.push_back(s);
  }
  // Misaligned starts take the scalar path; a chunk boundary lies inside.
  specs.push_back(Spec{1000, gt, 1, 0, 0, true});
  specs.push_back(Spec{20000, gt, 0, 1, 1, true});
  specs.push_back(Spec{33000, gt, 3, 3, -1, true});
  specs.push_back(Spec{5000, gt, 0, 0, 0, false});  // absent gradient
  return specs;
}

class CudaTypesTest : public CudaPassesTest, public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(CudaTypesTest, EveryTypePairAgainstFp64Reference) {
  const ElemType gt = static_cast<ElemType>(std::get<0>(GetParam()));
  const ElemType pt = static_cast<ElemType>(std::get<1>(GetParam()));
  SCOPED_TRACE(std::string("g ") + Name(gt) + ", p " + Name(pt));
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(pt, 2);
  ASSERT_NE(passes, nullptr);
  Workload w(AwkwardSpecs(gt), pt, 1234 + static_cast<std::uint64_t>(gt) * 7 + static_cast<std::uint64_t>(pt));
  ASSERT_TRUE(w.Upload());
  CheckStats(*passes, w, 2);
  CheckSnapshot(*passes, w);
  CheckProject(*passes, w, false);
  CheckProject(*passes, w, true);
}

INSTANTIATE_TEST_SUITE_P(AllPairs, CudaTypesTest,
                         ::testing::Combine(::testing::Values(0, 1, 2),  // g: f32, bf16, f16
                                            ::testing::Values(0, 1)));   // p: f32, bf16

TEST(MultiTensorPassesOptionsTest, RejectsBadOptions) {
  // Checked before any CUDA call: runs on every machine.
  EXPECT_EQ(MultiTensorPasses::Create(ElemType::kF16).status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(MultiTensorPasses::Create(ElemType::kF32, -1).status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(MultiTensorPasses::Create(ElemType::kF32, (1 << 16) + 1).status().code(), base::StatusCode::kInvalidArgument);
}

TEST(MultiTensorPassesOptionsTest, WithoutGpuCreationFailsCleanly) {
#ifdef GAC_CUDA_EMU
  gac_cuda_emu::SetDriver(gac_cuda_emu::Driver::kMissing);  // a machine without the driver
#else
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present";
#endif
  base::StatusOr<std::unique_ptr<MultiTensorPasses>> passes = MultiTensorPasses::Create(ElemType::kF32);
  ASSERT_FALSE(passes.ok());
  EXPECT_EQ(passes.status().code(), base::StatusCode::kUnavailable) << passes.status().ToString();
  int driver = -1;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
    EXPECT_NE(passes.status().message().find("no NVIDIA driver found"), std::string::npos) << passes.status().ToString();
  }
#ifdef GAC_CUDA_EMU
  gac_cuda_emu::Reset();
#endif
}

TEST_F(CudaPassesTest, ZeroSizeAndAbsentTensors) {
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kF32, 1);
  ASSERT_NE(passes, nullptr);
  Workload w({Spec{0, ElemType::kF32}, Spec{1, ElemType::kBF16, 0, 0, 0, true}, Spec{0, ElemType::kF16},
              Spec{3000, ElemType::kF32, 0, 0, 0, false}, Spec{17, ElemType::kF16}, Spec{0, ElemType::kBF16}},
             ElemType::kF32, 5);
  ASSERT_TRUE(w.Upload());
  CheckStats(*passes, w, 1);
  CheckSnapshot(*passes, w);
  CheckProject(*passes, w, true);

  // Nothing to read at all: zero sums; the reduction is the only launch and
  // the apply passes launch nothing.
  Workload empty({Spec{0, ElemType::kF32}, Spec{4096, ElemType::kF32, 0, 0, 0, false}}, ElemType::kF32, 6);
  ASSERT_TRUE(empty.Upload());
  const std::uint64_t before = passes->launches();
  base::StatusOr<StatsView> got = Stats(*passes, empty.Refs(), true);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->dot(), 0.0);
  EXPECT_EQ(got->gg(), 0.0);
  EXPECT_EQ(got->pp(), 0.0);
  EXPECT_EQ(got->segment_gg(0), 0.0);
  EXPECT_EQ(passes->launches() - before, 1u);
  ASSERT_TRUE(passes->EnqueueProjectSnapshot(0.5f, false, stream_).ok());
  ASSERT_TRUE(passes->EnqueueSnapshot(stream_).ok());
  EXPECT_EQ(passes->launches() - before, 1u);

  // An empty list.
  ASSERT_TRUE(passes->SetTensors(nullptr, 0, stream_).ok());
  ASSERT_TRUE(passes->EnqueueStatistics(true, stream_).ok());
  got = passes->ReadResult(stream_);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->gg(), 0.0);
}

// More tensors than any per-launch argument block holds (ATen's kernels take
// 110 per launch; 770 = 7 launches), of mixed gradient types, some
// misaligned, some empty or absent: still one launch per pass.
TEST_F(CudaPassesTest, ManyTensorsOfMixedTypesInOneLaunchPerPass) {
  for (ElemType pt : {ElemType::kF32, ElemType::kBF16}) {
    SCOPED_TRACE(std::string("p ") + Name(pt));
    std::mt19937_64 rng(99);
    std::vector<Spec> specs;
    for (int i = 0; i < 1000; ++i) {
      Spec s;
      s.n = rng() % 10 == 0 ? 0 : static_cast<std::int64_t>(rng() % 5000);
      if (i % 97 == 0) s.n = 16384 * 2 + 3;
      s.gt = static_cast<ElemType>(rng() % 3);
      s.g_shift = rng() % 5 == 0 ? 1 : 0;
      s.p_shift = rng() % 7 == 0 ? 2 : 0;
      s.segment = static_cast<std::int32_t>(rng() % 4) - 1;
      s.present = rng() % 20 != 0;
      specs.push_back(s);
    }
    std::unique_ptr<MultiTensorPasses> passes = MakePasses(pt, 3);
    ASSERT_NE(passes, nullptr);
    Workload w(specs, pt, 77);
    ASSERT_TRUE(w.Upload());
    const std::uint64_t before = passes->launches();
    CheckStats(*passes, w, 3);
    EXPECT_FALSE(passes->inline_table());
    EXPECT_EQ(passes->launches() - before, 4u);  // two statistics passes, 2 launches each
    CheckSnapshot(*passes, w);
    CheckProject(*passes, w, false);
  }
}

// Lists at the limits of the inline table (tensors and chunks), on both
// sides: the table moves between the kernel arguments and device memory.
TEST_F(CudaPassesTest, InlineAndDeviceTableLimits) {
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kF32);
  ASSERT_NE(passes, nullptr);
  struct Case {
    std::vector<Spec> specs;
    bool inline_table;
  };
  std::vector<Case> cases;
  for (int count : {kInlineTensors - 1, kInlineTensors, kInlineTensors + 1}) {
    cases.push_back(
        {std::vector<Spec>(static_cast<std::size_t>(count), Spec{777, ElemType::kBF16}), count <= kInlineTensors});
  }
  for (int chunks : {kInlineChunks - 1, kInlineChunks, kInlineChunks + 1}) {
    // One tensor ends exactly on the limit, the second straddles it.
    const std::int64_t first = std::int64_t{chunks - 2} * kChunkElements + 5;
    cases.push_back({{Spec{first, ElemType::kF32}, Spec{kChunkElements, ElemType::kF16}}, chunks <= kInlineChunks});
  }
  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    Workload w(cases[c].specs, ElemType::kF32, 300 + c);
    ASSERT_TRUE(w.Upload());
    CheckStats(*passes, w, 0);
    EXPECT_EQ(passes->inline_table(), cases[c].inline_table);
    CheckSnapshot(*passes, w);
  }
}

TEST_F(CudaPassesTest, AtMostThreeLaunchesPerStep) {
  for (int count : {10, 2000}) {
    SCOPED_TRACE(std::to_string(count) + " tensors");
    std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kF32, 2);
    ASSERT_NE(passes, nullptr);
    std::vector<Spec> specs;
    for (int i = 0; i < count; ++i) specs.push_back(Spec{1024 + 37 * (i % 50), ElemType::kF32, 0, 0, i % 3 - 1, true});
    Workload w(specs, ElemType::kF32, 8);
    ASSERT_TRUE(w.Upload());
    const std::vector<TensorRef> refs = w.Refs();
    for (int step = 0; step < 3; ++step) {
      const std::uint64_t before = passes->launches();
      ASSERT_TRUE(Stats(*passes, refs, step > 0).ok());
      if (step == 2) {
        ASSERT_TRUE(passes->EnqueueProjectSnapshot(0.25f, false, stream_).ok());
      } else {
        ASSERT_TRUE(passes->EnqueueSnapshot(stream_).ok());
      }
      EXPECT_LE(passes->launches() - before, 3u);
      EXPECT_EQ(passes->launches() - before, 3u);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
}

TEST_F(CudaPassesTest, ChunkTableUploadedOnlyWhenTheListChanges) {
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kF32);
  ASSERT_NE(passes, nullptr);
  std::vector<Spec> specs(100, Spec{3000, ElemType::kF32});
  Workload a(specs, ElemType::kF32, 11);
  Workload b(specs, ElemType::kF32, 11);  // the same data at other addresses
  ASSERT_TRUE(a.Upload());
  ASSERT_TRUE(b.Upload());
  std::vector<TensorRef> refs = a.Refs();
  const std::vector<TensorRef> other = b.Refs();

  base::StatusOr<StatsView> first = Stats(*passes, refs, true);
  ASSERT_TRUE(first.ok());
  const double gg = first->gg();
  EXPECT_FALSE(passes->inline_table());
  EXPECT_EQ(passes->table_uploads(), 1u);
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(Stats(*passes, refs, true).ok());
    ASSERT_TRUE(passes->EnqueueSnapshot(stream_).ok());
  }
  EXPECT_EQ(passes->table_uploads(), 1u) << "an unchanged list was uploaded again";

  refs[42].g = other[42].g;  // a gradient re-allocated at another address
  base::StatusOr<StatsView> moved = Stats(*passes, refs, false);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(passes->table_uploads(), 2u);
  EXPECT_EQ(moved->gg(), gg) << "same data, same chunks: the same bits";

  refs[7].n = 1000;  // a size change
  base::StatusOr<StatsView> resized = Stats(*passes, refs, false);
  ASSERT_TRUE(resized.ok());
  EXPECT_EQ(passes->table_uploads(), 3u);
  EXPECT_LT(resized->gg(), gg);
  ASSERT_TRUE(Stats(*passes, refs, false).ok());
  EXPECT_EQ(passes->table_uploads(), 3u);

  // A list that fits the kernel arguments is never uploaded.
  std::unique_ptr<MultiTensorPasses> small = MakePasses(ElemType::kF32);
  ASSERT_NE(small, nullptr);
  std::vector<TensorRef> few(refs.begin(), refs.begin() + 10);
  ASSERT_TRUE(Stats(*small, few, true).ok());
  few[3].g = other[3].g;
  ASSERT_TRUE(Stats(*small, few, true).ok());
  EXPECT_TRUE(small->inline_table());
  EXPECT_EQ(small->table_uploads(), 0u);
}

TEST_F(CudaPassesTest, NonFiniteInputSetsTheFlag) {
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kF32);
  ASSERT_NE(passes, nullptr);
  Workload w({Spec{1000, ElemType::kF32}, Spec{1000, ElemType::kBF16}, Spec{40000, ElemType::kF32}}, ElemType::kF32,
             21);
  w.SetG(0, 5, std::nanf(""));
  w.SetP(2, 20000, std::numeric_limits<float>::infinity());  // chunk 1 of tensor 2
  ASSERT_TRUE(w.Upload());
  base::StatusOr<StatsView> got = Stats(*passes, w.Refs(), true);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->non_finite_chunks(), 2);
  EXPECT_TRUE(std::isnan(got->gg()));
  EXPECT_FALSE(std::isfinite(got->pp()));
  EXPECT_FALSE(std::isfinite(got->dot()));
  got = Stats(*passes, w.Refs(), false);  // p not read: only the NaN gradient counts
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->non_finite_chunks(), 1);

  // Finite input whose squares overflow a chunk's fp32 sum is flagged too.
  Workload big({Spec{64, ElemType::kF32}}, ElemType::kF32, 22);
  for (int i = 0; i < 64; ++i) big.SetG(0, i, 3e19f);
  ASSERT_TRUE(big.Upload());
  got = Stats(*passes, big.Refs(), false);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->non_finite_chunks(), 1);
  EXPECT_FALSE(std::isfinite(got->gg()));
}

TEST_F(CudaPassesTest, SameResultOnEveryStreamAndRun) {
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kBF16, 1);
  ASSERT_NE(passes, nullptr);
  std::vector<Spec> specs;
  for (int i = 0; i < 300; ++i) specs.push_back(Spec{5000 + i, static_cast<ElemType>(i % 3), 0, 0, i % 2 - 1, true});
  Workload w(specs, ElemType::kBF16, 31);
  ASSERT_TRUE(w.Upload());
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  const std::vector<TensorRef> refs = w.Refs();
  base::StatusOr<StatsView> a = Stats(*passes, refs, true, stream_);
  ASSERT_TRUE(a.ok());
  const std::vector<double> first(a->values, a->values + passes->result_size());
  for (cudaStream_t s : {other, stream_, static_cast<cudaStream_t>(nullptr), other}) {
    // The legacy default stream (null) too.
    ASSERT_TRUE(passes->SetTensors(refs.data(), refs.size(), stream_).ok());
    ASSERT_TRUE(passes->EnqueueStatistics(true, s == nullptr ? cudaStreamLegacy : s).ok());
    base::StatusOr<StatsView> b = passes->ReadResult(other);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(std::vector<double>(b->values, b->values + passes->result_size()), first);
  }
  ExpectStats(first[0], first[1], first[2], w.Reference(true), true);
  cudaStreamDestroy(other);
}

// A tensor of more than 2^31 elements (bf16 gradient and snapshot, 2 x 4 GiB):
// elements beyond 2^31 are read and written where they are.
TEST_F(CudaPassesTest, TensorBeyond32BitIndexing) {
#ifdef GAC_CUDA_EMU
  GTEST_SKIP() << "8 GiB of host memory on the emulator: EmuTest.GacKernelsBeyond32BitIndexingByTheBlockFilter runs "
                  "the blocks around 2^31 of such a tensor instead";
#endif
  const std::int64_t n = (std::int64_t{1} << 31) + 4099;
  const std::size_t bytes = static_cast<std::size_t>(n) * 2;
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < 2 * bytes + (std::size_t{1} << 29)) {
    GTEST_SKIP() << "needs " << (2 * bytes) / (1 << 20) << " MiB of device memory, " << free_bytes / (1 << 20)
                 << " MiB free";
  }
  DeviceBuffer g(bytes), p(bytes);
  ASSERT_NE(g.get(), nullptr);
  ASSERT_NE(p.get(), nullptr);
  // Every g element 0x3F3F (0.74609375), every p element 0x4040 (3.0); then
  // g[2^31] = -1 and g[n - 1] = 2. The partials are exact in fp32 but for the
  // last, shorter chunk (relative error near 1e-14 of the total, far below the
  // 1e-12 asserted).
  ASSERT_EQ(cudaMemset(g.get(), 0x3F, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(p.get(), 0x40, bytes), cudaSuccess);
  const std::int64_t beyond = std::int64_t{1} << 31;
  const std::uint16_t minus_one = 0xBF80, two = 0x4000;
  ASSERT_EQ(cudaMemcpy(g.get() + 2 * beyond, &minus_one, 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(g.get() + 2 * (n - 1), &two, 2, cudaMemcpyHostToDevice), cudaSuccess);
  const double v = 0.74609375;
  const double want_gg = static_cast<double>(n - 2) * v * v + 1.0 + 4.0;
  const double want_dot = static_cast<double>(n - 2) * v * 3.0 - 3.0 + 6.0;
  const double want_pp = static_cast<double>(n) * 9.0;

  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kBF16);
  ASSERT_NE(passes, nullptr);
  TensorRef ref;
  ref.g = g.get();
  ref.p = p.get();
  ref.n = n;
  ref.gt = ElemType::kBF16;
  base::StatusOr<StatsView> got = Stats(*passes, {ref}, true);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LE(RelErr(got->gg(), want_gg), 1e-12);
  EXPECT_LE(RelErr(got->dot(), want_dot), 1e-12);
  EXPECT_LE(RelErr(got->pp(), want_pp), 1e-12);

  const auto read = [](const std::uint8_t* base, std::int64_t i) {
    std::uint16_t h = 0;
    EXPECT_EQ(cudaMemcpy(&h, base + 2 * i, 2, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  };
  // Snapshot: p <- g, bit for bit.
  ASSERT_TRUE(passes->EnqueueSnapshot(stream_).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(read(p.get(), beyond), minus_one);
  EXPECT_EQ(read(p.get(), n - 1), two);
  EXPECT_EQ(read(p.get(), beyond - 1), 0x3F3F);
  // Projection with p == g: g <- g / 2, p keeps the old g.
  ASSERT_TRUE(passes->EnqueueProjectSnapshot(0.5f, false, stream_).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(read(g.get(), beyond), 0xBF00);  // -0.5
  EXPECT_EQ(read(g.get(), n - 1), 0x3F80);   // 1.0
  EXPECT_EQ(read(p.get(), n - 1), two);
}

#ifdef GAC_TEST_NCCL
// The device all-reduce path on a one-rank communicator: the sums come back
// unchanged, through NCCL and the one copy.
TEST_F(CudaPassesTest, NcclAllReduceOfTheDeviceBuffer) {
  int device = 0;
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  std::unique_ptr<MultiTensorPasses> passes = MakePasses(ElemType::kF32, 1);
  ASSERT_NE(passes, nullptr);
  Workload w({Spec{50000, ElemType::kBF16, 0, 0, 0, true}, Spec{70, ElemType::kF32}}, ElemType::kF32, 41);
  ASSERT_TRUE(w.Upload());
  const std::vector<TensorRef> refs = w.Refs();
  base::StatusOr<StatsView> plain = Stats(*passes, refs, true);
  ASSERT_TRUE(plain.ok());
  const std::vector<double> want(plain->values, plain->values + passes->result_size());
  ASSERT_TRUE(passes->SetTensors(refs.data(), refs.size(), stream_).ok());
  ASSERT_TRUE(passes->EnqueueStatistics(true, stream_).ok());
  ASSERT_TRUE(passes->EnqueueAllReduce(comm, stream_).ok());
  base::StatusOr<StatsView> reduced = passes->ReadResult(stream_);
  ASSERT_TRUE(reduced.ok());
  EXPECT_EQ(std::vector<double>(reduced->values, reduced->values + passes->result_size()), want);
  ncclCommDestroy(comm);
}
#endif

}  // namespace
}  // namespace gac::agent::cuda
