#pragma once
// ml.allreduce: a data-parallel worker's gradients summed over its GPU gang's NCCL group
// (allreduce.cc says how the gang is joined).
#include <memory>

#include "vertex/program.h"

namespace copse::ml::programs {

std::unique_ptr<vertex::VertexProgram> MakeAllReduceProgram();

}  // namespace copse::ml::programs
