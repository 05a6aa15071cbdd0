#include "ml/onednn_gemm.h"

#ifdef COPSE_HAVE_ONEDNN
#include <omp.h>

#include <map>
#include <optional>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#endif

namespace copse::ml::internal {

#ifdef COPSE_HAVE_ONEDNN

bool OneDnnGemmBuilt() { return true; }

namespace {

using dnnl::memory;

// What makes two products need different primitives: operand type, shape, transposes, leading
// dimensions (the strides of the memory descriptors), the scale alpha and whether C is
// accumulated into.
using Shape = std::tuple<DType, bool, bool, int, int, int, int, int, int, float, bool>;

struct Product {
  dnnl::matmul primitive;
  memory a, b, c;     // their descriptors, kept; each product only points them at its data
  memory scratchpad;  // the primitive's own, kept: no allocation per product
};

// One per thread: a stream is not thread-safe, and oneDNN's OpenMP threading is set to the
// calling thread only (omp_set_num_threads is per thread), before the first primitive is built.
class ThreadProducts {
 public:
  ThreadProducts() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) { omp_set_num_threads(1); }

  /// False when oneDNN has no matmul for this shape and these strides.
  bool Run(const Shape& shape, const void* a, const void* b, float* c) {
    auto it = products_.find(shape);
    if (it == products_.end()) {
      if (products_.size() >= kMaxProducts) products_.clear();  // a bound, not an LRU: shapes are few
      it = products_.emplace(shape, Build(shape)).first;
    }
    if (!it->second) return false;
    Product& p = *it->second;
    p.a.set_data_handle(const_cast<void*>(a));
    p.b.set_data_handle(const_cast<void*>(b));
    p.c.set_data_handle(c);
    p.primitive.execute(stream_,
                        {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}, {DNNL_ARG_SCRATCHPAD, p.scratchpad}});
    stream_.wait();
    return true;
  }

 private:
  static constexpr size_t kMaxProducts = 256;

  std::optional<Product> Build(const Shape& shape) const try {
    const auto [operands, ta, tb, m, n, k, lda, ldb, ldc, alpha, accumulate] = shape;
    const auto in = operands == DType::kBFloat16 ? memory::data_type::bf16 : memory::data_type::f32;
    // Row-major op(A) is m x k: element (i, l) at i*lda + l, or l*lda + i when transposed.
    const memory::desc a({m, k}, in, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
    const memory::desc b({k, n}, in, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    const memory::desc c({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});  // alpha * (A B), then the sum below
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    return Product{dnnl::matmul(pd), memory(a, engine_, DNNL_MEMORY_NONE), memory(b, engine_, DNNL_MEMORY_NONE),
                   memory(c, engine_, DNNL_MEMORY_NONE), memory(pd.scratchpad_desc(), engine_)};
  } catch (const dnnl::error&) {
    return std::nullopt;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Shape, std::optional<Product>> products_;
};

}  // namespace

bool OneDnnGemm(DType operands, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                const void* b, int ldb, float beta, float* c, int ldc) {
  if (beta != 0.0f && beta != 1.0f) return false;
  thread_local ThreadProducts products;
  return products.Run(Shape{operands, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta == 1.0f}, a, b, c);
}

#else  // !COPSE_HAVE_ONEDNN

bool OneDnnGemmBuilt() { return false; }

bool OneDnnGemm(DType, bool, bool, int, int, int, float, const void*, int, const void*, int, float, float*, int) { return false; }

#endif

}  // namespace copse::ml::internal
