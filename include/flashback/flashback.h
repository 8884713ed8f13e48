/* flashback C API: attention forward and backward for NVIDIA Hopper (sm_90a).
 *
 * Plain structs of device pointers, shapes and strides; no framework types. Every entry point
 * re-checks what the kernels rely on (non-null pointers, alignment, strides, supported head
 * dims, the GPU's architecture) and returns a status; flashback_last_error() then holds a
 * readable message for the calling thread. A call that returns an error launches nothing.
 *
 * Layout (as FlashAttention): q, out, dout, dq are (batch, seqlen_q, nheads, headdim);
 * k, v, dk, dv are (batch, seqlen_k, nheads_k, headdim); lse is (batch, nheads, seqlen_q),
 * fp32, contiguous, natural log. Strides are in elements; the last dimension is contiguous.
 * nheads must be a multiple of nheads_k (GQA / MQA); batch and nheads are at most 65535,
 * seqlen_q and seqlen_k at most 2^30. Every pointer is device memory of the current device.
 * Causal masking is aligned bottom-right: query row i sees key column j when
 * j <= i + seqlen_k - seqlen_q.
 *
 * Variable-length batches (FlashAttention's varlen layout): set cu_seqlens_q and cu_seqlens_k
 * (int32 device arrays of batch + 1 offsets: first 0, non-decreasing, last = total_q / total_k).
 * q, out, dout, dq are then (total_q, nheads, headdim) and k, v, dk, dv (total_k, nheads_k,
 * headdim): sequence b owns rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 (batch strides are
 * ignored), may be empty, and never reads or writes another's rows. seqlen_q and seqlen_k are
 * then the longest sequence lengths, which size the grid: the caller must not pass less than
 * a sequence's length (the library does not read the offsets on the host, so it cannot check
 * them; the Python front does). Offsets that break these rules are undefined behaviour:
 * reads and writes outside the tensors, rows left uncomputed, or (deterministic mode) a wait
 * that never ends until the kernel traps. lse is (nheads, total_q). Causal masking is
 * bottom-right per sequence. NULL offsets: dense batches as above.
 *
 * Outputs (out, lse, dq, dk, dv) must not share memory with any input, nor with each other;
 * their strides must give every element its own address (checked). Inputs may use any strides
 * that are multiples of 8 elements up to 2^40, including 0 (broadcast).
 *
 * The deterministic backward's CTAs wait for each other in a fixed order, which assumes the
 * kernel can have every SM: a kernel holding SMs at the same time (another stream, MPS) can
 * stall it, non-causal calls most; FLASHBACK_DET_COOPERATIVE=1 launches those in chunks that
 * fit (README).
 */
#ifndef FLASHBACK_FLASHBACK_H_
#define FLASHBACK_FLASHBACK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLASHBACK_API __declspec(dllexport)
#else
#define FLASHBACK_API __attribute__((visibility("default")))
#endif

#define FLASHBACK_VERSION_MAJOR 0
#define FLASHBACK_VERSION_MINOR 1
#define FLASHBACK_VERSION_PATCH 0

typedef enum {
  FLASHBACK_SUCCESS = 0,
  FLASHBACK_ERROR_INVALID_VALUE = 1, /* null pointer, bad shape, stride or alignment */
  FLASHBACK_ERROR_NOT_SUPPORTED = 2, /* well-formed but not implemented (head dim, dtype, GPU) */
  FLASHBACK_ERROR_CUDA = 3,          /* a CUDA runtime call or a kernel launch failed */
} flashback_status;

typedef enum {
  FLASHBACK_DTYPE_BF16 = 0,
  FLASHBACK_DTYPE_FP16 = 1, /* Hopper kernels only (no reference fallback) */
} flashback_dtype;

/* Element strides of a (batch, seqlen, heads, headdim) tensor whose last dim is contiguous. */
typedef struct {
  int64_t batch;
  int64_t row;
  int64_t head;
} flashback_strides;

typedef struct {
  const void *q, *k, *v;
  void *out;
  float *lse; /* (batch, nheads, seqlen_q) contiguous */
  flashback_strides q_strides, k_strides, v_strides, out_strides;
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim;
  float softmax_scale; /* multiplies Q K^T; usually 1/sqrt(headdim) */
  int causal;          /* nonzero: bottom-right aligned causal mask */
  flashback_dtype dtype;
  void *stream; /* a cudaStream_t; NULL is the legacy default stream */
  const int *cu_seqlens_q, *cu_seqlens_k; /* varlen offsets (see above); NULL: dense */
  int total_q, total_k;                   /* varlen: rows of q and of k */
} flashback_fwd_params;

typedef struct {
  const void *q, *k, *v, *out, *dout;
  const float *lse; /* as written by flashback_attention_forward */
  void *dq, *dk, *dv;
  flashback_strides q_strides, k_strides, v_strides, out_strides, dout_strides;
  flashback_strides dq_strides, dk_strides, dv_strides;
  int batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim;
  float softmax_scale;
  int causal;
  int deterministic; /* nonzero: bitwise reproducible gradients (see the note above) */
  flashback_dtype dtype;
  void *workspace; /* device memory of flashback_bwd_workspace_size() bytes, 256-byte aligned */
  size_t workspace_bytes;
  void *stream;
  const int *cu_seqlens_q, *cu_seqlens_k; /* varlen offsets (see above); NULL: dense */
  int total_q, total_k;                   /* varlen: rows of q and of k */
} flashback_bwd_params;

/* Bytes of device workspace flashback_attention_backward needs for these shapes (0 if the
 * shapes are invalid; the backward call then reports why). */
FLASHBACK_API size_t flashback_bwd_workspace_size(const flashback_bwd_params *params);

FLASHBACK_API flashback_status flashback_attention_forward(const flashback_fwd_params *params);
FLASHBACK_API flashback_status flashback_attention_backward(const flashback_bwd_params *params);

/* 1 if headdim is supported by this build (in some dtype), else 0. */
FLASHBACK_API int flashback_headdim_supported(int headdim);

/* 1 if this build serves (headdim, dtype) on some path, else 0. */
FLASHBACK_API int flashback_supports(int headdim, int dtype);

/* 1 if the Hopper kernel family has an instance for (headdim, dtype): such calls run there
 * whenever their tensors are TMA-addressable (128-byte aligned, strides multiples of 64
 * elements; flashback_last_*_path says why not otherwise). 0 for a head dim or dtype the build
 * left out (FLASHBACK_HEADDIMS, FLASHBACK_DTYPES). The one predicate the library's dispatch, the
 * Python provider and the tests share. */
FLASHBACK_API int flashback_sm90_supports(int headdim, int dtype);

/* Checks that `device` is a GPU this build runs on (sm_90). */
FLASHBACK_API flashback_status flashback_check_device(int device);

/* The message of the last failed call on this thread ("" if none). */
FLASHBACK_API const char *flashback_last_error(void);

FLASHBACK_API const char *flashback_version(void);

/* The short git commit the library was built from, "-dirty" appended when tracked files
 * differed from it, or "unknown" (not built from a git checkout). */
FLASHBACK_API const char *flashback_build_commit(void);

/* Which kernels the last successful flashback_attention_forward / _backward call of this
 * process (any thread) launched: "sm90" (the Hopper kernel) or "reference: <why the Hopper
 * path declined>"; "" before any. The string stays valid until the next such call on this
 * thread. With the environment variable FLASHBACK_LOG_PATH=1 the library also prints each
 * distinct answer once per process to stderr ("flashback: backward path: ..."). */
FLASHBACK_API const char *flashback_last_forward_path(void);
FLASHBACK_API const char *flashback_last_backward_path(void);

/* Which form of the Hopper backward the last flashback_attention_backward call of this process
 * ran: "pair" (CTAs in 2-CTA clusters on neighbouring K/V blocks, head dim 256 from 1024 query
 * rows per CTA), "pair, last wave split" (the same, with the grid's partial last wave split by
 * query range, where the config does that) or "single" (one CTA per K/V block); "" before any,
 * or when the reference kernels ran. A static string. */
FLASHBACK_API const char *flashback_last_backward_kernel(void);

/* A measuring aid for kernel work: the device buffer (ctas x steps x 2 x 16 uint64, zeroed by
 * the caller) that a backward config built with `timeline` (never one of the shipped table's)
 * fills with clock64() stamps per consumer warpgroup and step (BwdTimelineEvent in
 * bwd_sm90.h; scripts/bwd_timeline.py reads it). Shipped kernels never write it. NULL turns it
 * off. Returns FLASHBACK_SUCCESS, or FLASHBACK_ERROR_INVALID_VALUE for a buffer with ctas or
 * steps < 1. */
FLASHBACK_API int flashback_debug_bwd_timeline(unsigned long long *buffer, int ctas, int steps);

/* A measuring aid: how the head-dim-256 backward would cut a non-causal grid of `units` 2-CTA
 * clusters, `slots` of them resident at once, each walking m_blocks Q blocks of `group` q heads
 * (its split last wave): *first gets the first split unit and *parts the parts per split unit
 * (1: no split). No GPU needed. */
FLASHBACK_API void flashback_debug_bwd_split_plan(int units, int slots, int m_blocks, int group,
                                                  int *first, int *parts);

/* sizeof(flashback_fwd_params) and sizeof(flashback_bwd_params) as compiled into the library,
 * so a binding written in another language can check its copy of the structs. */
FLASHBACK_API void flashback_params_sizes(size_t *fwd_bytes, size_t *bwd_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHBACK_FLASHBACK_H_ */
