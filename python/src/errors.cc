// qhead::Error → the Python exception classes of qhead:
//
//   Error(Exception)                          .code: the ErrorCode's name
//     InvalidArgumentError(Error, ValueError)     "invalid_argument"
//     InvalidFileError(Error, ValueError)         "invalid_file"
//     IoError(Error, OSError)                     "io"
//     UnsupportedError(Error, NotImplementedError)"unsupported"
//     InternalError(Error, RuntimeError)          "internal"
//
// The message is the C++ message ("op: what"). std::bad_alloc is a
// MemoryError; any other C++ exception an InternalError, so that nothing the
// library throws leaves the interpreter in an undefined state.
#include <nanobind/stl/string.h>

#include <new>
#include <string>

#include "binding.h"
#include "qhead/error.h"

namespace qhead::py {

namespace {

PyObject* g_error = nullptr;
PyObject* g_by_code[5] = {};

const char* code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kInvalidFile: return "invalid_file";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

PyObject* make_class(nb::module_& m, const char* name, PyObject* bases, const char* code, const char* doc) {
  const std::string qual = std::string(nb::cast<std::string>(m.attr("__name__"))) + "." + name;
  nb::dict d;
  d["code"] = code ? nb::cast(code) : nb::none();
  d["__doc__"] = doc;
  PyObject* cls = PyErr_NewException(qual.c_str(), bases, d.ptr());
  if (!cls) throw nb::python_error();
  m.attr(name) = nb::handle(cls);  // the module holds a reference; so does g_*
  return cls;
}

void set_error(ErrorCode code, const char* msg) {
  PyErr_SetString(g_by_code[static_cast<int>(code)], msg);
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    set_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, "qhead: out of memory (std::bad_alloc)");
  } catch (const nb::python_error&) {
    throw;  // nanobind's own: a Python error in flight, an argument error, ...
  } catch (const nb::builtin_exception&) {
    throw;
  } catch (const nb::cast_error&) {
    throw;
  } catch (const std::exception& e) {
    set_error(ErrorCode::kInternal, (std::string("internal error: ") + e.what()).c_str());
  }
}

}  // namespace

void register_errors(nb::module_& m) {
  g_error = make_class(m, "Error", PyExc_Exception, nullptr,
                       "Base class of every error qhead raises; .code names the kind "
                       "(invalid_argument, invalid_file, io, unsupported, internal).");
  auto sub = [&](const char* name, PyObject* builtin, ErrorCode code, const char* doc) {
    PyObject* bases = PyTuple_Pack(2, g_error, builtin);
    if (!bases) throw nb::python_error();
    PyObject* cls = make_class(m, name, bases, code_name(code), doc);
    Py_DECREF(bases);
    g_by_code[static_cast<int>(code)] = cls;
  };
  sub("InvalidArgumentError", PyExc_ValueError, ErrorCode::kInvalidArgument,
      "A bad shape, dtype, device, scheme or id (qhead::ErrorCode::kInvalidArgument).");
  sub("InvalidFileError", PyExc_ValueError, ErrorCode::kInvalidFile,
      "Malformed file or checkpoint content (kInvalidFile).");
  sub("IoError", PyExc_OSError, ErrorCode::kIo, "Opening, reading or writing a file failed (kIo).");
  sub("UnsupportedError", PyExc_NotImplementedError, ErrorCode::kUnsupported,
      "Valid input qhead does not handle, or a feature this build lacks (kUnsupported).");
  sub("InternalError", PyExc_RuntimeError, ErrorCode::kInternal, "A bug in qhead (kInternal).");
  nb::register_exception_translator(translate);
}

}  // namespace qhead::py
