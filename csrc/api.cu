// The C API: re-checks every parameter the kernels rely on, then dispatches.
//
// The Python front validates too (with friendlier messages), but any other caller reaches the
// kernels only through here, so nothing a kernel assumes may go unchecked: a wrong stride or
// an unaligned pointer would otherwise be an out-of-bounds access, not an error.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "bwd_sm90/bwd_sm90.h"
#include "fwd_sm90/fwd_sm90.h"
#include "common/attention.cuh"
#include "flashback/flashback.h"
#include "flashback_build_id.h"  // generated: FLASHBACK_BUILD_COMMIT (cmake/build_id.cmake)
#include "launch.h"
#include "sm90/sm90_family.h"

namespace flashback {
namespace {

thread_local std::string g_last_error;
// Process-wide, not per thread: autograd runs the backward on its own device thread.
std::mutex g_path_mu;
std::string g_last_fwd_path;
std::string g_last_bwd_path;

flashback_status fail(flashback_status status, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  g_last_error = buf;
  return status;
}

flashback_status ok() {
  g_last_error.clear();
  return FLASHBACK_SUCCESS;
}

#define FLASHBACK_HEADDIM_ENTRY(d) d,
// The head dims this build instantiated (FLASHBACK_HEADDIMS in CMake): the reference kernels'
// (bf16) and the Hopper family's (bf16 and fp16). 0 ends each list and keeps it non-empty.
constexpr int kReferenceHeadDims[] = {FLASHBACK_REF_FOR_EACH_HEADDIM(FLASHBACK_HEADDIM_ENTRY) 0};
constexpr int kSm90HeadDims[] = {FLASHBACK_SM90_FOR_EACH_HEADDIM(FLASHBACK_HEADDIM_ENTRY) 0};
#undef FLASHBACK_HEADDIM_ENTRY

template <size_t N>
bool in_list(const int (&list)[N], int d) {
  for (int s : list)
    if (s != 0 && s == d) return true;
  return false;
}

// Some kernel of this build serves the head dim.
bool headdim_supported(int d) { return in_list(kReferenceHeadDims, d) || in_list(kSm90HeadDims, d); }

// The Hopper family has an instance for (d, dtype): a head dim and a dtype (bf16, fp16) this
// build compiled (FLASHBACK_HEADDIMS, FLASHBACK_DTYPES); the layout test comes later
// (can_implement).
bool sm90_serves(int d, flashback_dtype dtype) {
  return in_list(kSm90HeadDims, d) && sm90::dtype_compiled(dtype);
}
// The reference kernels serve (d, dtype): bf16 only (a build without bf16 compiles none of
// them, common/attention.cuh).
bool reference_serves(int d, flashback_dtype dtype) {
  return in_list(kReferenceHeadDims, d) && dtype == FLASHBACK_DTYPE_BF16;
}

std::string supported_headdims_text() {
  std::string s;
  for (int d = 1; d <= 512; ++d) {
    if (!headdim_supported(d)) continue;
    if (!s.empty()) s += ", ";
    s += std::to_string(d);
  }
  return s.empty() ? "none in this build" : s;
}

struct Shape {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim;
};

constexpr int kMaxSeqlen = 1 << 30;
constexpr int64_t kMaxStride = int64_t{1} << 40;

flashback_status check_shape(const Shape& s, flashback_dtype dtype, float scale) {
  if (s.batch < 1) return fail(FLASHBACK_ERROR_INVALID_VALUE, "batch must be >= 1, got %d", s.batch);
  if (s.seqlen_q < 1 || s.seqlen_k < 1)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "seqlen_q and seqlen_k must be >= 1, got %d and %d",
                s.seqlen_q, s.seqlen_k);
  // Block counts round seqlen up in int arithmetic (and the varlen max_seqlen is only an upper
  // bound, which a caller may pass loosely): far below INT_MAX keeps every rounding exact.
  if (s.seqlen_q > kMaxSeqlen || s.seqlen_k > kMaxSeqlen)
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED, "seqlen_q and seqlen_k must be at most %d, got %d and %d",
                kMaxSeqlen, s.seqlen_q, s.seqlen_k);
  if (s.nheads < 1 || s.nheads_k < 1)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "nheads and nheads_k must be >= 1, got %d and %d",
                s.nheads, s.nheads_k);
  // Heads and batch index grid dims y and z, which CUDA caps at 65535.
  if (s.batch > 65535 || s.nheads > 65535)
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED,
                "batch (%d) and nheads (%d) must be at most 65535", s.batch, s.nheads);
  if (s.nheads % s.nheads_k != 0)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "nheads (%d) must be divisible by nheads_k (%d)",
                s.nheads, s.nheads_k);
  if (!headdim_supported(s.headdim))
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED, "headdim %d is not supported (supported: %s)",
                s.headdim, supported_headdims_text().c_str());
  if (dtype != FLASHBACK_DTYPE_BF16 && dtype != FLASHBACK_DTYPE_FP16)
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED,
                "dtype %d is not supported (supported: bf16 = %d, fp16 = %d)", static_cast<int>(dtype),
                static_cast<int>(FLASHBACK_DTYPE_BF16), static_cast<int>(FLASHBACK_DTYPE_FP16));
  // A dtype the build left out has no kernel at all (the reference kernels are bf16 and go
  // with it).
  if (const char* why = sm90::dtype_not_compiled(dtype))
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED, "%s", why);
  if (!sm90_serves(s.headdim, dtype) && !reference_serves(s.headdim, dtype))
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED, "headdim %d in %s has no kernel in this build", s.headdim,
                dtype == FLASHBACK_DTYPE_FP16 ? "fp16" : "bf16");
  if (!std::isfinite(scale) || scale <= 0.f)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "softmax_scale must be finite and > 0, got %g",
                static_cast<double>(scale));
  return FLASHBACK_SUCCESS;
}

// The kernels move rows with 16-byte vector accesses: base pointers must be 16-byte aligned
// and every stride a multiple of 8 bf16 elements. Strides must also keep the rows of one
// tensor apart, or a write would race with another.
flashback_status check_tensor(const char* name, const void* ptr, const flashback_strides& st,
                              int batch, int seqlen, int heads, int headdim,
                              bool is_output = false) {
  if (ptr == nullptr) return fail(FLASHBACK_ERROR_INVALID_VALUE, "%s is a null pointer", name);
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "%s must be 16-byte aligned (address %p)", name, ptr);
  const int64_t strides[3] = {st.batch, st.row, st.head};
  const char* names[3] = {"batch", "row", "head"};
  for (int i = 0; i < 3; ++i) {
    if (strides[i] < 0 || strides[i] % 8 != 0)
      return fail(FLASHBACK_ERROR_INVALID_VALUE,
                  "%s %s stride must be a non-negative multiple of 8 elements, got %lld", name,
                  names[i], static_cast<long long>(strides[i]));
    // Offsets are stride x index in int64 bytes, and the overlap check below multiplies
    // strides by sizes: 2^40 elements (2 TiB of 16-bit data) keeps both far from overflow.
    if (strides[i] > kMaxStride)
      return fail(FLASHBACK_ERROR_NOT_SUPPORTED, "%s %s stride must be at most 2^40 elements, got %lld",
                  name, names[i], static_cast<long long>(strides[i]));
  }
  if (!is_output) return FLASHBACK_SUCCESS;  // inputs may alias (e.g. broadcast strides)
  // Many CTAs write an output at once, so no two indices may share an element: with the dims
  // of size > 1 sorted by stride, each stride must step over everything inside it.
  struct Dim {
    int64_t stride, size;
    const char* name;
  } dims[4] = {{1, headdim, "headdim"}, {st.head, heads, "head"}, {st.row, seqlen, "row"},
               {st.batch, batch, "batch"}};
  for (int i = 1; i < 4; ++i)  // insertion sort by stride; dim 0 (stride 1) stays first
    for (int j = i; j > 1 && dims[j].stride < dims[j - 1].stride; --j) {
      const Dim t = dims[j];
      dims[j] = dims[j - 1];
      dims[j - 1] = t;
    }
  int64_t reach = headdim;
  for (int i = 1; i < 4; ++i) {
    if (dims[i].size <= 1) continue;
    if (dims[i].stride < reach)
      return fail(FLASHBACK_ERROR_INVALID_VALUE,
                  "%s %s stride %lld overlaps other elements of the output (it must be >= %lld)",
                  name, dims[i].name, static_cast<long long>(dims[i].stride),
                  static_cast<long long>(reach));
    reach = dims[i].stride * dims[i].size;
  }
  return FLASHBACK_SUCCESS;
}

flashback_status check_lse(const char* name, const float* lse) {
  if (lse == nullptr) return fail(FLASHBACK_ERROR_INVALID_VALUE, "%s is a null pointer", name);
  if (reinterpret_cast<uintptr_t>(lse) % 4 != 0)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "%s must be 4-byte aligned", name);
  return FLASHBACK_SUCCESS;
}

flashback_status check_current_device() {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess)
    return fail(FLASHBACK_ERROR_CUDA, "cudaGetDevice failed: %s", cudaGetErrorString(err));
  return flashback_check_device(device);
}

// Launches are checked with cudaGetLastError, which also returns an error an earlier call of
// the caller's left on this thread; clear that first so it is not reported as ours (and so the
// backward's "tensor map did not encode" signal cannot be mistaken).
void clear_stale_cuda_error() { (void)cudaGetLastError(); }

flashback_status launched(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    return fail(FLASHBACK_ERROR_CUDA, "%s failed: %s", what, cudaGetErrorString(err));
  return ok();
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// FLASHBACK_FORCE_REFERENCE=1 (read once per process) sends every forward and backward to the
// reference kernels, so tests and benchmarks can compare both paths in one build.
bool force_reference() {
  static const bool force = env_flag("FLASHBACK_FORCE_REFERENCE");
  return force;
}

// Records the path a call took (flashback_last_forward_path / _backward_path) and, under
// FLASHBACK_LOG_PATH=1, prints each distinct one once per process, so a silent fallback to the
// slow kernels shows in a benchmark or a training log.
void record_path(std::string* last, const char* direction, const char* path, const char* why) {
  std::string s = path;
  if (why != nullptr) {
    s += ": ";
    s += why;
  }
  static const bool log = env_flag("FLASHBACK_LOG_PATH");
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(g_path_mu);
  if (log && seen.insert(std::string(direction) + s).second) {
    std::fprintf(stderr, "flashback: %s path: %s\n", direction, s.c_str());
  }
  *last = std::move(s);
}

const char* copy_path(const std::string& last) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(g_path_mu);
  copy = last;
  return copy.c_str();
}

// Launches one direction: the Hopper kernels (csrc/fwd_sm90, csrc/bwd_sm90) when they take the
// params (a family member for the head dim and dtype, TMA-addressable tensors) and
// FLASHBACK_FORCE_REFERENCE is not set, else -- or when a tensor map does not encode, in which
// case the fast path launched nothing -- the reference kernels, which serve bf16 only: fp16 (and
// head dims only the family has) then fails with the Hopper path's reason instead of running
// something else. Records which ran and why. The device itself is checked before (sm_90 only,
// check_current_device).
template <typename Params>
flashback_status launch_direction(const Params& p, bool (*can_implement)(const Params&, const char**),
                                  cudaError_t (*run_sm90)(const Params&, cudaStream_t),
                                  cudaError_t (*run_reference)(const Params&, cudaStream_t),
                                  std::string* last, const char* direction) {
  clear_stale_cuda_error();
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const char* why = nullptr;
  const std::string what = std::string(direction) + " launch";
  if (force_reference()) {
    why = "FLASHBACK_FORCE_REFERENCE is set";
  } else if (can_implement(p, &why)) {
    const cudaError_t err = run_sm90(p, stream);
    if (err != cudaErrorNotSupported) {
      const flashback_status st = launched(err, (what + " (sm90)").c_str());
      if (st == FLASHBACK_SUCCESS) record_path(last, direction, "sm90", nullptr);
      return st;
    }
    why = "the Hopper path declined at launch (a tensor map the driver did not encode, or no "
          "room for the backward's 2-CTA clusters on this device)";
  }
  if (!reference_serves(p.headdim, p.dtype))
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED,
                "%s: headdim %d %s runs on the Hopper kernels only, which declined: %s%s",
                direction, p.headdim, p.dtype == FLASHBACK_DTYPE_FP16 ? "fp16" : "bf16", why,
                FLASHBACK_SM90_HAS_BF16 ? " (the reference kernels serve bf16 at head dims 64, 128, 256)"
                                        : " (this build has no reference kernels: bf16 is not compiled)");
  const flashback_status st = launched(run_reference(p, stream), what.c_str());
  if (st == FLASHBACK_SUCCESS) record_path(last, direction, "reference", why);
  return st;
}

// The workspace depends on the shapes and flags only, not on pointers or strides (the header
// promises a size "for these shapes"): room for the Hopper path whenever it could be chosen,
// and for the reference, which it falls back to when a tensor map does not encode.
size_t bwd_workspace_bytes(const flashback_bwd_params& p) {
  const size_t ref = reference_bwd_workspace_size(p);
  const bool sm90_possible = !force_reference() && sm90_serves(p.headdim, p.dtype);
  if (!sm90_possible) return ref;
  const size_t fast = sm90::bwd_sm90_workspace_size(p);
  return fast > ref ? fast : ref;
}

#define FLASHBACK_TRY(expr)                              \
  do {                                                   \
    flashback_status status_ = (expr);                   \
    if (status_ != FLASHBACK_SUCCESS) return status_;    \
  } while (0)

// How a tensor's rows are laid out for the stride checks: (batch, seqlen) dense, or one
// packed run of total rows (varlen).
struct Rows {
  int batch, seqlen;
};
template <typename Params>
Rows rows_q(const Params& p) {
  return p.cu_seqlens_q != nullptr ? Rows{1, p.total_q} : Rows{p.batch, p.seqlen_q};
}
template <typename Params>
Rows rows_k(const Params& p) {
  return p.cu_seqlens_q != nullptr ? Rows{1, p.total_k} : Rows{p.batch, p.seqlen_k};
}

// Varlen offsets: both or neither, int32-aligned, totals >= 1 (the values themselves live on the
// device; see the header).
template <typename Params>
flashback_status check_varlen(const Params& p) {
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return fail(FLASHBACK_ERROR_INVALID_VALUE,
                "cu_seqlens_q and cu_seqlens_k must both be set (varlen) or both be null (dense)");
  if (p.cu_seqlens_q == nullptr) return FLASHBACK_SUCCESS;
  if (reinterpret_cast<uintptr_t>(p.cu_seqlens_q) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(p.cu_seqlens_k) % 4 != 0)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "cu_seqlens_q and cu_seqlens_k must be 4-byte aligned");
  if (p.total_q < 1 || p.total_k < 1)
    return fail(FLASHBACK_ERROR_INVALID_VALUE, "varlen total_q and total_k must be >= 1, got %d and %d",
                p.total_q, p.total_k);
  return FLASHBACK_SUCCESS;
}

// The checks both directions share: the shape, then q, k and v (read-only in both).
template <typename Params>
flashback_status check_shape_and_qkv(const Params& p) {
  const Shape s{p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.nheads_k, p.headdim};
  FLASHBACK_TRY(check_shape(s, p.dtype, p.softmax_scale));
  FLASHBACK_TRY(check_varlen(p));
  const Rows rq = rows_q(p), rk = rows_k(p);
  FLASHBACK_TRY(check_tensor("q", p.q, p.q_strides, rq.batch, rq.seqlen, s.nheads, s.headdim));
  FLASHBACK_TRY(check_tensor("k", p.k, p.k_strides, rk.batch, rk.seqlen, s.nheads_k, s.headdim));
  FLASHBACK_TRY(check_tensor("v", p.v, p.v_strides, rk.batch, rk.seqlen, s.nheads_k, s.headdim));
  return FLASHBACK_SUCCESS;
}

}  // namespace
}  // namespace flashback

using namespace flashback;

extern "C" {

int flashback_headdim_supported(int headdim) { return headdim_supported(headdim) ? 1 : 0; }

int flashback_supports(int headdim, int dtype) {
  const flashback_dtype t = static_cast<flashback_dtype>(dtype);
  return sm90_serves(headdim, t) || reference_serves(headdim, t) ? 1 : 0;
}

int flashback_sm90_supports(int headdim, int dtype) {
  return sm90_serves(headdim, static_cast<flashback_dtype>(dtype)) ? 1 : 0;
}

const char* flashback_last_error(void) { return g_last_error.c_str(); }

const char* flashback_last_forward_path(void) { return copy_path(g_last_fwd_path); }

const char* flashback_last_backward_path(void) { return copy_path(g_last_bwd_path); }

const char* flashback_last_backward_kernel(void) { return sm90::bwd_sm90_last_kernel(); }

int flashback_debug_bwd_timeline(unsigned long long* buffer, int ctas, int steps) {
  if (buffer != nullptr && (ctas <= 0 || steps <= 0)) {
    return fail(FLASHBACK_ERROR_INVALID_VALUE,
                "flashback_debug_bwd_timeline: ctas and steps must be >= 1 with a buffer, got %d and %d",
                ctas, steps);
  }
  sm90::bwd_sm90_set_timeline(buffer, ctas, steps);
  return ok();
}

void flashback_debug_bwd_split_plan(int units, int slots, int m_blocks, int group, int* first, int* parts) {
  const sm90::BwdSm90SplitPlan plan = sm90::bwd_sm90_split_plan(units, slots, m_blocks, group);
  if (first) *first = plan.first;
  if (parts) *parts = plan.parts;
}

const char* flashback_version(void) { return "0.1.0"; }

const char* flashback_build_commit(void) { return FLASHBACK_BUILD_COMMIT; }

void flashback_params_sizes(size_t* fwd_bytes, size_t* bwd_bytes) {
  if (fwd_bytes) *fwd_bytes = sizeof(flashback_fwd_params);
  if (bwd_bytes) *bwd_bytes = sizeof(flashback_bwd_params);
}

flashback_status flashback_check_device(int device) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess)
    return fail(FLASHBACK_ERROR_CUDA, "cannot query device %d: %s", device, cudaGetErrorString(err));
  // The library is compiled for sm_90a only; that machine code runs on compute capability 9.0
  // and nowhere else (not on 8.x, not on 10.x).
  if (major != 9 || minor != 0)
    return fail(FLASHBACK_ERROR_NOT_SUPPORTED, "requires an sm_90 GPU (H100/H200), got sm_%d%d",
                major, minor);
  return ok();
}

flashback_status flashback_attention_forward(const flashback_fwd_params* p) {
  if (p == nullptr) return fail(FLASHBACK_ERROR_INVALID_VALUE, "params is a null pointer");
  FLASHBACK_TRY(check_shape_and_qkv(*p));
  const Shape s{p->batch, p->seqlen_q, p->seqlen_k, p->nheads, p->nheads_k, p->headdim};
  const Rows rq = rows_q(*p);
  FLASHBACK_TRY(check_tensor("out", p->out, p->out_strides, rq.batch, rq.seqlen, s.nheads, s.headdim, true));
  FLASHBACK_TRY(check_lse("lse", p->lse));
  FLASHBACK_TRY(check_current_device());
  return launch_direction(*p, sm90::fwd_sm90_can_implement, sm90::run_fwd_sm90, run_reference_fwd,
                          &g_last_fwd_path, "forward");
}

size_t flashback_bwd_workspace_size(const flashback_bwd_params* p) {
  if (p == nullptr) return 0;
  const Shape s{p->batch, p->seqlen_q, p->seqlen_k, p->nheads, p->nheads_k, p->headdim};
  if (check_shape(s, p->dtype, p->softmax_scale) != FLASHBACK_SUCCESS) return 0;
  if (check_varlen(*p) != FLASHBACK_SUCCESS) return 0;  // total_q sizes the varlen workspace
  return bwd_workspace_bytes(*p);
}

flashback_status flashback_attention_backward(const flashback_bwd_params* p) {
  if (p == nullptr) return fail(FLASHBACK_ERROR_INVALID_VALUE, "params is a null pointer");
  FLASHBACK_TRY(check_shape_and_qkv(*p));
  const Shape s{p->batch, p->seqlen_q, p->seqlen_k, p->nheads, p->nheads_k, p->headdim};
  const Rows rq = rows_q(*p), rk = rows_k(*p);
  FLASHBACK_TRY(check_tensor("out", p->out, p->out_strides, rq.batch, rq.seqlen, s.nheads, s.headdim));
  FLASHBACK_TRY(check_tensor("dout", p->dout, p->dout_strides, rq.batch, rq.seqlen, s.nheads, s.headdim));
  FLASHBACK_TRY(check_tensor("dq", p->dq, p->dq_strides, rq.batch, rq.seqlen, s.nheads, s.headdim, true));
  FLASHBACK_TRY(check_tensor("dk", p->dk, p->dk_strides, rk.batch, rk.seqlen, s.nheads_k, s.headdim, true));
  FLASHBACK_TRY(check_tensor("dv", p->dv, p->dv_strides, rk.batch, rk.seqlen, s.nheads_k, s.headdim, true));
  FLASHBACK_TRY(check_lse("lse", p->lse));
  const size_t need = bwd_workspace_bytes(*p);
  if (need > 0) {
    if (p->workspace == nullptr || p->workspace_bytes < need)
      return fail(FLASHBACK_ERROR_INVALID_VALUE,
                  "workspace of %zu bytes at %p is too small: %zu bytes needed "
                  "(flashback_bwd_workspace_size)",
                  p->workspace_bytes, p->workspace, need);
    if (reinterpret_cast<uintptr_t>(p->workspace) % 256 != 0)
      return fail(FLASHBACK_ERROR_INVALID_VALUE, "workspace must be 256-byte aligned");
  }
  FLASHBACK_TRY(check_current_device());
  sm90::bwd_sm90_note_kernel("");  // set again only if a Hopper backward launches
  return launch_direction(*p, sm90::bwd_sm90_can_implement, sm90::run_bwd_sm90, run_reference_bwd,
                          &g_last_bwd_path, "backward");
}

}  // extern "C"
