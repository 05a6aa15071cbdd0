#include "ml/dtype.h"

namespace copse::ml {

const char* DTypeName(DType t) { return t == DType::kBFloat16 ? "bfloat16" : "float32"; }

const char* PrecisionName(Precision p) { return p == Precision::kBFloat16 ? "bf16" : "fp32"; }

Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16")
    return Status::InvalidArgument(
        "precision fp16 needs dynamic loss scaling on a GPU, which copse does not have yet; use bf16 (the same range as fp32)");
  return Status::InvalidArgument("precision '" + name + "': expected fp32 or bf16");
}

}  // namespace copse::ml
