#include "ml/dtype.h"

namespace copse::ml {

const char* DTypeName(DType t) { return t == DType::kBFloat16 ? "bfloat16" : t == DType::kFloat16 ? "float16" : "float32"; }

const char* PrecisionName(Precision p) { return p == Precision::kBFloat16 ? "bf16" : p == Precision::kFloat16 ? "fp16" : "fp32"; }

Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16") return Precision::kFloat16;
  return Status::InvalidArgument("precision '" + name + "': expected fp32, bf16 or fp16");
}

}  // namespace copse::ml
