// npudet_aoti_run: runs an AOTInductor package (.pt2) with no Python.
//
//   npudet_aoti_run [--load-library LIB.so]... MODEL.pt2 INPUTS.pt OUTPUTS.pt
//
// Each --load-library is dlopen'ed first: an operator library registers its operators with
// the dispatcher when it loads (TORCH_LIBRARY), and the package's calls to operators that
// AOTInductor has no C shim for (npudet::msda_cpu_forward) go through the dispatcher by
// schema. INPUTS.pt is Python's torch.save(list_of_tensors); OUTPUTS.pt is written with
// torch::pickle_save as a tuple of tensors, which Python's torch.load reads.
//
// Built and run by npudet.deploy.aoti (ops/aoti_runner/README.md).

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>

namespace {

constexpr const char* kUsage =
    "usage: npudet_aoti_run [--load-library LIB.so]... MODEL.pt2 INPUTS.pt OUTPUTS.pt";

struct Args {
  std::vector<std::string> libraries;
  std::string model, inputs, outputs;
};

// Exits with status 2 and one line on stderr.
[[noreturn]] void fail_usage(const std::string& why) {
  std::fprintf(stderr, "npudet_aoti_run: %s (%s)\n", why.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--load-library") {
      if (i + 1 >= argc) fail_usage("--load-library needs a path");
      args.libraries.emplace_back(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      fail_usage("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 3) {
    fail_usage("expected 3 paths, got " + std::to_string(positional.size()));
  }
  args.model = positional[0];
  args.inputs = positional[1];
  args.outputs = positional[2];
  return args;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// torch.save(list) gives a generic list of tensors (a tuple is accepted too).
std::vector<at::Tensor> load_inputs(const std::string& path) {
  const c10::IValue value = torch::jit::pickle_load(read_bytes(path));
  if (value.isTensorList()) return value.toTensorVector();
  std::vector<c10::IValue> elements;
  if (value.isList()) {
    elements = value.toListRef().vec();
  } else if (value.isTuple()) {
    elements = value.toTupleRef().elements().vec();
  } else {
    throw std::runtime_error(path + ": expected a list of tensors");
  }
  std::vector<at::Tensor> tensors;
  for (const auto& element : elements) {
    if (!element.isTensor()) throw std::runtime_error(path + ": an element is not a tensor");
    tensors.push_back(element.toTensor());
  }
  return tensors;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  for (const auto& library : args.libraries) {
    // RTLD_GLOBAL: the operator library's symbols serve libraries loaded after it.
    if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::fprintf(stderr, "npudet_aoti_run: cannot load %s: %s\n", library.c_str(), dlerror());
      return 1;
    }
  }
  try {
    // The loader's own message for a missing file is "Failed to initialize zip archive".
    if (!std::ifstream(args.model)) throw std::runtime_error("cannot read " + args.model);
    torch::inductor::AOTIModelPackageLoader loader(args.model);
    const std::vector<at::Tensor> outputs = loader.run(load_inputs(args.inputs));
    // A tuple, not a c10::List<Tensor>: a tensor list pickles as
    // torch.jit._pickle.build_tensorlist, which torch.load(weights_only=True) refuses.
    std::vector<c10::IValue> elements(outputs.begin(), outputs.end());
    write_bytes(args.outputs, torch::jit::pickle_save(c10::ivalue::Tuple::create(elements)));
  } catch (const std::exception& exc) {
    // c10::Error's what() holds a backtrace: the first line says what went wrong.
    std::string what = exc.what();
    what = what.substr(0, what.find('\n'));
    std::fprintf(stderr, "npudet_aoti_run: %s\n", what.c_str());
    return 1;
  }
  return 0;
}
