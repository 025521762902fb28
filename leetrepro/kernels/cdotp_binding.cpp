// Python binding of the CUDA causal-dot-product kernel (cdotp.cu).
// The stream comes from Python (torch.cuda.current_stream().cuda_stream), so this file needs only
// the CPU-side headers: the tensor, the one op it calls and pybind11's tensor casters, not
// <torch/extension.h> (all of the C++ frontend: 2.4x the parse time).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

namespace cdotp {
int cdotp_forward(int dtype, const void* B, const void* C, const void* V, void* O,
                  const double* gamma, int64_t BH, int64_t N, int R, int D, int H, void* stream);
int cdotp_max_rank();
}  // namespace cdotp

static at::Tensor forward(at::Tensor B, at::Tensor C, at::Tensor V,
                         c10::optional<at::Tensor> gamma, int64_t stream) {
  TORCH_CHECK(B.is_cuda() && C.is_cuda() && V.is_cuda(), "Cdotp: inputs must be CUDA tensors");
  TORCH_CHECK(B.is_contiguous() && C.is_contiguous() && V.is_contiguous(),
              "Cdotp: inputs must be contiguous");
  TORCH_CHECK(B.dim() == 4 && C.sizes() == B.sizes() && V.dim() == 4, "Cdotp: bad shapes");
  TORCH_CHECK(B.size(3) <= cdotp::cdotp_max_rank(), "Cdotp: rank r = ", B.size(3),
              " exceeds the kernel's maximum of ", cdotp::cdotp_max_rank());
  int dtype = -1;
  if (V.scalar_type() == at::kFloat) dtype = 0;
  if (V.scalar_type() == at::kHalf) dtype = 1;
  if (V.scalar_type() == at::kBFloat16) dtype = 2;
  TORCH_CHECK(dtype >= 0, "Cdotp: dtype must be float32, float16 or bfloat16");
  const double* g = nullptr;
  if (gamma.has_value()) {
    TORCH_CHECK(gamma->is_cuda() && gamma->scalar_type() == at::kDouble &&
                    gamma->is_contiguous() && gamma->numel() == B.size(1),
                "Cdotp: gamma must be a contiguous float64 CUDA tensor of shape (heads,)");
    g = gamma->data_ptr<double>();
  }
  auto O = at::empty_like(V);
  const int err = cdotp::cdotp_forward(
      dtype, B.data_ptr(), C.data_ptr(), V.data_ptr(), O.data_ptr(), g, B.size(0) * B.size(1),
      B.size(2), static_cast<int>(B.size(3)), static_cast<int>(V.size(3)),
      static_cast<int>(B.size(1)), reinterpret_cast<void*>(stream));
  TORCH_CHECK(err == 0, "Cdotp kernel launch failed with cudaError ", err);
  return O;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "causal-dot-product forward (CUDA)");
}
