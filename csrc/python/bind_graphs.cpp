// Graph capture and replay: pools and runners of every compiled backend (the
// device of the pool picks the backend, graph_runner.cpp).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "graph/graph_runner.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace specswap::python {

void bind_graphs(py::module_& m) {
  py::class_<graph::GraphPool, std::shared_ptr<graph::GraphPool>>(m, "GraphPool",
      "Memory shared by every graph runner of one model (the backend's graph pool where it has one).")
      .def(py::init([](const c10::Device& device) { return graph::make_graph_pool(device); }), py::arg("device"))
      .def_property_readonly("device", &graph::GraphPool::device)
      .def("share", &graph::GraphPool::share, py::arg("tensor"),
           "Mark a tensor's storage as shared (weights, KV caches): runners do not count it as theirs.")
      .def("is_shared", &graph::GraphPool::is_shared, py::arg("tensor"))
      .def_property("pack_linear_weights", &graph::GraphPool::pack_linear_weights,
                    &graph::GraphPool::set_pack_linear_weights,
                    "CPU bf16: record matmuls by weights as oneDNN linears over weights repacked once (same "
                    "bits, checked at capture); the packed copies are shared by every runner of the pool.")
      .def_property_readonly("derived_bytes", &graph::GraphPool::derived_bytes,
                             "Bytes of tensors derived once for the whole pool (repacked weights).");

  py::class_<graph::GraphRunner, std::shared_ptr<graph::GraphRunner>>(m, "GraphRunner",
      "One captured stage of one tier at one batch bucket, with persistent buffers.")
      .def(py::init([](const std::string& stage, int speculative_num_steps, int bucket,
                       std::shared_ptr<graph::GraphPool> pool) {
             return graph::make_graph_runner(graph::stage_from_name(stage), speculative_num_steps, bucket, pool);
           }),
           py::arg("stage"), py::arg("speculative_num_steps"), py::arg("bucket"), py::arg("pool"))
      .def("capture", [](graph::GraphRunner& runner, py::function body) {
             runner.capture([&body] { body(); });
           }, py::arg("body"), "Run body once and record it (once per runner).")
      .def("replay", &graph::GraphRunner::replay, py::call_guard<py::gil_scoped_release>())
      .def("set_buffer", &graph::GraphRunner::set_buffer, py::arg("name"), py::arg("tensor"))
      .def("buffer", &graph::GraphRunner::buffer, py::arg("name"))
      .def("buffer_names", &graph::GraphRunner::buffer_names)
      .def_property_readonly("backend", &graph::GraphRunner::backend)
      .def_property_readonly("captured", &graph::GraphRunner::captured)
      .def_property_readonly("stage", [](const graph::GraphRunner& r) { return graph::stage_name(r.stage()); })
      .def_property_readonly("speculative_num_steps", &graph::GraphRunner::speculative_num_steps)
      .def_property_readonly("bucket", &graph::GraphRunner::bucket)
      .def_property_readonly("pool", &graph::GraphRunner::pool)
      .def_property_readonly("capture_seconds", &graph::GraphRunner::capture_seconds)
      .def("memory_bytes", &graph::GraphRunner::memory_bytes);

  m.def("graph_capture_count", &graph::capture_count, "Captures so far in this process, all backends.");
  m.def("compiled_backends", &graph::compiled_backends, "Graph backends compiled into this build.");
}

}  // namespace specswap::python
