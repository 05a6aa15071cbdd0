#include "ml/models.h"

#include <cmath>
#include <sstream>

#include "ml/transformer.h"

namespace copse::ml {
namespace {

Sequential Mlp(const std::vector<int>& widths) {
  Sequential m;
  m.Add(std::make_shared<Flatten>());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const bool last = i + 2 == widths.size();
    m.Add(std::make_shared<Linear>(widths[i], widths[i + 1], last ? Activation::kNone : Activation::kRelu));
  }
  return m;
}

Sequential Cnn() {
  Sequential m;
  m.Add(std::make_shared<Conv2dLayer>(1, 16, 3, 1, 1, Activation::kRelu));
  m.Add(std::make_shared<MaxPool2dLayer>(2, 2));
  m.Add(std::make_shared<Conv2dLayer>(16, 32, 3, 1, 1, Activation::kRelu));
  m.Add(std::make_shared<MaxPool2dLayer>(2, 2));
  m.Add(std::make_shared<Flatten>());
  m.Add(std::make_shared<Linear>(32 * 7 * 7, 128, Activation::kRelu));
  m.Add(std::make_shared<Linear>(128, 10));
  return m;
}

Sequential Gpt(const GptSpec& g, TensorShard shard = {}) {
  Sequential m;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(g.layers));
  m.Add(std::make_shared<TokenEmbedding>(g.vocab, g.dim, g.context));
  m.Add(std::make_shared<DropoutLayer>(g.dropout));
  for (int i = 0; i < g.layers; ++i) {
    m.Add(std::make_shared<AttentionBlock>(g.dim, g.heads, g.dropout, proj_std, shard));
    m.Add(std::make_shared<MlpBlock>(g.dim, g.dropout, proj_std, shard));
  }
  m.Add(std::make_shared<LayerNormLayer>(g.dim));
  m.Add(std::make_shared<Linear>(g.dim, g.vocab, Activation::kNone, /*bias=*/false));
  return m;
}

}  // namespace

Result<Sequential> BuildModelLayers(const std::string& name) {
  Sequential m;
  if (name == "mlp") {
    m = Mlp({784, 1024, 1024, 10});
  } else if (name == "cnn") {
    m = Cnn();
  } else if (name.rfind("mlp:", 0) == 0) {
    std::vector<int> widths;
    std::stringstream ss(name.substr(4));
    std::string part;
    while (std::getline(ss, part, '-')) {
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 7 || std::stoi(part) == 0)
        return Status::InvalidArgument("model '" + name + "': widths must be positive integers");
      widths.push_back(std::stoi(part));
    }
    if (widths.size() < 2) return Status::InvalidArgument("model '" + name + "': needs at least two widths");
    if (widths.front() != 784 || widths.back() != 10) {
      return Status::InvalidArgument("model '" + name +
                                     "': the first width must be 784 (a 28x28 image's pixels) and the "
                                     "last 10 (its classes), as mlp:784-...-10");
    }
    m = Mlp(widths);
  } else if (IsLanguageModel(name)) {
    COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(name));
    m = Gpt(spec);
  } else {
    return Status::InvalidArgument("model '" + name + "': expected mlp, cnn, mlp:A-B-... or gpt:L-D-H-C");
  }
  return m;
}

Result<Sequential> BuildModelShardLayers(const std::string& name, int rank, int ranks) {
  if (ranks == 1) return BuildModelLayers(name);
  if (!IsLanguageModel(name))
    return Status::InvalidArgument("model '" + name +
                                   "': tensor parallelism splits gpt models only (attention heads, MLP units)");
  COPSE_ASSIGN_OR_RETURN(GptSpec spec, ParseGptSpec(name));
  if (ranks < 1 || spec.heads % ranks != 0)
    return Status::InvalidArgument("model '" + name + "': its " + std::to_string(spec.heads) + " heads cannot be split over " +
                                   std::to_string(ranks) + " tensor-parallel ranks (HEADS must be a multiple of them)");
  if (rank < 0 || rank >= ranks)
    return Status::InvalidArgument("tensor-parallel rank " + std::to_string(rank) + " is not one of " + std::to_string(ranks));
  return Gpt(spec, TensorShard{rank, ranks});
}

Result<Sequential> BuildModelShard(const std::string& name, uint64_t seed, int rank, int ranks) {
  COPSE_ASSIGN_OR_RETURN(Sequential m, BuildModelShardLayers(name, rank, ranks));
  m.InitParameters(seed);
  return m;
}

Result<Sequential> BuildModel(const std::string& name, uint64_t seed) {
  COPSE_ASSIGN_OR_RETURN(Sequential m, BuildModelLayers(name));
  m.InitParameters(seed);
  return m;
}

}  // namespace copse::ml
