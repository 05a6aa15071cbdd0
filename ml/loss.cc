#include "ml/loss.h"

#include "ml/ops.h"

namespace copse::ml {

Result<LossOutput> CrossEntropyLoss(const Tensor& logits, std::span<const int32_t> labels, int64_t normalizer) {
  if (logits.ndim() != 2)
    return Status::InvalidArgument("cross-entropy: logits must be [N, C], got " + ShapeToString(logits.shape()));
  const int64_t rows = logits.dim(0);
  if (normalizer <= 0) normalizer = rows;
  COPSE_ASSIGN_OR_RETURN(CrossEntropyResult r, SoftmaxCrossEntropy(logits, labels, 1.0f / static_cast<float>(normalizer)));
  LossOutput out;
  out.loss = rows > 0 ? r.loss_sum / static_cast<double>(rows) : 0.0;
  out.grad = std::move(r.grad);
  return out;
}

int64_t CountCorrect(const Tensor& logits, std::span<const int32_t> labels) {
  const std::vector<int32_t> pred = ArgmaxRows(logits);
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size() && i < labels.size(); ++i) correct += pred[i] == labels[i];
  return correct;
}

}  // namespace copse::ml
