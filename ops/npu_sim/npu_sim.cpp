// A simulated Ascend device: PyTorch's PrivateUse1 backend (the key torch_npu registers and
// renames "npu") with host memory behind it and CPU arithmetic. It proves device glue: tensors
// that live on another device type, dispatch through PrivateUse1 / AutogradPrivateUse1 /
// AutocastPrivateUse1 as torch_npu's do, copies across the device boundary, checkpoints that
// carry the device, a device guard and events. It proves nothing about NPU speed or numerics.
//
// What it registers (the pieces PyTorch's own out-of-tree test backend, OpenReg, registers):
// - an allocator on host memory that tags each block with its device and counts bytes per
//   device (torch.npu.memory_allocated and friends read the counters);
// - a device guard (current device per thread; one default stream per device; events that
//   are recorded at once, since every op here completes before it returns);
// - the hooks interface (availability, device count, the default generator);
// - the kernels that must know the device: empty, empty_strided, the view ops, copies,
//   resize_ and set_; every other aten op goes through at::native::cpu_fallback (inputs copied
//   to CPU, the CPU kernel run, results and mutated arguments copied back);
// - autocast for the device with CUDA's op lists (torch_npu keeps the same lists).
// Operators under npu_sim:: expose the counters and the current device to the Python stand-in;
// nothing here includes Python.

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 16;

c10::DeviceIndex configured_device_count() {
  // NPUDET_SIMULATED_NPU_COUNT devices (default 8, an Atlas 800 server's count).
  static const c10::DeviceIndex count = [] {
    const char* env = std::getenv("NPUDET_SIMULATED_NPU_COUNT");
    int n = env ? std::atoi(env) : 8;
    return static_cast<c10::DeviceIndex>(n < 1 ? 1 : (n > kMaxDevices ? kMaxDevices : n));
  }();
  return count;
}

thread_local c10::DeviceIndex current_device = 0;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < configured_device_count(), "npu device index ", int(index),
              " out of range: the simulated NPU has ", int(configured_device_count()),
              " devices (NPUDET_SIMULATED_NPU_COUNT)");
}

// ---------------------------------------------------------------------------------------------
// Allocator: host memory, tagged with the device, counted per device.

struct DeviceCounters {
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t allocations = 0;
};

std::mutex counters_mutex;
std::array<DeviceCounters, kMaxDevices> counters;
std::unordered_map<void*, std::pair<c10::DeviceIndex, size_t>> live_blocks;

void release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(counters_mutex);
    auto it = live_blocks.find(ptr);
    if (it != live_blocks.end()) {
      counters[it->second.first].allocated -= static_cast<int64_t>(it->second.second);
      live_blocks.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = current_device;
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(counters_mutex);
      live_blocks.emplace(data, std::make_pair(index, nbytes));
      auto& c = counters[index];
      c.allocated += static_cast<int64_t>(nbytes);
      c.peak = std::max(c.peak, c.allocated);
      c.allocations += 1;
    }
    return {data, data, &release, c10::Device(kNpu, index)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }
};

HostAllocator host_allocator;
REGISTER_ALLOCATOR(kNpu, &host_allocator);

// ---------------------------------------------------------------------------------------------
// Device guard: every op completes before it returns, so one stream per device suffices and
// an event is complete as soon as it is recorded.

struct NpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNpu, current_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNpu, "expected an npu device, got ", d);
    check_index(d.index());
    current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return configured_device_count(); }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    // A non-null handle marks the event as recorded; there is nothing to wait for.
    *event = reinterpret_cast<void*>(1);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override { return 0.0; }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---------------------------------------------------------------------------------------------
// Hooks. Random ops run through the CPU fallback and draw from the CPU generator, so that is
// the device's default generator too (the Python stand-in seeds it).

struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void* ptr) const override {
    std::lock_guard<std::mutex> lock(counters_mutex);
    auto it = live_blocks.find(ptr);
    return at::Device(kNpu, it == live_blocks.end() ? current_device : it->second.first);
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return configured_device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_index(d);
    current_device = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

NpuHooks hooks;
const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

// ---------------------------------------------------------------------------------------------
// Kernels that must know the device.

// A CPU tensor over the same host memory as ``t`` (no copy, not owning: ``t`` outlives it).
at::Tensor host_view(const at::Tensor& t) {
  if (t.device().type() != kNpu) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

c10::DeviceIndex target_index(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    check_index(device->index());
    return device->index();
  }
  return current_device;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout,
                               std::optional<at::Device> device, std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::Device(kNpu, target_index(device)));
  return at::detail::empty_generic(size, &host_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(c10::Device(kNpu, target_index(device)));
  return at::detail::empty_strided_generic(size, stride, &host_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // Both sides are host memory: CPU's copy_ handles dtypes, strides and broadcasting.
  if (self.numel() == 0) return dst;
  host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());
  // CPU's resize grows a storage through the storage's own allocator: this device's.
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const int64_t elements = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return at::native::set_storage_cpu_(self, source, 0, {elements}, {});
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source,
                                      c10::SymInt storage_offset, c10::SymIntArrayRef size,
                                      c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, storage_offset.guard_int(__FILE__, __LINE__),
                                      C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &host_allocator, true);
  return set_source_storage(self, storage);
}

// Convolution reaches an out-of-tree device as convolution_overrideable, whose default kernel
// raises: run CPU's convolution on the host memory and copy the result to the device.
at::Tensor on_device(const at::Tensor& t, const at::Device& device) {
  return t.defined() ? t.to(device) : t;
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding,
                                    c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> host_bias;
  if (bias.has_value() && bias->defined()) host_bias = host_view(*bias);
  auto out = at::convolution(host_view(input), host_view(weight), host_bias, stride, padding,
                             dilation, transposed, output_padding, groups);
  return on_device(out, input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  auto grads = at::convolution_backward(host_view(grad_output), host_view(input),
                                        host_view(weight), c10::IntArrayRef{channels}, stride,
                                        padding, dilation, transposed, output_padding, groups,
                                        output_mask);
  const auto device = input.device();
  return {on_device(std::get<0>(grads), device), on_device(std::get<1>(grads), device),
          on_device(std::get<2>(grads), device)};
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

// ---------------------------------------------------------------------------------------------
// Operators for the Python stand-in.

std::vector<int64_t> memory_stats(int64_t device) {
  check_index(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(counters_mutex);
  const auto& c = counters[device];
  return {c.allocated, c.peak, c.allocations};
}

void reset_peak_memory_stats(int64_t device) {
  check_index(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(counters_mutex);
  counters[device].peak = counters[device].allocated;
}

int64_t device_count() { return configured_device_count(); }
int64_t get_current_device() { return current_device; }
void set_current_device(int64_t device) {
  check_index(static_cast<c10::DeviceIndex>(device));
  current_device = static_cast<c10::DeviceIndex>(device);
}

}  // namespace

TORCH_LIBRARY(npu_sim, m) {
  m.def("memory_stats(int device) -> int[]", &memory_stats);
  m.def("reset_peak_memory_stats(int device) -> ()", &reset_peak_memory_stats);
  m.def("device_count() -> int", &device_count);
  m.def("current_device() -> int", &get_current_device);
  m.def("set_device(int device) -> ()", &set_current_device);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("resize_", &resize_);
  m.impl("set_.source_Storage", &set_source_storage);
  m.impl("set_.source_Storage_storage_offset", &set_source_storage_offset);
  m.impl("set_", &set_empty);
  m.impl("convolution_overrideable", &convolution_overrideable);
  m.impl("convolution_backward_overrideable", &convolution_backward_overrideable);
  // View ops alias their input's storage, which the copying fallback cannot do.
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
  m.impl("view_as_real", &at::native::view_as_real);
  m.impl("view_as_complex", &at::native::view_as_complex);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// Autocast on the device: CUDA's policy lists, as torch_npu registers them for its device.
namespace at::autocast {
#define NPUDET_SIM_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NPUDET_SIM_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NPUDET_SIM_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NPUDET_SIM_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

// Ops outside the lists run as they are (torch registers this fallthrough for its own devices,
// not for PrivateUse1).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NPUDET_SIM_LOWER)
  AT_FORALL_FP32(NPUDET_SIM_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NPUDET_SIM_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NPUDET_SIM_PROMOTE)
}
}  // namespace at::autocast
