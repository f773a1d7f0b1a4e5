// ONNX Runtime custom-op library: the fused MSDA node on npudet's CPU kernel.
//
//   npudet::MultiScaleDeformableAttn             (npudet.deploy.onnx_nodes, flavour "npudet")
//   mmdeploy::MMCVMultiScaleDeformableAttention  (flavour "mmdeploy"; im2col_step is ignored)
//
// Inputs: value (B, K, NH, D) float32, spatial_shapes (L, 2) and level_start_index (L,) int64
// or int32, sampling_locations (B, Q, NH, L, P, 2), attention_weights (B, Q, NH, L, P) float32
// -> (B, Q, NH * D) float32. ORT's buffers are wrapped as tensors (at::from_blob, no copy) and
// handed to msda_forward (ops/msda_cpu/msda_cpu.cpp), the kernel impl="cpu" runs, which checks
// the shapes and the level layout; its errors come back as the node's failure status.
//
// Built against ORT_API_VERSION 21 headers (onnxruntime 1.21); the API version is fixed at
// build time and any later runtime serves it (the C API only grows). The options of the
// kernel come from the build (NPUDET_ORT_KERNEL_OPTIONS, CPUKernelOptions().as_ints()).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <ATen/ATen.h>

#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "msda_cpu.h"

#ifndef NPUDET_ORT_KERNEL_OPTIONS
#error "NPUDET_ORT_KERNEL_OPTIONS must be defined (the kernel options, as a braced list)"
#endif

namespace {

const std::vector<int64_t> kOptions = NPUDET_ORT_KERNEL_OPTIONS;
constexpr const char* kInputNames[] = {"value", "spatial_shapes", "level_start_index",
                                       "sampling_locations", "attention_weights"};

// One input as a tensor over ORT's buffer: float32 or an int32 / int64 index tensor.
at::Tensor wrap(const Ort::ConstValue& input, size_t index) {
  const Ort::TensorTypeAndShapeInfo info = input.GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  at::ScalarType type;
  switch (info.GetElementType()) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: type = at::kFloat; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: type = at::kLong; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: type = at::kInt; break;
    default:
      throw std::invalid_argument(std::string(kInputNames[index]) +
                                  ": expected float32 (value, locations, weights) or "
                                  "int32 / int64 (spatial_shapes, level_start_index)");
  }
  const bool is_index = index == 1 || index == 2;
  if (is_index == (type == at::kFloat)) {
    throw std::invalid_argument(std::string(kInputNames[index]) + ": expected " +
                                (is_index ? "int32 or int64" : "float32"));
  }
  // from_blob takes a mutable pointer; the kernel only reads its inputs.
  return at::from_blob(const_cast<void*>(input.GetTensorRawData()), shape,
                       at::TensorOptions().dtype(type));
}

struct MSDAKernel {
  MSDAKernel(const OrtApi&, const OrtKernelInfo*) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) noexcept {
    try {
      Ort::KernelContext context(raw);
      if (context.GetInputCount() != 5) {
        throw std::invalid_argument("expected 5 inputs (mmcv's MSDA inputs)");
      }
      std::vector<at::Tensor> in;
      for (size_t i = 0; i < 5; ++i) in.push_back(wrap(context.GetInput(i), i));
      const at::Tensor out = npudet::msda_forward(in[0], in[1], in[2], in[3], in[4], kOptions);
      const std::vector<int64_t> shape(out.sizes().begin(), out.sizes().end());
      Ort::UnownedValue result = context.GetOutput(0, shape);
      // The kernel allocates its own output; one copy of (B, Q, NH * D) floats into ORT's.
      std::memcpy(result.GetTensorMutableData<float>(), out.const_data_ptr<float>(),
                  out.numel() * sizeof(float));
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("npudet MSDA: ") + e.what()).c_str());
    }
  }
};

// One node type; ORT matches it by domain (the CustomOpDomain it is added to) and name.
struct MSDAOp : Ort::CustomOpBase<MSDAOp, MSDAKernel, true> {
  explicit MSDAOp(const char* name) : name_(name) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info,
                              void** kernel) const noexcept {
    try {
      *kernel = new MSDAKernel(api, info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_FAIL, e.what());
    }
  }
  const char* GetName() const { return name_; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 5; }
  // UNDEFINED: any element type; ``wrap`` checks it (int32 or int64 for the level inputs).
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 || index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
                                    : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }

 private:
  const char* name_;
};

}  // namespace

// ORT's entry point (SessionOptions.register_custom_ops_library). The ops and their domains
// must outlive every session that uses them: they live as long as the library.
extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {  // an ORT older than the headers; version 1 can still say so
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "npudet's MSDA library needs onnxruntime >= 1.21 (ORT API 21)");
  }
  Ort::InitApi(api);
  static MSDAOp npudet_op("MultiScaleDeformableAttn");
  static MSDAOp mmdeploy_op("MMCVMultiScaleDeformableAttention");
  // Each session registers anew; its domains are kept for the life of the process (two
  // small objects per session), as ORT holds only pointers to them.
  static std::mutex mutex;
  static std::vector<Ort::CustomOpDomain> domains;
  try {
    std::lock_guard<std::mutex> lock(mutex);
    Ort::CustomOpDomain npudet("npudet");
    npudet.Add(&npudet_op);
    Ort::CustomOpDomain mmdeploy("mmdeploy");
    mmdeploy.Add(&mmdeploy_op);
    Ort::UnownedSessionOptions session(options);
    session.Add(npudet);
    session.Add(mmdeploy);
    domains.push_back(std::move(npudet));
    domains.push_back(std::move(mmdeploy));
    return nullptr;
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
}
