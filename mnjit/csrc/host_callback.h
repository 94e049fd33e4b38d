// mnjit.HostCallback: an ORT custom op that calls a Python function (jax.pure_callback, io_callback,
// jax.debug.print and equinox's error checks), so that a loop holding one stays one ONNX Loop.
//
// Why by hand: onnxruntime-extensions' Python ops abort the process when the function raises, pass outputs
// through lists, and crashed at session teardown; ORT's custom-op C API is the supported way in. Included
// once, by ort_ffi.cc, after its OrtApi slots; every session mnjit creates carries the domain.
//
// The op has one variadic input and one variadic output of any types; its `callback` attribute names the
// Python function. The kernel only hands its context to the dispatcher Python installed
// (mnjit/host_callbacks.py), which reads the inputs and writes the outputs through the mnjit_cb_* functions
// below. A Python exception becomes an ORT error status: the run fails cleanly and mnjit raises it.

#include <atomic>

namespace {

// OrtCustomOp (onnxruntime_c_api.h), every member through version 20; ORT reads only the members of the
// version set in `version`, here 16: the first with CreateKernelV2/KernelComputeV2, which return a status.
struct CustomOp {
  uint32_t version;
  void* (*CreateKernel)(const CustomOp*, const void* api, const void* info);
  const char* (*GetName)(const CustomOp*);
  const char* (*GetExecutionProviderType)(const CustomOp*);
  int32_t (*GetInputType)(const CustomOp*, size_t);
  size_t (*GetInputTypeCount)(const CustomOp*);
  int32_t (*GetOutputType)(const CustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const CustomOp*);
  void (*KernelCompute)(void* kernel, void* context);
  void (*KernelDestroy)(void* kernel);
  int32_t (*GetInputCharacteristic)(const CustomOp*, size_t);
  int32_t (*GetOutputCharacteristic)(const CustomOp*, size_t);
  int32_t (*GetInputMemoryType)(const CustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const CustomOp*);
  int (*GetVariadicInputHomogeneity)(const CustomOp*);
  int (*GetVariadicOutputMinArity)(const CustomOp*);
  int (*GetVariadicOutputHomogeneity)(const CustomOp*);
  Status* (*CreateKernelV2)(const CustomOp*, const void* api, const void* info, void** kernel);
  Status* (*KernelComputeV2)(void* kernel, void* context);
  Status* (*InferOutputShapeFn)(const CustomOp*, void*);
  int (*GetStartVersion)(const CustomOp*);
  int (*GetEndVersion)(const CustomOp*);
  size_t (*GetMayInplace)(int**, int**);
  void (*ReleaseMayInplace)(int*, int*);
  size_t (*GetAliasMap)(int**, int**);
  void (*ReleaseAliasMap)(int*, int*);
};

constexpr int32_t kAnyType = 0;        // ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED: each argument its own type
constexpr int32_t kVariadic = 2;       // INPUT_OUTPUT_VARIADIC
constexpr int32_t kRuntimeError = 6;   // ORT_RUNTIME_EXCEPTION
constexpr size_t kMaxRank = 64;

// Returns 0, or nonzero with a message in `error`; Python installs it with mnjit_cb_set_dispatcher. `after`: the
// node's last input only orders it (one function inlined twice makes two nodes, only one of them may have it).
using Dispatcher = int (*)(int64_t callback, int64_t after, void* context, char* error, size_t error_size);

struct Kernel {
  int64_t callback = 0, after = 0;
};
std::atomic<Dispatcher> dispatcher{nullptr};

Status* callback_status(const char* text) {
  return slot<Status* (*)(int, const char*)>(kCreateStatus)(kRuntimeError, text);
}

Status* create_kernel(const CustomOp*, const void*, const void* info, void** kernel) {
  auto read = slot<Status* (*)(const void*, const char*, int64_t*)>(kKernelInfoGetAttribute_int64);
  auto made = std::make_unique<Kernel>();
  Status* status = read(info, "callback", &made->callback);
  if (status != nullptr) return status;
  message(read(info, "after", &made->after));  // absent: 0
  *kernel = made.release();
  return nullptr;
}

Status* compute(void* kernel, void* context) {
  Dispatcher dispatch = dispatcher.load();
  if (dispatch == nullptr) return callback_status("mnjit: no host-callback dispatcher is installed");
  char error[4096] = "";
  auto* k = static_cast<Kernel*>(kernel);
  if (dispatch(k->callback, k->after, context, error, sizeof error) != 0)
    return callback_status(error[0] ? error : "mnjit: a host callback failed");
  return nullptr;
}

CustomOp make_host_callback() {
  CustomOp op{};
  op.version = 16;
  op.GetName = [](const CustomOp*) { return "HostCallback"; };
  op.GetExecutionProviderType = [](const CustomOp*) -> const char* { return nullptr; };  // the CPU provider
  op.GetInputType = [](const CustomOp*, size_t) { return kAnyType; };
  op.GetOutputType = [](const CustomOp*, size_t) { return kAnyType; };
  op.GetInputTypeCount = [](const CustomOp*) -> size_t { return 1; };
  op.GetOutputTypeCount = [](const CustomOp*) -> size_t { return 1; };
  op.KernelDestroy = [](void* kernel) { delete static_cast<Kernel*>(kernel); };
  op.GetInputCharacteristic = [](const CustomOp*, size_t) { return kVariadic; };
  op.GetOutputCharacteristic = [](const CustomOp*, size_t) { return kVariadic; };
  op.GetInputMemoryType = [](const CustomOp*, size_t) { return int32_t{0}; };
  op.GetVariadicInputMinArity = [](const CustomOp*) { return 0; };
  op.GetVariadicInputHomogeneity = [](const CustomOp*) { return 0; };
  op.GetVariadicOutputMinArity = [](const CustomOp*) { return 0; };
  op.GetVariadicOutputHomogeneity = [](const CustomOp*) { return 0; };
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  return op;
}

// The "mnjit" domain, made once and never released: ORT requires it to outlive every session using it.
void* host_callback_domain(std::string& failure) {
  static CustomOp op = make_host_callback();
  static void* domain = nullptr;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (domain != nullptr) return domain;
  void* made = nullptr;
  failure = message(slot<Status* (*)(const char*, void**)>(kCreateCustomOpDomain)("mnjit", &made));
  if (failure.empty()) failure = message(slot<Status* (*)(void*, const void*)>(kCustomOpDomain_Add)(made, &op));
  if (!failure.empty()) return nullptr;
  return domain = made;
}

}  // namespace

extern "C" {

void mnjit_cb_set_dispatcher(Dispatcher dispatch) { dispatcher.store(dispatch); }

// The counts of inputs and outputs of the node being computed.
void mnjit_cb_arity(void* context, size_t* inputs, size_t* outputs) {
  message(slot<Status* (*)(const void*, size_t*)>(kKernelContext_GetInputCount)(context, inputs));
  message(slot<Status* (*)(const void*, size_t*)>(kKernelContext_GetOutputCount)(context, outputs));
}

// Input `index`: its data (nullptr when empty), ONNX element type and dims (at most kMaxRank); -1 on failure.
int mnjit_cb_input(void* context, size_t index, const void** data, int32_t* onnx_type, size_t* rank,
                   int64_t* dims) {
  const void* value = nullptr;
  if (!message(slot<Status* (*)(const void*, size_t, const void**)>(kKernelContext_GetInput)(
          context, index, &value)).empty() || value == nullptr)
    return -1;
  void* info = nullptr;
  if (!message(slot<Status* (*)(const void*, void**)>(kGetTensorTypeAndShape)(value, &info)).empty()) return -1;
  std::string failure = message(slot<Status* (*)(const void*, int32_t*)>(kGetTensorElementType)(info, onnx_type));
  if (failure.empty()) failure = message(slot<Status* (*)(const void*, size_t*)>(kGetDimensionsCount)(info, rank));
  if (failure.empty() && *rank > kMaxRank) failure = "rank too large";
  if (failure.empty())
    failure = message(slot<Status* (*)(const void*, int64_t*, size_t)>(kGetDimensions)(info, dims, *rank));
  slot<void (*)(void*)>(kReleaseTensorTypeAndShapeInfo)(info);
  if (failure.empty())
    failure = message(slot<Status* (*)(const void*, const void**)>(kGetTensorMutableData)(value, data));
  return failure.empty() ? 0 : -1;
}

// Allocates output `index` with `dims`; returns its data (nullptr when empty or on failure: *ok says which).
void* mnjit_cb_output(void* context, size_t index, const int64_t* dims, size_t rank, int* ok) {
  void* value = nullptr;
  *ok = 0;
  if (!message(slot<Status* (*)(void*, size_t, const int64_t*, size_t, void**)>(kKernelContext_GetOutput)(
          context, index, dims, rank, &value)).empty() || value == nullptr)
    return nullptr;
  void* data = nullptr;
  if (!message(slot<Status* (*)(void*, void**)>(kGetTensorMutableData)(value, &data)).empty()) return nullptr;
  *ok = 1;
  return data;
}

}  // extern "C"
