#pragma once
// The CPU backend's convolution plans: one interface, two implementations.
//   im2col   (conv_cpu.cpp)     im2col + SGEMM, every layout and kernel selection: the readable
//                               reference, and the fastest where oneDNN's primitives are not.
//   oneDNN   (conv_onednn.cpp)  oneDNN convolution primitives, created at plan time.
//   Winograd (conv_winograd.cpp) our F(4x4, 3x3) for 3x3 stride-1 layers, where oneDNN has none
//                               (below AVX-512); the oneDNN plan runs its passes through it.
// CpuBackend::plan_conv_impl asks make_onednn_plan first (oneDNN kernels only) and falls back
// to im2col when it declines.
#include <memory>

#include "cpu/cpu_backend.hpp"
#include "dp/backend.hpp"

namespace dp::cpu {

struct OnednnContext;

/// The memory a convolution pass works in: 256-byte aligned, `bytes` long. Nothing in it is
/// kept from one pass to the next, and a pass reads none of it before writing it.
struct ConvScratch {
  char* data = nullptr;
  size_t bytes = 0;
};

/// A convolution plan of the cpu backend. The passes are dp::Backend's convolution ops, called
/// after their checks (shapes, layouts, 1 <= N <= max_batch). Each runs in the scratch it is
/// given: the backend's shared scratch (every plan's need reserved at plan time), or with
/// ConvUse::planned_workspace a part of the caller's workspace, which lives only in that step.
class CpuConvPlan : public ConvPlan {
 public:
  /// `shared` is the backend's shared scratch: where a pass that needs more than it was given
  /// (a oneDNN pass at a batch size nobody declared) runs instead, grown to fit.
  CpuConvPlan(const ConvGeometry& g, std::shared_ptr<SharedScratch> shared)
      : ConvPlan(g), shared_(std::move(shared)) {}
  /// The scratch the passes of `stage` need at most, at every batch size planned (forward: the
  /// forward; backward: backward-data and backward-filter, one after the other).
  virtual size_t scratch_bytes(ConvStage stage) const = 0;
  /// x (N,C,H,W), w (K,C,R,S), b (K) or null -> y (N,K,P,Q)
  virtual void forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                       ConvScratch scratch) = 0;
  /// dy (N,K,P,Q), w (K,C,R,S) -> dx (N,C,H,W)
  virtual void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx,
                             ConvScratch scratch) = 0;
  /// x (N,C,H,W), dy (N,K,P,Q) -> dw (K,C,R,S), db (K) or null
  virtual void backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw,
                               const Tensor* db, ConvScratch scratch) = 0;
  /// Whether its pass of direction d reads w, or writes dw, in the memory order the plan's
  /// filters are in (ConvUse::filter_layout), (K, R, S, C) included: oneDNN's passes, whose
  /// reorder into their own format reads either. false: the passes take (K, C, R, S), and for a
  /// (K, R, S, C) filter the backend hands them a copy in that order (OperandCopies).
  virtual bool reads_stored_filter(ConvDirection d) const { return false; }
  /// The backend's shared scratch, as a pass's scratch.
  ConvScratch shared_scratch() const { return {shared_->data(), shared_->size()}; }

 protected:
  /// `given` when it holds `bytes`, else the shared scratch grown to `bytes` (a pass first met
  /// after the plan was made, which may need more than any planned).
  char* scratch_for(const ConvScratch& given, size_t bytes) const;

 private:
  std::shared_ptr<SharedScratch> shared_;
};

/// im2col + SGEMM (`kernels` picks the SGEMM), with `threads` threads.
std::unique_ptr<CpuConvPlan> make_im2col_plan(const ConvGeometry& g, CpuKernels kernels,
                                              int threads, std::shared_ptr<SharedScratch> shared);

/// True for the layers make_winograd_plan takes: f32, 3x3, stride 1, pad 1, channels in
/// multiples of 8.
bool winograd_applies(const ConvGeometry& g);

/// Our Winograd F(4x4, 3x3) (conv_winograd.cpp), its SGEMMs from `kernels`, with `threads`
/// threads.
std::unique_ptr<CpuConvPlan> make_winograd_plan(const ConvGeometry& g, CpuKernels kernels,
                                                int threads, std::shared_ptr<SharedScratch> shared);

/// oneDNN primitives for every pass and batch size `use` declares; nullptr when im2col is the
/// faster formulation for this geometry (see conv_onednn.cpp).
std::unique_ptr<CpuConvPlan> make_onednn_plan(const ConvGeometry& g, const ConvUse& use,
                                              std::shared_ptr<OnednnContext> context, int threads,
                                              std::shared_ptr<SharedScratch> shared,
                                              std::shared_ptr<MemoryTracker> memory);

}  // namespace dp::cpu
