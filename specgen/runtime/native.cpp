// The replay core in C++ (specgen/runtime/native.py builds and loads it): what a repeated eager
// call does, without Python between the call and the kernel launch.
//
// - key(*tensors): the tensors' part of a call's signature, as bytes (each tensor's sizes,
//   strides, dtype, device, 16-byte alignment and whether it needs a gradient here, None as a
//   marker, which tensors are one), or None where the call must not be keyed (a tensor
//   subclass other than a parameter). runtime/replay.py's tensor_key is the same in Python.
// - replay(allocations, launches, result, single, device, hooks, generic): a recorded call as a
//   callable taking the call's tensors: it allocates each output and workspace
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
  cu_launch_kernel = reinterpret_cast<LaunchKernel>(dlsym(library, "cuLaunchKernel"));
  cu_ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(library, "cuCtxGetCurrent"));
  cu_get_error_string = reinterpret_cast<GetErrorString>(dlsym(library, "cuGetErrorString"));
  return cu_launch_kernel && cu_ctx_get_current && cu_get_error_string;
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
      // a plain tensor or a parameter (context.PLAIN_TENSORS); another subclass is not keyed
      if (!THPVariable_CheckExact(object)) Py_RETURN_NONE;
      const at::Tensor& tensor = THPVariable_Unpack(object);
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

struct Replay {
  std::vector<Allocation> allocations;
  std::vector<Launch> launches;
  std::vector<std::pair<bool, int>> result;  // (from a buffer, index)
  bool single = true;
  int device = -1;               // the GPU of its driver launches, -1 where it has none
  PyObject* enter_hooks = nullptr;  // Triton's launch hook lists: launches skip them
  PyObject* exit_hooks = nullptr;
  PyObject* generic = nullptr;   // the Python path, taking a tuple of the inputs

  ~Replay() {
    for (auto& allocation : allocations) Py_XDECREF(allocation.make);
    for (auto& launch : launches) Py_XDECREF(launch.python);
    Py_XDECREF(enter_hooks);
    Py_XDECREF(exit_hooks);
    Py_XDECREF(generic);
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
  if (!launches_here(*replay)) return call_generic(*replay, args, nargs);
  std::vector<PyObject*> buffers;
  buffers.reserve(replay->allocations.size());
  auto release = [&buffers]() {
    for (PyObject* buffer : buffers) Py_DECREF(buffer);
  };
  try {
    for (const auto& allocation : replay->allocations) {
      PyObject* buffer;
      if (allocation.make != nullptr) {
        buffer = PyObject_CallNoArgs(allocation.make);
        if (buffer == nullptr) return release(), nullptr;
      } else {
        buffer = THPVariable_Wrap(at::empty_strided(
            allocation.sizes, allocation.strides,
            at::TensorOptions().dtype(allocation.dtype).device(allocation.device)));
      }
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
  PyObject* result = nullptr;
  auto take = [&](const std::pair<bool, int>& source) {
    PyObject* item = source.first ? buffers[source.second] : args[source.second];
    Py_INCREF(item);
    return item;
  };
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

std::vector<int64_t> ints_of(PyObject* sequence) {
  std::vector<int64_t> values;
  const Py_ssize_t n = PySequence_Size(sequence);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(sequence, i);
    values.push_back(PyLong_AsLongLong(item));
    Py_XDECREF(item);
  }
  return values;
}

// replay(allocations, launches, result, single, device, enter_hooks, exit_hooks, generic):
//   allocations: [(make or None, sizes, strides, dtype, device)]
//   launches: [(python or None, function, (gx, gy, gz), threads, shared, [(source, value)])]
//   result: [(from_buffer, index)]
PyObject* make_replay(PyObject* /*module*/, PyObject* args) {
  PyObject *allocations, *launches, *result, *enter, *exit, *generic;
  int single, device;
  if (!PyArg_ParseTuple(args, "OOOpiOOO", &allocations, &launches, &result, &single, &device,
                        &enter, &exit, &generic))
    return nullptr;
  if (device >= 0 && !load_driver()) {
    PyErr_SetString(PyExc_RuntimeError, "specgen replay: no CUDA driver in this process");
    return nullptr;
  }
  auto* replay = new Replay();
  replay->single = single;
  replay->device = device;
  Py_INCREF(enter);
  Py_INCREF(exit);
  Py_INCREF(generic);
  replay->enter_hooks = enter;
  replay->exit_hooks = exit;
  replay->generic = generic;
  for (Py_ssize_t i = 0; i < PySequence_Size(allocations); ++i) {
    PyObject *item = PySequence_GetItem(allocations, i), *make, *sizes, *strides, *dtype, *where;
    if (!PyArg_ParseTuple(item, "OOOOO", &make, &sizes, &strides, &dtype, &where))
      return Py_XDECREF(item), delete replay, nullptr;
    Allocation allocation;
    if (make != Py_None) {
      Py_INCREF(make);
      allocation.make = make;
    } else {
      allocation.sizes = ints_of(sizes);
      allocation.strides = ints_of(strides);
      allocation.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
      allocation.device = reinterpret_cast<THPDevice*>(where)->device;
    }
    replay->allocations.push_back(std::move(allocation));
    Py_DECREF(item);
  }
  for (Py_ssize_t i = 0; i < PySequence_Size(launches); ++i) {
    PyObject *item = PySequence_GetItem(launches, i), *python, *parameters;
    unsigned long long function;
    Launch launch;
    if (!PyArg_ParseTuple(item, "OK(III)IIO", &python, &function, &launch.grid[0],
                          &launch.grid[1], &launch.grid[2], &launch.threads, &launch.shared,
                          &parameters))
      return Py_XDECREF(item), delete replay, nullptr;
    if (python != Py_None) {
      Py_INCREF(python);
      launch.python = python;
    }
    launch.function = reinterpret_cast<void*>(function);
    for (Py_ssize_t k = 0; k < PySequence_Size(parameters); ++k) {
      PyObject* entry = PySequence_GetItem(parameters, k);
      int source;
      unsigned long long value;
      if (!PyArg_ParseTuple(entry, "CK", &source, &value))
        return Py_XDECREF(entry), Py_XDECREF(item), delete replay, nullptr;
      launch.parameters.push_back({static_cast<char>(source), static_cast<int>(value), value});
      Py_DECREF(entry);
    }
    replay->launches.push_back(std::move(launch));
    Py_DECREF(item);
  }
  for (Py_ssize_t i = 0; i < PySequence_Size(result); ++i) {
    PyObject* item = PySequence_GetItem(result, i);
    int from_buffer, index;
    if (!PyArg_ParseTuple(item, "pi", &from_buffer, &index))
      return Py_XDECREF(item), delete replay, nullptr;
    replay->result.emplace_back(from_buffer, index);
    Py_DECREF(item);
  }
  PyObject* capsule = PyCapsule_New(replay, kCapsule, drop_replay);
  if (capsule == nullptr) return delete replay, nullptr;
  PyObject* function = PyCFunction_New(&run_method, capsule);
  Py_DECREF(capsule);
  return function;
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
