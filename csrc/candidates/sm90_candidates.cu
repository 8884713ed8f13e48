// The Hopper kernels' candidate configs (bwd_sm90.h, fwd_sm90.h; each has a section in
// docs/perf-log.md with its prediction and how to measure it): their kernels, compiled for bf16
// by the `flashback_candidates` target, which CI builds and nothing links. So a change that
// breaks a candidate shows before anyone swaps it into a table.
#include "bwd_sm90/bwd_sm90_launch.cuh"
#include "fwd_sm90/fwd_sm90_launch.cuh"

namespace flashback {
namespace sm90 {
template cudaError_t run_bwd_sm90_config<BwdSm90Traits<kBwdSm90Hdim192Wg3, Dtype::kBf16>>(
    const flashback_bwd_params&, cudaStream_t);
template cudaError_t run_bwd_sm90_config<BwdSm90Traits<kBwdSm90Hdim256Q1, Dtype::kBf16>>(
    const flashback_bwd_params&, cudaStream_t);
template cudaError_t run_bwd_sm90_config<BwdSm90Traits<kBwdSm90Hdim256N64, Dtype::kBf16>>(
    const flashback_bwd_params&, cudaStream_t);
template cudaError_t run_bwd_sm90_config<BwdSm90Traits<kBwdSm90Hdim256PairQ1, Dtype::kBf16>>(
    const flashback_bwd_params&, cudaStream_t);
template cudaError_t run_bwd_sm90_config<BwdSm90Traits<kBwdSm90Hdim256PairN64, Dtype::kBf16>>(
    const flashback_bwd_params&, cudaStream_t);
template cudaError_t run_fwd_sm90_config<FwdSm90Traits<kFwdSm90Hdim64OneLoop, Dtype::kBf16>>(
    const flashback_fwd_params&, cudaStream_t);
template cudaError_t run_fwd_sm90_config<FwdSm90Traits<kFwdSm90Hdim128OneLoop, Dtype::kBf16>>(
    const flashback_fwd_params&, cudaStream_t);
template cudaError_t run_fwd_sm90_config<FwdSm90Traits<kFwdSm90Hdim192OneLoop, Dtype::kBf16>>(
    const flashback_fwd_params&, cudaStream_t);
template cudaError_t run_fwd_sm90_config<FwdSm90Traits<kFwdSm90Hdim256OneLoop, Dtype::kBf16>>(
    const flashback_fwd_params&, cudaStream_t);
}  // namespace sm90
}  // namespace flashback
