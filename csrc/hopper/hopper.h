// The Hopper (sm_90a) primitives layer: one small documented wrapper per PTX instruction.
//   common.h    address conversion, proxy fences, elect.sync
//   mbarrier.h  mbarrier init/arrive/expect_tx/try_wait, TmaPipeline<N>, named barriers
//   tma.h       tensor maps (host), TMA load/multicast/store/reduce, bulk reduce-add
//   wgmma.h     smem descriptors, wgmma SS/RS m64nNk16 bf16->fp32, fence/commit/wait, layouts
//   regs.h      setmaxnreg inc/dec
//   stmatrix.h  stmatrix (.trans): accumulator fragments -> transposed bf16 tiles in smem
//   cluster.h   cluster launch, ranks, mapa/DSMEM, cluster barrier
//   pdl.h       programmatic dependent launch: the launch attribute, griddepcontrol wait/launch
// Tests: tests/gpu/hopper/ (each primitive against PyTorch on an H100/H200). Worked example:
// tests/gpu/hopper/gemm.cu, a warp-specialized bf16 GEMM.
#pragma once

#include "hopper/cluster.h"
#include "hopper/common.h"
#include "hopper/mbarrier.h"
#include "hopper/pdl.h"
#include "hopper/regs.h"
#include "hopper/stmatrix.h"
#include "hopper/tma.h"
#include "hopper/wgmma.h"
