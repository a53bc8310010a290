// The Python module of the runtime's native kernels (built by runtime/kernels/native.py).
#include "decoder_layers.h"
#include "eagle3_grow.h"
#include "quantized_linear.h"
#include "row_argmax.h"
#include "skinny_linear.h"

// The kernels that run a step's arithmetic let go of the GIL: a server's event loop (and any other Python thread)
// then runs beside them instead of waiting for the step's Python to pause between two of them.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using released = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("available", &skinny_linear_available);
  m.def("bf16_available", &skinny_bf16_available);
  m.def("bf16_dot_available", &skinny_bf16_dot_available);
  m.def("vector_kernel", &skinny_vector_kernel);
  m.def("amx_available", &skinny_amx_available);
  m.def("bf16_fma_from_rows", &skinny_bf16_fma_from_rows, pybind11::arg("rows") = 0);
  m.def("pack", &skinny_pack, pybind11::arg("weight"), pybind11::arg("kernel") = "auto");
  m.def("linear", &skinny_linear, released());
  m.def("decoder_layers", &decoder_layers, released());
  m.def("decoder_layers_states", &decoder_layers_states, released());
  m.def("eagle3_layer", &eagle3_layer, released());
  m.def("eagle3_readout", &eagle3_readout, released());
  m.def("eagle3_grow", &eagle3_grow, released());
  m.def("quantized_available", &quantized_available);
  m.def("quantized_pack", &quantized_pack);
  m.def("quantized_amx_available", &quantized_amx_available);
  m.def("quantized_amx_from_rows", &quantized_amx_from_rows, pybind11::arg("rows") = 0);
  m.def("quantized_linear", &quantized_linear, pybind11::arg("x"), pybind11::arg("packed"),
        pybind11::arg("out_features"), pybind11::arg("amx_from_rows") = -1, released());
  m.def("row_argmax", &row_argmax, released());
}
