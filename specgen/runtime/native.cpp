// The replay core in C++ (specgen/runtime/native.py builds and loads it): what a repeated eager
// call does, without Python between the call and the kernel launch.
//
// - key(*tensors): the tensors' part of a call's signature, as bytes (each tensor's sizes,
//   strides, dtype, device, 16-byte alignment and whether it needs a gradient here, None as a
//   marker, which tensors are one), or None where the call must not be keyed (a tensor
//   subclass other than a parameter). runtime/replay.py's tensor_key is the same in Python.
// - replay(allocations, launches, result, single, arity, device, hooks, generic, keep): a
//   recorded call as a callable taking the call's tensors: it allocates each output and workspace
//   (at::empty_strided of its recorded layout, or a Python callable), starts each kernel
//   (cuLaunchKernel on the kernel's parameters, pointers filled from the call's tensors; or a
//   Python callable taking (inputs, buffers)) on the current stream, and returns the result.
//   Where it cannot launch here (Triton launch hooks installed, another GPU current, no CUDA
//   context on this thread) it calls generic(inputs) instead, the replay's Python path.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

// ---- the CUDA driver, found in the process (torch and Triton loaded it) ----------------------

using CUresult = int;
using LaunchKernel = CUresult (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, void*, void**, void**);
using CtxGetCurrent = CUresult (*)(void**);
using GetErrorString = CUresult (*)(CUresult, const char**);

LaunchKernel cu_launch_kernel = nullptr;
CtxGetCurrent cu_ctx_get_current = nullptr;
GetErrorString cu_get_error_string = nullptr;

bool load_driver() {
  if (cu_launch_kernel != nullptr) return true;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen("libcuda.so.1", RTLD_NOW);
  if (library == nullptr) return false;
  auto launch = reinterpret_cast<LaunchKernel>(dlsym(library, "cuLaunchKernel"));
  auto context = reinterpret_cast<CtxGetCurrent>(dlsym(library, "cuCtxGetCurrent"));
  auto error = reinterpret_cast<GetErrorString>(dlsym(library, "cuGetErrorString"));
  if (!launch || !context || !error) return false;  // all three or none
  cu_ctx_get_current = context;
  cu_get_error_string = error;
  cu_launch_kernel = launch;
  return true;
}

// ---- signatures ------------------------------------------------------------------------------

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

PyObject* key(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  try {
    std::string out;
    out.reserve(64 * nargs);
    const bool grad = c10::GradMode::is_enabled();
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      PyObject* object = args[i];
      if (object == Py_None) {
        put<int8_t>(out, -1);
        continue;
      }
      // a plain tensor or a parameter (context.PLAIN_TENSORS); another subclass is not keyed,
      // nor a layout other than strided (sparse tensors: the full path refuses them)
      if (!THPVariable_CheckExact(object)) Py_RETURN_NONE;
      const at::Tensor& tensor = THPVariable_Unpack(object);
      if (tensor.layout() != c10::kStrided) Py_RETURN_NONE;
      put<int8_t>(out, static_cast<int8_t>(tensor.dim()));
      for (int64_t size : tensor.sizes()) put(out, size);
      for (int64_t stride : tensor.strides()) put(out, stride);
      put<int8_t>(out, static_cast<int8_t>(tensor.scalar_type()));
      put<int8_t>(out, static_cast<int8_t>(tensor.device().type()));
      put<int8_t>(out, tensor.device().index());
      // Triton specializes pointers on 16-byte alignment
      const bool storage = tensor.has_storage() && !tensor.is_meta();
      const auto address = storage ? reinterpret_cast<uintptr_t>(tensor.data_ptr()) : 0;
      put<int8_t>(out, (address & 15) == 0);
      put<int8_t>(out, grad && tensor.requires_grad());
    }
    // one tensor passed as two arguments is recorded as one input
    for (Py_ssize_t i = 0; i < nargs; ++i)
      for (Py_ssize_t j = i + 1; j < nargs; ++j) put<int8_t>(out, args[i] == args[j]);
    return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

// ---- replays ---------------------------------------------------------------------------------

struct Allocation {
  PyObject* make = nullptr;  // a Python callable, or null for at::empty_strided of the layout
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

struct Parameter {
  char source;     // 'i': an input's data pointer, 'b': a buffer's, 'v': the constant bits
  int index;
  uint64_t bits;
};

struct Launch {
  PyObject* python = nullptr;  // a Python callable (inputs, buffers), or null for the driver's
  void* function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0, shared = 0;
  std::vector<Parameter> parameters;
};

// Every Python object a Replay holds is a strong reference, released with it. None of them may
// refer back to the Python Replay: a capsule is not tracked by the cycle collector, so such a
// cycle would never be freed.
struct Replay {
  std::vector<Allocation> allocations;
  std::vector<Launch> launches;
  std::vector<std::pair<bool, int>> result;  // (from a buffer, index)
  bool single = true;
  Py_ssize_t arity = 0;          // the call's tensors
  int device = -1;               // the GPU of its driver launches, -1 where it has none
  PyObject* enter_hooks = nullptr;  // Triton's launch hook lists, as they were when recorded
  PyObject* exit_hooks = nullptr;
  PyObject* generic = nullptr;   // the Python path, taking a tuple of the inputs
  PyObject* keep = nullptr;      // what keeps the launched kernels loaded (Triton's kernels)

  ~Replay() {
    for (auto& allocation : allocations) Py_XDECREF(allocation.make);
    for (auto& launch : launches) Py_XDECREF(launch.python);
    Py_XDECREF(enter_hooks);
    Py_XDECREF(exit_hooks);
    Py_XDECREF(generic);
    Py_XDECREF(keep);
  }
};

const char* kCapsule = "specgen.native.Replay";

void drop_replay(PyObject* capsule) {
  delete static_cast<Replay*>(PyCapsule_GetPointer(capsule, kCapsule));
}

PyObject* tuple_of(PyObject* const* items, Py_ssize_t n) {
  PyObject* tuple = PyTuple_New(n);
  if (tuple == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(tuple, i, items[i]);
  }
  return tuple;
}

PyObject* call_generic(const Replay& replay, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* inputs = tuple_of(args, nargs);
  if (inputs == nullptr) return nullptr;
  PyObject* result = PyObject_CallOneArg(replay.generic, inputs);
  Py_DECREF(inputs);
  return result;
}

bool launches_here(const Replay& replay) {
  if (replay.device < 0) return true;
  if (PyList_GET_SIZE(replay.enter_hooks) > 0 || PyList_GET_SIZE(replay.exit_hooks) > 0)
    return false;
  void* context = nullptr;
  if (cu_ctx_get_current(&context) != 0 || context == nullptr) return false;
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return guard->getDevice().index() == replay.device;
}

uint64_t pointer(PyObject* tensor) {
  return reinterpret_cast<uintptr_t>(THPVariable_Unpack(tensor).data_ptr());
}

PyObject* run(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  auto* replay = static_cast<Replay*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (replay == nullptr) return nullptr;
  if (nargs != replay->arity) {
    PyErr_Format(PyExc_TypeError, "specgen replay: %zd tensors given, %zd expected", nargs,
                 replay->arity);
    return nullptr;
  }
  std::vector<PyObject*> buffers;
  auto release = [&buffers]() {
    for (PyObject* buffer : buffers) Py_DECREF(buffer);
  };
  try {
    if (!launches_here(*replay)) return call_generic(*replay, args, nargs);
    buffers.reserve(replay->allocations.size());
    for (const auto& allocation : replay->allocations) {
      PyObject* buffer;
      if (allocation.make != nullptr) {
        buffer = PyObject_CallNoArgs(allocation.make);
      } else {
        buffer = THPVariable_Wrap(at::empty_strided(
            allocation.sizes, allocation.strides,
            at::TensorOptions().dtype(allocation.dtype).device(allocation.device)));
      }
      if (buffer == nullptr) return release(), nullptr;
      buffers.push_back(buffer);
    }
    for (const auto& launch : replay->launches) {
      if (launch.python != nullptr) {
        PyObject* inputs = tuple_of(args, nargs);
        PyObject* made = tuple_of(buffers.data(), static_cast<Py_ssize_t>(buffers.size()));
        PyObject* done = inputs && made ? PyObject_CallFunctionObjArgs(launch.python, inputs,
                                                                       made, nullptr)
                                        : nullptr;
        Py_XDECREF(inputs);
        Py_XDECREF(made);
        if (done == nullptr) return release(), nullptr;
        Py_DECREF(done);
        continue;
      }
      // an empty grid launches nothing (as Triton's launcher skips it)
      if (launch.grid[0] * launch.grid[1] * launch.grid[2] == 0) continue;
      // each parameter in an 8-byte slot (little-endian: a narrower one reads its low bytes)
      const size_t n = launch.parameters.size();
      std::vector<uint64_t> slots(n);
      std::vector<void*> pointers(n);
      for (size_t k = 0; k < n; ++k) {
        const Parameter& parameter = launch.parameters[k];
        slots[k] = parameter.source == 'v' ? parameter.bits
                   : parameter.source == 'i' ? pointer(args[parameter.index])
                                             : pointer(buffers[parameter.index]);
        pointers[k] = &slots[k];
      }
      const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      void* stream = guard->getStream(c10::Device(c10::DeviceType::CUDA, replay->device))
                         .native_handle();
      CUresult status = cu_launch_kernel(launch.function, launch.grid[0], launch.grid[1],
                                         launch.grid[2], launch.threads, 1, 1, launch.shared,
                                         stream, pointers.data(), nullptr);
      if (status != 0) {
        const char* message = "unknown error";
        cu_get_error_string(status, &message);
        PyErr_Format(PyExc_RuntimeError, "specgen replay: cuLaunchKernel failed: %s", message);
        return release(), nullptr;
      }
    }
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return release(), nullptr;
  }
  auto take = [&](const std::pair<bool, int>& source) {
    PyObject* item = source.first ? buffers[source.second] : args[source.second];
    Py_INCREF(item);
    return item;
  };
  PyObject* result;
  if (replay->single) {
    result = take(replay->result[0]);
  } else {
    result = PyTuple_New(static_cast<Py_ssize_t>(replay->result.size()));
    for (size_t k = 0; result != nullptr && k < replay->result.size(); ++k)
      PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(k), take(replay->result[k]));
  }
  release();
  return result;
}

PyMethodDef run_method = {"replay", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(run)),
                          METH_FASTCALL, "A recorded call, replayed on the call's tensors."};

// The items of a Python sequence, as new references; false (an exception set) where it is not one.
bool items_of(PyObject* sequence, std::vector<PyObject*>& items) {
  PyObject* fast = PySequence_Fast(sequence, "specgen replay: a sequence was expected");
  if (fast == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    Py_INCREF(item);
    items.push_back(item);
  }
  Py_DECREF(fast);
  return true;
}

// Releases the references ``items_of`` made, on every way out.
struct Items {
  std::vector<PyObject*> items;
  ~Items() {
    for (PyObject* item : items) Py_DECREF(item);
  }
};

bool ints_of(PyObject* sequence, std::vector<int64_t>& values) {
  Items held;
  if (!items_of(sequence, held.items)) return false;
  for (PyObject* item : held.items) {
    values.push_back(PyLong_AsLongLong(item));
    if (PyErr_Occurred()) return false;
  }
  return true;
}

bool parse_replay(Replay& replay, PyObject* allocations, PyObject* launches, PyObject* result) {
  Items held;
  if (!items_of(allocations, held.items)) return false;
  for (PyObject* item : held.items) {
    PyObject *make, *sizes, *strides, *dtype, *where;
    if (!PyArg_ParseTuple(item, "OOOOO", &make, &sizes, &strides, &dtype, &where)) return false;
    replay.allocations.emplace_back();  // owned by the replay from here on
    Allocation& allocation = replay.allocations.back();
    if (make != Py_None) {
      Py_INCREF(make);
      allocation.make = make;
      continue;
    }
    if (!THPDtype_Check(dtype) || !THPDevice_Check(where)) {
      PyErr_SetString(PyExc_TypeError, "specgen replay: an allocation's dtype or device");
      return false;
    }
    if (!ints_of(sizes, allocation.sizes) || !ints_of(strides, allocation.strides)) return false;
    allocation.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    allocation.device = reinterpret_cast<THPDevice*>(where)->device;
  }
  Items launch_items;
  if (!items_of(launches, launch_items.items)) return false;
  for (PyObject* item : launch_items.items) {
    PyObject *python, *parameters;
    unsigned long long function;
    replay.launches.emplace_back();
    Launch& launch = replay.launches.back();
    if (!PyArg_ParseTuple(item, "OK(III)IIO", &python, &function, &launch.grid[0],
                          &launch.grid[1], &launch.grid[2], &launch.threads, &launch.shared,
                          &parameters))
      return false;
    if (python != Py_None) {
      Py_INCREF(python);
      launch.python = python;
    }
    launch.function = reinterpret_cast<void*>(function);
    Items entries;
    if (!items_of(parameters, entries.items)) return false;
    for (PyObject* entry : entries.items) {
      int source;
      unsigned long long value;
      if (!PyArg_ParseTuple(entry, "CK", &source, &value)) return false;
      launch.parameters.push_back({static_cast<char>(source), static_cast<int>(value), value});
    }
    if (launch.python == nullptr && replay.device < 0) {
      PyErr_SetString(PyExc_ValueError, "specgen replay: a driver launch without a device");
      return false;
    }
  }
  Items result_items;
  if (!items_of(result, result_items.items)) return false;
  for (PyObject* item : result_items.items) {
    int from_buffer, index;
    if (!PyArg_ParseTuple(item, "pi", &from_buffer, &index)) return false;
    replay.result.emplace_back(from_buffer, index);
  }
  // every index in range: a replay reads only what it was given and made
  const auto n_buffers = static_cast<int>(replay.allocations.size());
  auto in_range = [&](char source, int index) {
    return index >= 0 && index < (source == 'i' ? replay.arity : n_buffers);
  };
  for (const auto& launch : replay.launches)
    for (const auto& parameter : launch.parameters)
      if (parameter.source != 'v' && !in_range(parameter.source, parameter.index)) {
        PyErr_SetString(PyExc_ValueError, "specgen replay: a parameter's index out of range");
        return false;
      }
  for (const auto& [from_buffer, index] : replay.result)
    if (!in_range(from_buffer ? 'b' : 'i', index)) {
      PyErr_SetString(PyExc_ValueError, "specgen replay: a result's index out of range");
      return false;
    }
  if (replay.result.empty() || (replay.single && replay.result.size() != 1)) {
    PyErr_SetString(PyExc_ValueError, "specgen replay: a result of one tensor, or a tuple");
    return false;
  }
  return true;
}

// replay(allocations, launches, result, single, arity, device, enter_hooks, exit_hooks, generic,
//        keep):
//   allocations: [(make or None, sizes, strides, dtype, device)]
//   launches: [(python or None, function, (gx, gy, gz), threads, shared, [(source, value)])]
//   result: [(from_buffer, index)]
PyObject* make_replay(PyObject* /*module*/, PyObject* args) {
  PyObject *allocations, *launches, *result, *enter, *exit, *generic, *keep;
  int single, device;
  Py_ssize_t arity;
  if (!PyArg_ParseTuple(args, "OOOpniO!O!OO", &allocations, &launches, &result, &single, &arity,
                        &device, &PyList_Type, &enter, &PyList_Type, &exit, &generic, &keep))
    return nullptr;
  if (device >= 0 && !load_driver()) {
    PyErr_SetString(PyExc_RuntimeError, "specgen replay: no CUDA driver in this process");
    return nullptr;
  }
  try {
    auto replay = std::make_unique<Replay>();
    replay->single = single;
    replay->arity = arity;
    replay->device = device;
    Py_INCREF(enter);
    replay->enter_hooks = enter;
    Py_INCREF(exit);
    replay->exit_hooks = exit;
    Py_INCREF(generic);
    replay->generic = generic;
    Py_INCREF(keep);
    replay->keep = keep;
    if (!parse_replay(*replay, allocations, launches, result)) return nullptr;
    PyObject* capsule = PyCapsule_New(replay.get(), kCapsule, drop_replay);
    if (capsule == nullptr) return nullptr;
    replay.release();  // the capsule's now
    PyObject* function = PyCFunction_New(&run_method, capsule);
    Py_DECREF(capsule);
    return function;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

PyMethodDef methods[] = {
    {"key", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(key)), METH_FASTCALL,
     "The tensors' part of a call's signature, or None where it is not keyed."},
    {"replay", make_replay, METH_VARARGS, "A recorded call as a callable on its tensors."},
    {nullptr, nullptr, 0, nullptr}};

// torch's extension builder names the module (TORCH_EXTENSION_NAME: a version suffix when the
// source changes within a process)
#define SPECGEN_STRING_(name) #name
#define SPECGEN_STRING(name) SPECGEN_STRING_(name)
#define SPECGEN_INIT_(name) PyInit_##name
#define SPECGEN_INIT(name) SPECGEN_INIT_(name)

PyModuleDef module = {PyModuleDef_HEAD_INIT, SPECGEN_STRING(TORCH_EXTENSION_NAME), nullptr, -1,
                      methods};

}  // namespace

PyMODINIT_FUNC SPECGEN_INIT(TORCH_EXTENSION_NAME)() {
  return PyModule_Create(&module);
}
