#include "errors.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

const char* exception_name(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return "InvalidArgumentError";
    case StatusCode::kNotFound: return "UnknownSequenceError";
    case StatusCode::kAlreadyExists: return "SequenceExistsError";
    case StatusCode::kOutOfRange: return "OutOfRangeError";
    case StatusCode::kFailedPrecondition: return "FailedPreconditionError";
    case StatusCode::kOutOfPages: return "OutOfPagesError";
    case StatusCode::kOk:
    case StatusCode::kInternal: break;
  }
  return "InternalError";
}

}  // namespace

void raise_status(const Status& status) {
  // Looked up on the (cold) error path; specd.errors is imported by the package itself.
  py::object cls = py::module_::import("specd.errors").attr(exception_name(status.code()));
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw py::error_already_set();
}

}  // namespace specd::py_bind
