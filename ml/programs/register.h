#pragma once
// The ML vertex programs: training as an ordinary copse graph (docs/ml-graphs.md).
//
//   ml.init        parameters (and empty optimizer state) of layers [begin, end) from the seed
//   ml.load        one shard of one step's global batch as a message (images and labels)
//   ml.grad        forward + backward of a data-parallel worker's shard: gradients
//   ml.forward     forward of pipeline stage s on micro-batch m: activation + stash
//   ml.backward    backward of stage s on m from the stash (or recomputed): input gradient and
//                  the stage's gradients accumulated over micro-batches 0..m
//   ml.reduce      sum of gradient messages in port order (a node of a reduction tree)
//   ml.ring_reduce one round of a ring all-reduce among replica vertices
//   ml.allreduce   a worker's gradients summed over its GPU gang's NCCL group
//   ml.tp_step     one step of one member of a tensor-parallel gang (forward, backward and
//                  update of its shard), all-reducing each block's partials over live channels
//   ml.update      optimizer step of one stage: sums its gradient inputs, writes the new
//                  parameters and optimizer state
//   ml.ps          a parameter server: ml.update fed by every worker directly
//   ml.eval        test accuracy of the assembled model; metrics.json and the parameters
//   ml.checkpoint  writes a stage's parameters and optimizer state to a file
//   ml.profile, ml.profile_hop, ml.profile_collect
//                  `copse plan`'s profiling job (ml/programs/profile.h); these measure time, so
//                  unlike the others a re-run writes other bytes
//
// Every program is deterministic in (params, input bytes): a re-executed vertex writes the
// same bytes, so a recovered job ends with bit-identical parameters.
#include "vertex/program_registry.h"

namespace copse::ml {

/// Adds the ML programs to `registry` (AlreadyExists entries are ignored).
void RegisterMlPrograms(vertex::ProgramRegistry& registry);

}  // namespace copse::ml
