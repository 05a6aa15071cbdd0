// ml.allreduce: the data-parallel reducer of a GPU gang. One vertex per worker and step sums
// its worker's gradients with every other worker's through VertexContext::collective (the
// gang's NCCL group: ncclAllReduce, staged through the vertex's GPU) and hands the sum to its
// worker's update, so every replica steps its own copy of the parameters with the same sum.
// Gradients of GPU workers go through host memory to the collective (which takes host floats)
// and come back to their device: correct, not yet the zero-copy path NCCL allows.
//
// Ports: input 0, the worker's gradient set; output 0, the summed set. The gang's `nccl`
// channels only join the members into one group: rank 0 has one output port of channels to
// every other member, each of which has one input from rank 0. They carry no data; after the
// all-reduce rank 0 closes its channels (an end-of-stream header each) and the others read to
// the end, so every send meets a posted receive and no member returns before its peers' last
// message.
#include "ml/programs/allreduce.h"

#include <cstring>
#include <vector>

#include "ml/programs/support.h"
#include "ml/tensor_message.h"

namespace copse::ml::programs {
namespace {

class AllReduceProgram final : public vertex::VertexProgram {
 public:
  Status Run(vertex::VertexContext& ctx) override {
    TraceSpan span(ctx);
    if (!ctx.collective) {
      return Status::FailedPrecondition(ctx.name +
                                        ": ml.allreduce runs in a gang joined by nccl channels "
                                        "(copse graph data-parallel --reducer nccl)");
    }
    COPSE_ASSIGN_OR_RETURN(chan::Buffer msg, ReadOne(ctx, 0));
    COPSE_ASSIGN_OR_RETURN(NamedTensors grads, ReadTensorMessage(msg));
    // One all-reduce over the whole set: concatenated in message order, which every worker's
    // gradient vertex writes identically.
    size_t total = 0;
    for (const auto& [name, t] : grads) total += static_cast<size_t>(t.numel());
    std::vector<float> flat(total);
    size_t at = 0;
    for (const auto& [name, t] : grads) {  // GPU workers' gradients (copse graph --device cuda) too
      t.device()->CopyToHost(flat.data() + at, t.data(), sizeof(float) * static_cast<size_t>(t.numel()));
      at += static_cast<size_t>(t.numel());
    }
    COPSE_RETURN_NOT_OK(ctx.collective->AllReduceSum(flat.data(), flat.size()));
    NamedTensors summed;  // fresh tensors: the producer's are read-only (support.h)
    summed.reserve(grads.size());
    at = 0;
    for (const auto& [name, t] : grads) {
      Tensor s = Tensor::Empty(t.shape(), t.device());
      t.device()->CopyFromHost(s.data(), flat.data() + at, sizeof(float) * static_cast<size_t>(t.numel()));
      at += static_cast<size_t>(t.numel());
      summed.emplace_back(name, std::move(s));
    }
    COPSE_RETURN_NOT_OK(ctx.output(0).Write(TensorMessage(std::move(summed))));
    COPSE_RETURN_NOT_OK(ctx.output(0).Close());
    for (size_t port = 1; port < ctx.num_outputs(); ++port) COPSE_RETURN_NOT_OK(ctx.output(port).Close());
    for (size_t port = 1; port < ctx.inputs.size(); ++port) {
      while (true) {
        COPSE_ASSIGN_OR_RETURN(auto m, ctx.inputs[port]->Next());
        if (!m) break;
      }
    }
    return Status::OK();
  }
};

}  // namespace

std::unique_ptr<vertex::VertexProgram> MakeAllReduceProgram() { return std::make_unique<AllReduceProgram>(); }

}  // namespace copse::ml::programs
