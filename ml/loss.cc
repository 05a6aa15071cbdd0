#include "ml/loss.h"

#include "ml/ops.h"

namespace copse::ml {

Result<LossOutput> CrossEntropyLoss(const Tensor& logits, std::span<const int32_t> labels, int64_t normalizer) {
  if (logits.ndim() < 2 || logits.dim(-1) < 1)
    return Status::InvalidArgument("cross-entropy: logits must be [N, C] or [..., C], got " + ShapeToString(logits.shape()));
  const int64_t rows = logits.numel() / logits.dim(-1);
  const Tensor flat = logits.ndim() == 2 ? logits : logits.Reshape({rows, logits.dim(-1)});
  if (normalizer <= 0) normalizer = rows;
  COPSE_ASSIGN_OR_RETURN(CrossEntropyResult r, SoftmaxCrossEntropy(flat, labels, 1.0f / static_cast<float>(normalizer)));
  LossOutput out;
  out.loss = rows > 0 ? r.loss_sum / static_cast<double>(rows) : 0.0;
  out.grad = logits.ndim() == 2 ? std::move(r.grad) : r.grad.Reshape(logits.shape());
  return out;
}

int64_t CountCorrect(const Tensor& logits, std::span<const int32_t> labels) {
  const std::vector<int32_t> pred = ArgmaxRows(logits);
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size() && i < labels.size(); ++i) correct += pred[i] == labels[i];
  return correct;
}

}  // namespace copse::ml
