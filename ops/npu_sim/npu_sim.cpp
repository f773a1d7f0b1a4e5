// A simulated Ascend device: PyTorch's PrivateUse1 backend (the key torch_npu registers and
// renames "npu") with host memory behind it and CPU arithmetic. It proves device glue: tensors
// that live on another device type, dispatch through PrivateUse1 / AutogradPrivateUse1 /
// AutocastPrivateUse1 as torch_npu's do, copies across the device boundary, checkpoints that
// carry the device, a device guard and events. It proves nothing about NPU speed or numerics.
//
// What it registers (the pieces PyTorch's own out-of-tree test backend, OpenReg, registers):
// - an allocator on host memory that tags each block with its device and counts bytes per
//   device (torch.npu.memory_allocated and friends read the counters), and a pinned host
//   allocator (tensor.pin_memory(), non_blocking copies to the host) that remembers its blocks;
// - a device guard (current device and current stream per thread; streams have ids but run in
//   order, since every op here completes before it returns; events record the host's clock);
// - the hooks interface (availability, device count, pinned memory, one generator per device);
// - the kernels that must know the device: empty, empty_strided, the view ops, copies,
//   resize_, set_, record_stream, native_dropout; every other aten op goes through
//   at::native::cpu_fallback (inputs copied to CPU, the CPU kernel run, results and mutated
//   arguments copied back), with the device's generator lent to the CPU kernels that draw;
//   an op that torch_npu has no NPU kernel for (the list the Python stand-in passes in) is
//   counted and warned about with torch_npu's own CAUTION text, once per op, as its
//   npu_cpu_fallback does: on a real NPU that op round-trips through the host;
// - torch_npu's fork rule: a forked child that touches the device raises at once;
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
#include <ATen/core/jit_type.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <pthread.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
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
// Fork: torch_npu registers an at-fork handler that marks a forked child as unable to use the
// device, and its lazy init raises there. A child here could run the CPU kernels, but it would
// share the parent's allocator state and OpenMP pool (a forked OpenMP pool can hang), and code
// that works here must fail on the device as it does on Ascend: every entry raises at once.

std::atomic<bool> in_bad_fork{false};

void check_not_forked() {
  TORCH_CHECK(!in_bad_fork.load(),
              "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
              "you must use the 'spawn' start method");
}

const bool fork_handler_registered = [] {
  pthread_atfork(nullptr, nullptr, [] { in_bad_fork.store(true); });
  return true;
}();

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
    check_not_forked();
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

// Pinned host memory: ordinary host memory (the device reads host memory anyway) whose blocks
// are remembered, so that is_pinned() answers for them and for views into them, as on the device.
std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned_blocks;  // start -> size

void release_pinned(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_blocks.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  c10::free_cpu(ptr);
}

bool is_pinned_ptr(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto it = pinned_blocks.upper_bound(address);
  if (it == pinned_blocks.begin()) return false;
  --it;
  return address < it->first + std::max<size_t>(it->second, 1);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_blocks.emplace(reinterpret_cast<uintptr_t>(data), nbytes);
    }
    return {data, data, &release_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

// ---------------------------------------------------------------------------------------------
// Device guard: every op completes before it returns, so streams are ids that keep no queue
// (a new stream gets a new id; each thread has a current stream per device) and an event is
// complete as soon as it is recorded. A recorded event holds the host's clock, so elapsed_time
// measures the wall time between two records, which on this synchronous device is the time of
// the work in between.

thread_local std::array<c10::StreamId, kMaxDevices> current_streams{};
std::atomic<c10::StreamId> next_stream_id{1};

struct SimEvent {
  bool timing;
  std::chrono::steady_clock::time_point recorded_at;
};

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
    const auto index = d.has_index() ? d.index() : current_device;
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, index), current_streams[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, next_stream_id++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    current_streams[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return configured_device_count(); }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    // Work before the record has completed: the event holds the time it completed.
    if (*event == nullptr) *event = new SimEvent{flag == c10::EventFlag::BACKEND_DEFAULT, {}};
    static_cast<SimEvent*>(*event)->recorded_at = std::chrono::steady_clock::now();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    // The messages of CUDA's and torch_npu's events.
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    const auto* first = static_cast<SimEvent*>(start);
    const auto* second = static_cast<SimEvent*>(end);
    TORCH_CHECK(first->timing && second->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(second->recorded_at - first->recorded_at)
        .count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---------------------------------------------------------------------------------------------
// Generators: one per device, apart from the CPU's, as on torch_npu. The device's generator is
// CPU's Mersenne Twister (OpenReg's pattern) tagged with the device; the fallback lends its
// state to the CPU kernels that draw (random_state_lent below), so npu draws advance it and
// never the CPU's generator. The numbers are not the NPU's (torch_npu uses Philox).

struct NpuGenerator final : at::CPUGeneratorImpl {
  explicit NpuGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(kNpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<NpuGenerator>(index < 0 ? current_device : index);
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::array<at::Generator, kMaxDevices> generators;
  static std::array<std::once_flag, kMaxDevices> created;
  if (index < 0) index = current_device;
  check_index(index);
  std::call_once(created[index], [index] { generators[index] = new_generator(index); });
  return generators[index];
}

// ---------------------------------------------------------------------------------------------
// Hooks.

struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return new_generator(index);
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
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
  // Both sides are host memory: CPU's copy_ handles dtypes, strides and broadcasting. A
  // non_blocking copy has completed when it returns, as every op here.
  check_not_forked();
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

// The device of an op's first npu tensor argument, else the current device.
c10::DeviceIndex op_device(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    const auto& value = stack[i];
    if (value.isTensor() && value.toTensor().defined() &&
        value.toTensor().device().type() == kNpu) {
      return value.toTensor().device().index();
    }
  }
  return current_device;
}

bool is_generator_argument(const c10::Argument& argument) {
  const auto& type = argument.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

// One lock for every lent generator: a CPU kernel draws from a host copy of the device
// generator's state, which is written back after it; two at once would draw the same numbers.
std::mutex random_mutex;

// torch_npu's CPU fallbacks. The stand-in passes the aten ops torch_npu registers NPU kernels
// for (npu_kernels.txt); an op reaching the fallback outside that list would reach torch_npu's
// npu_cpu_fallback on a real NPU. Each op's answer is cached by its name, so the cost per op
// is one hash lookup.
struct FallbackEntry {
  bool npu_kernel;
  std::string name;  // aten::name.overload, as torch_npu's warning prints it
  int64_t count = 0;
  bool warned = false;
};
std::mutex fallback_mutex;
std::unordered_set<std::string> npu_kernels;  // empty: no list given, nothing reported
std::unordered_map<c10::OperatorName, FallbackEntry> fallback_entries;

void note_cpu_fallback(const c10::OperatorHandle& op) {
  std::string warn;
  {
    std::lock_guard<std::mutex> lock(fallback_mutex);
    if (npu_kernels.empty()) return;
    auto found = fallback_entries.find(op.operator_name());
    if (found == fallback_entries.end()) {
      auto name = c10::toString(op.operator_name());
      const bool npu_kernel = npu_kernels.count(name) > 0;
      FallbackEntry entry{npu_kernel, std::move(name)};
      found = fallback_entries.emplace(op.operator_name(), std::move(entry)).first;
    }
    auto& entry = found->second;
    if (entry.npu_kernel) return;
    ++entry.count;
    if (entry.warned) return;
    entry.warned = true;  // once per op and process, as torch_npu's has_op_name_warned
    warn = entry.name;
  }
  // torch_npu's TORCH_NPU_WARN: a c10 UserWarning (a Python UserWarning where Python called).
  TORCH_WARN("CAUTION: The operator '", warn, "' is not currently supported ",
             "on the NPU backend and will fall back to run on the CPU.",
             " This may have performance implications.");
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_not_forked();
  note_cpu_fallback(op);
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::vector<std::pair<at::Generator, at::Generator>> lent;  // (device's, host copy)
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!is_generator_argument(arguments[i])) continue;
    auto& value = (*stack)[first + i];
    at::Generator device_generator = value.isNone()
                                         ? default_generator(op_device(*stack, first))
                                         : value.toGenerator();
    // CUDA's check_generator message, for a CPU generator passed to an npu op.
    TORCH_CHECK(device_generator.device().type() == kNpu,
                "Expected a 'npu' device type for generator but found '",
                device_generator.device().type(), "'");
    lent.emplace_back(device_generator, at::make_generator<at::CPUGeneratorImpl>());
    value = c10::IValue(lent.back().second);
  }
  if (lent.empty()) {
    at::native::cpu_fallback(op, stack);
    return;
  }
  std::lock_guard<std::mutex> lock(random_mutex);
  for (auto& [device_generator, host] : lent) host.set_state(device_generator.get_state());
  at::native::cpu_fallback(op, stack);
  for (auto& [device_generator, host] : lent) device_generator.set_state(host.get_state());
}

// CPU's native_dropout draws its mask from the CPU generator without taking one as an argument:
// the same arithmetic here, with bernoulli_ on the device, so the mask comes from the device's.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  auto mask = at::empty_like(input, at::MemoryFormat::Contiguous);
  mask.bernoulli_(keep);
  return {input.mul(mask).mul_(scale), mask};
}

// No caching allocator: a block is free when its last tensor goes, whatever stream used it.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNpu, "record_stream: expected an npu stream, got ",
              stream);
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

// A structured op's functional and in-place forms (add.Tensor, add_.Tensor) reach a backend
// without its own kernel through a composite kernel that calls the out= form (add.out). Where
// torch_npu has a kernel for the form called, so does the device, running it through the CPU
// fallback as a whole: the op seen and counted is the one a real NPU runs.
std::unique_ptr<torch::Library> npu_kernel_library;

// The fallback puts results on its first tensor argument's device, which for these ops may
// be a CPU scalar (mul(cpu_scalar_tensor, npu_tensor)); torch_npu's kernels, as the composite
// kernel did, put them on the npu input's device. And the fallback runs anything on the CPU:
// a tensor argument on another device, other than a CPU scalar, is refused as the composite
// kernel's TensorIterator refused it (index lists, Tensor?[], may stay on the CPU).
void structured_npu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  std::optional<c10::Device> device;
  for (size_t i = first; i < stack->size() && !device; ++i) {
    const auto& value = (*stack)[i];
    if (value.isTensor() && value.toTensor().defined() &&
        value.toTensor().device().type() == kNpu) {
      device = value.toTensor().device();
    }
  }
  for (size_t i = first; device && i < stack->size(); ++i) {
    const auto& value = (*stack)[i];
    if (!value.isTensor() || !value.toTensor().defined()) continue;
    const auto& tensor = value.toTensor();
    TORCH_CHECK(tensor.device() == *device || (tensor.is_cpu() && tensor.dim() == 0),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                *device, " and ", tensor.device(), "!");
  }
  fallback(op, stack);
  if (!device) return;
  const size_t returns = op.schema().returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    auto& value = (*stack)[i];
    if (value.isTensor() && value.toTensor().defined() && value.toTensor().is_cpu()) {
      value = c10::IValue(value.toTensor().to(*device));
    }
  }
}

void register_structured_npu_kernels(const std::vector<std::string>& names) {
  npu_kernel_library.reset();  // unregisters an earlier list's kernels
  npu_kernel_library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  const std::string prefix = "aten::";
  for (const auto& name : names) {
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dot = name.find('.');
    const auto base = name.substr(0, dot);
    const auto overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    const auto op = c10::Dispatcher::singleton().findOp({base, overload});
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    npu_kernel_library->impl(name.substr(prefix.size()).c_str(),
                             torch::CppFunction::makeFromBoxedFunction<&structured_npu_kernel>());
  }
}

void set_npu_kernels(std::vector<std::string> names) {
  {
    std::lock_guard<std::mutex> lock(fallback_mutex);
    npu_kernels = std::unordered_set<std::string>(names.begin(), names.end());
    fallback_entries.clear();
  }
  register_structured_npu_kernels(names);
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> cpu_fallbacks() {
  std::lock_guard<std::mutex> lock(fallback_mutex);
  std::vector<std::string> names;
  std::vector<int64_t> counts;
  for (const auto& [op_name, entry] : fallback_entries) {
    if (entry.count == 0) continue;
    names.push_back(entry.name);
    counts.push_back(entry.count);
  }
  return {names, counts};
}

// The counts only: the warnings stay once per process, as torch_npu's.
void reset_cpu_fallbacks() {
  std::lock_guard<std::mutex> lock(fallback_mutex);
  for (auto& [op_name, entry] : fallback_entries) entry.count = 0;
}

int64_t device_count() { return configured_device_count(); }
bool is_in_bad_fork() { return in_bad_fork.load(); }
at::Generator get_default_generator(int64_t device) {
  return default_generator(static_cast<c10::DeviceIndex>(device));
}
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
  m.def("is_in_bad_fork() -> bool", &is_in_bad_fork);
  m.def("default_generator(int device) -> Generator?", &get_default_generator);
  m.def("current_device() -> int", &get_current_device);
  m.def("set_device(int device) -> ()", &set_current_device);
  m.def("set_npu_kernels(str[] names) -> ()", &set_npu_kernels);
  m.def("cpu_fallbacks() -> (str[], int[])", &cpu_fallbacks);
  m.def("reset_cpu_fallbacks() -> ()", &reset_cpu_fallbacks);
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
  m.impl("native_dropout", &native_dropout);
  m.impl("record_stream", &record_stream);
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
