// qhead._C — the nanobind extension behind the qhead package.
//
// A thin layer over the C++ library: arrays cross through DLPack without
// copies, every qhead::Error becomes a qhead.Error subclass, and the ops run
// with the GIL released. The public API (python/qhead/__init__.py) wraps
// these functions and allocates outputs in the input's framework.
#include "binding.h"

NB_MODULE(_C, m) {
  namespace py = qhead::py;
  m.doc() = "qhead's C++ core: quantized token tables (embed, logits, top-k, rescore).";
  m.attr("__version__") = QHEAD_VERSION;
#ifdef QHEAD_HAS_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  py::register_errors(m);
  py::register_tables(m);
  py::register_ops(m);
  py::register_model(m);
}
