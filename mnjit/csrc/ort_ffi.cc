// An XLA FFI handler that runs an ONNX Runtime session on XLA's own buffers.
//
// Why by hand: jax.jit's C++ dispatch is about 3.5 us a call, and mnjit's Python path to
// ORT costs 3x that (binding, DLPack import of every output). Run as a custom call inside a
// jax.jit computation, ORT reads the argument buffers and writes straight into the result
// buffers XLA allocated, so a call costs jax.jit's dispatch plus ORT's own run. No library
// offers this bridge. Built on first use by mnjit/ffi.py (docs/runtime.md).
//
// ORT is reached through its stable C ABI: OrtApi is a table of function pointers that ORT
// only ever appends to, so the few slots used here keep their index in every release. The
// slot numbers below were read off onnxruntime_c_api.h (and agree with the static_asserts on offsetof(OrtApi, ...)
// in onnxruntime_c_api.cc); ort_ffi_init checks the version.
#include <dlfcn.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using Status = void;  // OrtStatus, opaque
using Fn = void*;

struct OrtApiBase {
  const Fn* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

// Slots of OrtApi (ORT_API_VERSION 13 and later).
enum Slot : int {
  kCreateStatus = 0,
  kGetErrorMessage = 2,
  kCreateEnv = 3,
  kCreateSessionFromArray = 8,
  kRun = 9,
  kCreateSessionOptions = 10,
  kSetGraphOptimizationLevel = 23,
  kCreateCustomOpDomain = 26,
  kCustomOpDomain_Add = 27,
  kAddCustomOpDomain = 28,
  kCreateRunOptions = 39,
  kRunOptionsSetRunLogSeverityLevel = 41,
  kRunOptionsSetTerminate = 46,
  kCreateTensorWithDataAsOrtValue = 49,
  kGetTensorMutableData = 51,
  kGetTensorElementType = 60,
  kGetDimensionsCount = 61,
  kGetDimensions = 62,
  kGetTensorTypeAndShape = 65,
  kCreateCpuMemoryInfo = 69,
  kKernelInfoGetAttribute_int64 = 86,
  kKernelContext_GetInputCount = 88,
  kKernelContext_GetOutputCount = 89,
  kKernelContext_GetInput = 90,
  kKernelContext_GetOutput = 91,
  kReleaseStatus = 93,
  kReleaseSession = 95,
  kReleaseValue = 96,
  kReleaseRunOptions = 97,
  kReleaseTensorTypeAndShapeInfo = 99,
  kReleaseSessionOptions = 100,
  kCreateEnvWithGlobalThreadPools = 119,
  kDisablePerSessionThreads = 120,
  kCreateThreadingOptions = 121,
  kReleaseThreadingOptions = 122,
  kSetGlobalIntraOpNumThreads = 147,
  kSetGlobalInterOpNumThreads = 148,
  kSetGlobalSpinControl = 149,
};

const Fn* api = nullptr;
void* env = nullptr;
void* cpu_memory = nullptr;

template <typename T>
T slot(Slot s) { return reinterpret_cast<T>(api[s]); }

// Takes an ORT status: empty string for success, its message otherwise (the status is freed).
std::string message(Status* status) {
  if (status == nullptr) return {};
  std::string text = slot<const char* (*)(const Status*)>(kGetErrorMessage)(status);
  slot<void (*)(Status*)>(kReleaseStatus)(status);
  return text.empty() ? std::string("ONNX Runtime failed") : text;
}

}  // namespace

#include "host_callback.h"

namespace {

struct Tensor {
  int32_t onnx_type;
  std::vector<int64_t> shape;
  size_t bytes;
};

struct Session {
  void* session = nullptr;
  std::vector<std::string> input_names, output_names;
  std::vector<const char*> input_ptrs, output_ptrs;
  std::vector<Tensor> inputs, outputs;
  ~Session() {
    if (session != nullptr) slot<void (*)(void*)>(kReleaseSession)(session);
  }
};

// Handles are ids, not addresses: a computation jax still runs after mnjit released its
// session finds the id gone and fails cleanly, and a run in progress keeps its session alive.
std::mutex registry_mutex;
std::unordered_map<int64_t, std::shared_ptr<Session>> registry;
int64_t next_handle = 1;

std::shared_ptr<Session> lookup(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto found = registry.find(handle);
  return found == registry.end() ? nullptr : found->second;
}

void copy_error(const std::string& text, char* error, size_t error_size) {
  if (error_size == 0) return;
  std::strncpy(error, text.c_str(), error_size - 1);
  error[error_size - 1] = '\0';
}

// Reads `count` tensors from the flat description: onnx_type, rank, dims..., bytes.
std::vector<Tensor> read_tensors(const int64_t*& spec, int64_t count) {
  std::vector<Tensor> tensors(count);
  for (auto& t : tensors) {
    t.onnx_type = static_cast<int32_t>(*spec++);
    int64_t rank = *spec++;
    t.shape.assign(spec, spec + rank);
    spec += rank;
    t.bytes = static_cast<size_t>(*spec++);
  }
  return tensors;
}

// Zero-size buffers may come without an address; ORT still wants one.
alignas(64) char empty_buffer[64];

// XLA runs its CPU threads with denormals flushed (FTZ and DAZ set in MXCSR); ORT, and so mnjit,
// keeps IEEE subnormals. The custom call runs ORT with the two bits cleared, and restores them.
class IeeeDenormals {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  IeeeDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero)); }
  ~IeeeDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  unsigned saved_;
#endif
};

// Runs the session on `inputs` into `outputs` (data pointers; nullptr for zero-size tensors).
std::string run_session(const Session& s, void* const* inputs, void* const* outputs, void* run_options) {
  IeeeDenormals ieee;
  using CreateTensor = Status* (*)(const void*, void*, size_t, const int64_t*, size_t, int32_t, void**);
  auto create = slot<CreateTensor>(kCreateTensorWithDataAsOrtValue);
  size_t n_in = s.inputs.size(), n_out = s.outputs.size(), total = n_in + n_out;
  constexpr size_t kInline = 32;
  void* inline_values[kInline] = {};
  std::vector<void*> heap;
  void** values = inline_values;
  if (total > kInline) {
    heap.assign(total, nullptr);
    values = heap.data();
  }
  std::string failure;
  for (size_t i = 0; i < total && failure.empty(); ++i) {
    const Tensor& t = i < n_in ? s.inputs[i] : s.outputs[i - n_in];
    void* data = i < n_in ? inputs[i] : outputs[i - n_in];
    failure = message(create(cpu_memory, t.bytes && data ? data : empty_buffer, t.bytes, t.shape.data(),
                             t.shape.size(), t.onnx_type, &values[i]));
  }
  if (failure.empty()) {
    using RunFn = Status* (*)(void*, const void*, const char* const*, void* const*, size_t, const char* const*,
                              size_t, void**);
    failure = message(slot<RunFn>(kRun)(s.session, run_options, s.input_ptrs.data(), values, n_in,
                                        s.output_ptrs.data(), n_out, values + n_in));
  }
  auto release = slot<void (*)(void*)>(kReleaseValue);
  for (size_t i = 0; i < total; ++i)
    if (values[i] != nullptr) release(values[i]);
  return failure;
}

ffi::Error run(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t handle) {
  std::shared_ptr<Session> session = lookup(handle);
  if (session == nullptr)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "mnjit: this ONNX session was released");
  const Session* s = session.get();
  if (args.size() != s->inputs.size() || rets.size() != s->outputs.size())
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mnjit: ONNX session called with the wrong arity");
  constexpr size_t kInline = 16;
  void* inline_data[2 * kInline];
  std::vector<void*> heap;
  void** data = inline_data;
  if (args.size() > kInline || rets.size() > kInline) {
    heap.assign(args.size() + rets.size(), nullptr);
    data = heap.data();
  }
  void** out_data = data + (data == inline_data ? kInline : args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mnjit: bad argument buffer");
    data[i] = buffer->untyped_data();
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto result = rets.get<ffi::AnyBuffer>(i);
    if (!result.has_value()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mnjit: bad result buffer");
    out_data[i] = (*result)->untyped_data();
  }
  std::string failure = run_session(*s, data, out_data, nullptr);
  if (!failure.empty()) return ffi::Error(ffi::ErrorCode::kInternal, "ONNX Runtime: " + failure);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MnjitOrtRun, run,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attr<int64_t>("session"));

extern "C" {

// Loads ORT's shared library (the onnxruntime package ships it) and sets up the process-wide
// environment: one intra-op pool of `threads` (the caller's thread counts as one), shared by every session
// and sleeping between kernels. This library instance is mnjit's own (the onnxruntime Python module links
// ORT statically), so its global pool binds no other ORT user in the process. Returns 0, or -1 with `error`.
int ort_ffi_init(const char* library_path, int threads, char* error, size_t error_size) {
  if (api != nullptr) return 0;
  void* library = dlopen(library_path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) { copy_error(dlerror(), error, error_size); return -1; }
  auto get_base = reinterpret_cast<const OrtApiBase* (*)()>(dlsym(library, "OrtGetApiBase"));
  if (get_base == nullptr) { copy_error("OrtGetApiBase not found", error, error_size); return -1; }
  const Fn* table = get_base()->GetApi(13);
  if (table == nullptr) { copy_error("this ONNX Runtime lacks C API version 13", error, error_size); return -1; }
  api = table;
  void* threading = nullptr;
  std::string failure = message(slot<Status* (*)(void**)>(kCreateThreadingOptions)(&threading));
  if (failure.empty())
    failure = message(slot<Status* (*)(void*, int)>(kSetGlobalIntraOpNumThreads)(threading, threads));
  if (failure.empty())
    failure = message(slot<Status* (*)(void*, int)>(kSetGlobalInterOpNumThreads)(threading, 1));
  if (failure.empty())  // spinning pool threads took the cores from XLA's and slowed loaded runs 1.7-2.3x
    failure = message(slot<Status* (*)(void*, int)>(kSetGlobalSpinControl)(threading, 0));
  if (failure.empty())
    failure = message(slot<Status* (*)(int, const char*, const void*, void**)>(kCreateEnvWithGlobalThreadPools)(
        3, "mnjit", threading, &env));
  if (threading != nullptr) slot<void (*)(void*)>(kReleaseThreadingOptions)(threading);
  if (failure.empty())
    failure = message(slot<Status* (*)(int, int, void**)>(kCreateCpuMemoryInfo)(0, 0, &cpu_memory));
  if (!failure.empty()) { api = nullptr; copy_error(failure, error, error_size); return -1; }
  return 0;
}

// Creates a session from model bytes. `spec` describes the inputs then the outputs as
// (onnx_type, rank, dims..., bytes); names are NUL-separated. Returns a handle, or 0 with `error`.
int64_t ort_ffi_create(const void* model, size_t model_size, const char* input_names,
                       int64_t n_inputs, const char* output_names, int64_t n_outputs, const int64_t* spec,
                       char* error, size_t error_size) {
  auto* s = new Session();
  for (int64_t i = 0; i < n_inputs; ++i) { s->input_names.emplace_back(input_names); input_names += s->input_names.back().size() + 1; }
  for (int64_t i = 0; i < n_outputs; ++i) { s->output_names.emplace_back(output_names); output_names += s->output_names.back().size() + 1; }
  for (auto& n : s->input_names) s->input_ptrs.push_back(n.c_str());
  for (auto& n : s->output_names) s->output_ptrs.push_back(n.c_str());
  s->inputs = read_tensors(spec, n_inputs);
  s->outputs = read_tensors(spec, n_outputs);
  void* options = nullptr;
  std::string failure = message(slot<Status* (*)(void**)>(kCreateSessionOptions)(&options));
  if (failure.empty())  // ORT_ENABLE_ALL, as mnjit's Python sessions
    failure = message(slot<Status* (*)(void*, int)>(kSetGraphOptimizationLevel)(options, 99));
  if (failure.empty())
    failure = message(slot<Status* (*)(void*)>(kDisablePerSessionThreads)(options));  // the env's pool
  if (failure.empty()) {  // mnjit.HostCallback (host_callback.h)
    void* domain = host_callback_domain(failure);
    if (domain != nullptr)
      failure = message(slot<Status* (*)(void*, void*)>(kAddCustomOpDomain)(options, domain));
  }
  if (failure.empty())
    failure = message(slot<Status* (*)(const void*, const void*, size_t, const void*, void**)>(
        kCreateSessionFromArray)(env, model, model_size, options, &s->session));
  if (options != nullptr) slot<void (*)(void*)>(kReleaseSessionOptions)(options);
  if (!failure.empty()) {
    delete s;
    copy_error(failure, error, error_size);
    return 0;
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  int64_t handle = next_handle++;
  registry.emplace(handle, std::shared_ptr<Session>(s));
  return handle;
}

// Forgets the handle; the session goes once no run holds it.
void ort_ffi_release(int64_t handle) {
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto found = registry.find(handle);
    if (found == registry.end()) return;
    session = std::move(found->second);
    registry.erase(found);
  }
}

// Run options whose terminate flag another thread may set (to end a probe early). Their runs log only
// fatal errors: a terminated probe is expected, not worth ORT's error lines on stderr.
void* ort_ffi_run_options() {
  void* options = nullptr;
  if (!message(slot<Status* (*)(void**)>(kCreateRunOptions)(&options)).empty()) return nullptr;
  message(slot<Status* (*)(void*, int)>(kRunOptionsSetRunLogSeverityLevel)(options, 4));  // ORT_LOGGING_LEVEL_FATAL
  return options;
}

void ort_ffi_terminate(void* run_options) {
  message(slot<Status* (*)(void*)>(kRunOptionsSetTerminate)(run_options));
}

void ort_ffi_release_run_options(void* run_options) { slot<void (*)(void*)>(kReleaseRunOptions)(run_options); }

// Runs the session on the caller's buffers (data pointers in input then output order; nullptr for zero-size
// tensors). Returns 0, or -1 with `error` (also when `run_options` was terminated).
int ort_ffi_run(int64_t handle, void* run_options, void* const* inputs, void* const* outputs, char* error,
                size_t error_size) {
  std::shared_ptr<Session> s = lookup(handle);
  if (s == nullptr) { copy_error("no such session", error, error_size); return -1; }
  std::string failure = run_session(*s, inputs, outputs, run_options);
  if (!failure.empty()) { copy_error(failure, error, error_size); return -1; }
  return 0;
}

// Runs the session once on zero-filled buffers; returns the seconds it took, or -1 with `error`
// (also when `run_options` was terminated).
double ort_ffi_probe(int64_t handle, void* run_options, char* error, size_t error_size) {
  std::shared_ptr<Session> s = lookup(handle);
  if (s == nullptr) { copy_error("no such session", error, error_size); return -1; }
  std::vector<std::vector<char>> buffers;
  std::vector<void*> inputs, outputs;
  for (const Tensor& t : s->inputs) { buffers.emplace_back(t.bytes + 64, 0); inputs.push_back(buffers.back().data()); }
  for (const Tensor& t : s->outputs) { buffers.emplace_back(t.bytes + 64, 0); outputs.push_back(buffers.back().data()); }
  auto start = std::chrono::steady_clock::now();
  std::string failure = run_session(*s, inputs.data(), outputs.data(), run_options);
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (!failure.empty()) { copy_error(failure, error, error_size); return -1; }
  return took.count();
}

}  // extern "C"
