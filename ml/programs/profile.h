#pragma once
// The programs of `copse plan`'s profiling job (ml/profile_graph.h):
//   ml.profile          a cost table of the model's layers, measured on this daemon (ml/layer_profile.h)
//   ml.profile_hop      one link of a chain of vertices timing the hand-offs between them
//   ml.profile_collect  the median of the daemons' tables and the link's costs: costs.json
#include "vertex/program_registry.h"

namespace copse::ml::programs {

void RegisterProfilePrograms(vertex::ProgramRegistry& registry);

}  // namespace copse::ml::programs
