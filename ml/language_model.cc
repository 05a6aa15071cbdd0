#include "ml/language_model.h"

#include <cmath>

#include "ml/loss.h"
#include "ml/philox.h"
#include "ml/text_corpus.h"

namespace copse::ml {

Result<double> EvaluateLoss(const Sequential& model, const Dataset& data, int64_t batch) {
  if (data.size() == 0) return Status::InvalidArgument("no text to evaluate on");
  double sum = 0;
  int64_t rows = 0;
  for (int64_t b = 0; b < data.size(); b += batch) {
    const Batch x = data.Range(b, std::min(data.size(), b + batch), model.device());
    COPSE_ASSIGN_OR_RETURN(Tensor logits, model.Predict(x.images));
    COPSE_ASSIGN_OR_RETURN(LossOutput loss, CrossEntropyLoss(logits, x.labels));
    sum += loss.loss * static_cast<double>(x.size());
    rows += x.size();
  }
  return sum / static_cast<double>(rows);
}

Result<std::string> GenerateText(const Sequential& model, int context, const std::string& prompt, int length, float temperature,
                                 uint64_t seed) {
  if (prompt.empty()) return Status::InvalidArgument("GenerateText: the prompt must have at least one byte");
  if (context < 1) return Status::InvalidArgument("GenerateText: context must be >= 1");
  std::vector<float> ids = EncodeBytes(prompt);
  std::string out;
  for (int i = 0; i < length; ++i) {
    const size_t t = std::min(ids.size(), static_cast<size_t>(context));
    const std::vector<float> window(ids.end() - static_cast<ptrdiff_t>(t), ids.end());
    const Tensor x = Tensor::FromVector({1, static_cast<int64_t>(t)}, window, model.device());
    COPSE_ASSIGN_OR_RETURN(Tensor logits, model.Predict(x));
    const int64_t vocab = logits.dim(-1);
    const std::vector<float> all = logits.ToVector();
    const float* last = all.data() + (static_cast<int64_t>(t) - 1) * vocab;
    int next = 0;
    if (temperature <= 0.0f) {
      for (int64_t v = 1; v < vocab; ++v)
        if (last[v] > last[next]) next = static_cast<int>(v);
    } else {
      float mx = last[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, last[v]);
      std::vector<double> p(static_cast<size_t>(vocab));
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += (p[static_cast<size_t>(v)] = std::exp((last[v] - mx) / temperature));
      double u = PhiloxUniform(seed, 0, static_cast<uint64_t>(i)) * sum;
      next = static_cast<int>(vocab - 1);
      for (int64_t v = 0; v < vocab; ++v) {
        u -= p[static_cast<size_t>(v)];
        if (u < 0) {
          next = static_cast<int>(v);
          break;
        }
      }
    }
    ids.push_back(static_cast<float>(next));
    out += static_cast<char>(static_cast<unsigned char>(next));
  }
  return out;
}

}  // namespace copse::ml
