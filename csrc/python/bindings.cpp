// Python bindings of the C++ core: the state pool, runtime states and the
// adaptive policy. One file registers everything (specswap._C).
#include <torch/extension.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "core/adaptive_params.h"
#include "core/state_pool.h"
#include "graph/graph_runner.h"
#ifdef SPECSWAP_WITH_GGML
#include "quant/ggml_api.h"
#endif

namespace py = pybind11;

namespace specswap {
namespace {

// A stage resource that is a Python object (an attention backend, a graph
// runner written in Python, a dict of buffers).
class PyObjectResource final : public StageResource {
 public:
  explicit PyObjectResource(py::object object) : object_(std::move(object)) {}
  ~PyObjectResource() override {
    if (!Py_IsInitialized()) {
      object_.release();  // interpreter gone: leak rather than crash
      return;
    }
    py::gil_scoped_acquire gil;
    object_ = py::object();
  }
  const py::object& object() const { return object_; }

 private:
  py::object object_;
};

std::shared_ptr<const StageResource> wrap_stage(py::object object) {
  if (object.is_none()) return nullptr;
  // A C++ graph runner is stored as itself, so a C++ loop can replay it.
  if (py::isinstance<graph::GraphRunner>(object)) return object.cast<std::shared_ptr<graph::GraphRunner>>();
  return std::make_shared<PyObjectResource>(std::move(object));
}

py::object unwrap_stage(const std::shared_ptr<const StageResource>& resource) {
  if (!resource) return py::none();
  if (auto* py_resource = dynamic_cast<const PyObjectResource*>(resource.get())) {
    return py_resource->object();
  }
  if (auto runner = std::dynamic_pointer_cast<const graph::GraphRunner>(resource)) {
    return py::cast(std::const_pointer_cast<graph::GraphRunner>(runner));
  }
  // A C++-only resource (a graph runner built in C++): opaque to Python here.
  return py::str("<C++ stage resource>");
}

using StatePtr = std::shared_ptr<RuntimeState>;

StatePtr to_mutable(std::shared_ptr<const RuntimeState> state) {
  // pybind11 holders are non-const; the object itself is still immutable
  // (every field is const).
  return std::const_pointer_cast<RuntimeState>(std::move(state));
}

py::dict config_to_dict(const AdaptiveConfig& config) {
  py::dict out;
  out["policy"] = policy_name(config.policy);
  out["candidate_steps"] = config.candidate_steps;
  out["ema_alpha"] = config.ema_alpha;
  out["update_interval"] = config.update_interval;
  out["warmup_batches"] = config.warmup_batches;
  out["down_hysteresis"] = config.down_hysteresis;
  out["up_hysteresis"] = config.up_hysteresis;
  out["snap_initial_steps"] = config.snap_initial_steps;
  out["min_gain"] = config.min_gain;
  out["cost_prior_slope"] = config.cost_prior_slope;
  out["probe_rounds"] = config.probe_rounds;
  out["probe_interval"] = config.probe_interval;
  out["acceptance_model"] = acceptance_model_name(config.acceptance_model);
  return out;
}

}  // namespace
}  // namespace specswap

PYBIND11_MODULE(_C, m) {
  using namespace specswap;
  py::class_<StageResource, std::shared_ptr<StageResource>>(m, "StageResource");
  m.doc() = "specswap C++ core: state pool, atomic tier switch, adaptive policy";

  py::class_<RuntimeState, StatePtr>(m, "SpecRuntimeState",
      "Everything one decode round needs for one tier. Immutable.")
      .def(py::init([](int speculative_num_steps, int speculative_num_draft_tokens,
                       py::object draft, py::object verify, py::object draft_extend) {
             return std::make_shared<RuntimeState>(
                 speculative_num_steps, speculative_num_draft_tokens,
                 wrap_stage(std::move(draft)), wrap_stage(std::move(verify)),
                 wrap_stage(std::move(draft_extend)));
           }),
           py::arg("speculative_num_steps"), py::arg("speculative_num_draft_tokens"),
           py::arg("draft") = py::none(), py::arg("verify") = py::none(),
           py::arg("draft_extend") = py::none())
      .def_readonly("speculative_num_steps", &RuntimeState::speculative_num_steps)
      .def_readonly("speculative_num_draft_tokens",
                    &RuntimeState::speculative_num_draft_tokens)
      .def_property_readonly("draft", [](const RuntimeState& s) { return unwrap_stage(s.draft); })
      .def_property_readonly("verify", [](const RuntimeState& s) { return unwrap_stage(s.verify); })
      .def_property_readonly("draft_extend",
                             [](const RuntimeState& s) { return unwrap_stage(s.draft_extend); })
      .def("__repr__", [](const RuntimeState& s) {
        return "SpecRuntimeState(speculative_num_steps=" +
               std::to_string(s.speculative_num_steps) +
               ", speculative_num_draft_tokens=" +
               std::to_string(s.speculative_num_draft_tokens) + ")";
      });

  py::class_<StatePool>(m, "StatePool",
      "One prebuilt runtime state per tier; acquire() is one atomic load and "
      "activate() one atomic store.")
      .def(py::init<>())
      .def("register", [](StatePool& pool, StatePtr state) { pool.register_state(std::move(state)); },
           py::arg("state"), "Add a prebuilt state; each tier once.")
      .def("activate", &StatePool::activate, py::arg("speculative_num_steps"),
           "Publish a registered tier; True if the active tier changed.")
      .def("acquire", [](const StatePool& pool) -> py::object {
             auto state = pool.acquire_shared();
             if (!state) return py::none();
             return py::cast(to_mutable(std::move(state)));
           },
           "The active state (None before the first activate).")
      .def_property_readonly("active_steps", [](const StatePool& pool) -> py::object {
        const int steps = pool.active_steps();
        if (steps < 0) return py::none();
        return py::int_(steps);
      })
      .def_property_readonly("num_switches", &StatePool::num_switches)
      .def("tiers", &StatePool::tiers)
      .def("__contains__", &StatePool::contains)
      .def("__len__", &StatePool::size)
      .def("stats", [](const StatePool& pool) {
        py::list out;
        for (const TierStats& tier : pool.stats()) {
          py::dict row;
          row["speculative_num_steps"] = tier.speculative_num_steps;
          row["active"] = tier.active;
          row["activations"] = tier.activations;
          row["seconds_active"] = tier.seconds_active;
          out.append(row);
        }
        return out;
      }, "Per tier: steps, active, activations, seconds_active.");

  py::class_<AdaptiveConfig>(m, "AdaptiveConfig",
      "Adaptive policy settings; validated when a policy is built or validate() is called.")
      .def(py::init([](const std::string& policy, std::vector<int> candidate_steps, double ema_alpha,
                       int update_interval, int warmup_batches, double down_hysteresis,
                       double up_hysteresis, bool snap_initial_steps, double min_gain,
                       double cost_prior_slope, int probe_rounds, int probe_interval,
                       const std::string& acceptance_model) {
             AdaptiveConfig config;
             config.policy = policy_from_name(policy);
             config.candidate_steps = std::move(candidate_steps);
             config.ema_alpha = ema_alpha;
             config.update_interval = update_interval;
             config.warmup_batches = warmup_batches;
             config.down_hysteresis = down_hysteresis;
             config.up_hysteresis = up_hysteresis;
             config.snap_initial_steps = snap_initial_steps;
             config.min_gain = min_gain;
             config.cost_prior_slope = cost_prior_slope;
             config.probe_rounds = probe_rounds;
             config.probe_interval = probe_interval;
             config.acceptance_model = acceptance_model_from_name(acceptance_model);
             config.validate();
             return config;
           }),
           py::kw_only(), py::arg("policy") = std::string(policy_name(AdaptiveConfig{}.policy)),
           py::arg("candidate_steps") = std::vector<int>{1, 3, 7},
           py::arg("ema_alpha") = 0.2, py::arg("update_interval") = 5,
           py::arg("warmup_batches") = 10, py::arg("down_hysteresis") = -0.25,
           py::arg("up_hysteresis") = 0.0, py::arg("snap_initial_steps") = false,
           py::arg("min_gain") = 0.03, py::arg("cost_prior_slope") = 0.1,
           py::arg("probe_rounds") = 2, py::arg("probe_interval") = 50,
           py::arg("acceptance_model") = std::string("geometric"))
      .def_property_readonly("policy", [](const AdaptiveConfig& c) { return policy_name(c.policy); })
      .def_readonly("candidate_steps", &AdaptiveConfig::candidate_steps)
      .def_readonly("ema_alpha", &AdaptiveConfig::ema_alpha)
      .def_readonly("update_interval", &AdaptiveConfig::update_interval)
      .def_readonly("warmup_batches", &AdaptiveConfig::warmup_batches)
      .def_readonly("down_hysteresis", &AdaptiveConfig::down_hysteresis)
      .def_readonly("up_hysteresis", &AdaptiveConfig::up_hysteresis)
      .def_readonly("snap_initial_steps", &AdaptiveConfig::snap_initial_steps)
      .def_readonly("min_gain", &AdaptiveConfig::min_gain)
      .def_readonly("cost_prior_slope", &AdaptiveConfig::cost_prior_slope)
      .def_readonly("probe_rounds", &AdaptiveConfig::probe_rounds)
      .def_readonly("probe_interval", &AdaptiveConfig::probe_interval)
      .def_property_readonly("acceptance_model",
                             [](const AdaptiveConfig& c) { return acceptance_model_name(c.acceptance_model); })
      .def("validate", &AdaptiveConfig::validate)
      .def("to_dict", &config_to_dict)
      .def("__repr__", [](const AdaptiveConfig& c) {
        return "AdaptiveConfig(" + py::repr(config_to_dict(c)).cast<std::string>() + ")";
      });

  py::class_<AdaptiveSpeculativeParams>(m, "AdaptiveSpeculativeParams",
      "The adaptive policy (config.policy): sglang's EMA thresholds or goodput's "
      "argmax E(k)/cost(k).")
      .def(py::init([](int initial_steps, py::object config) {
             AdaptiveConfig cfg = config.is_none() ? AdaptiveConfig{} : config.cast<AdaptiveConfig>();
             return AdaptiveSpeculativeParams(initial_steps, std::move(cfg));
           }),
           py::arg("initial_steps"), py::arg("config") = py::none())
      .def("update", [](AdaptiveSpeculativeParams& params, const std::vector<int>& accept_lengths,
                        std::optional<double> round_seconds, bool sampled) {
             return params.update(accept_lengths,
                                  round_seconds.value_or(AdaptiveSpeculativeParams::kNoTiming), sampled);
           },
           py::arg("accept_lengths"), py::arg("round_seconds") = py::none(), py::arg("sampled") = false,
           "Feed one verify (accepted draft tokens per request, bonus excluded) made at "
           "current_steps, the round's wall time in seconds (None: untimed) and whether it "
           "sampled (not all-greedy); True only if the step count changed.")
      .def_property_readonly("current_steps", &AdaptiveSpeculativeParams::current_steps)
      .def_property_readonly("ema", &AdaptiveSpeculativeParams::ema)
      .def_property_readonly("alpha", &AdaptiveSpeculativeParams::alpha,
                             "Per-token acceptance estimate (goodput's model; 0.5 before any draft).")
      .def_property_readonly("num_batches", &AdaptiveSpeculativeParams::num_batches)
      .def_property_readonly("candidate_steps", &AdaptiveSpeculativeParams::candidate_steps)
      .def_property_readonly("config", &AdaptiveSpeculativeParams::config)
      .def_static("expected_tokens", &AdaptiveSpeculativeParams::expected_tokens,
                  py::arg("alpha"), py::arg("steps"),
                  "Expected tokens per round at `steps` drafts, bonus included.")
      .def("model_tokens", py::overload_cast<int>(&AdaptiveSpeculativeParams::model_tokens, py::const_), py::arg("steps"),
           "Expected tokens per round at `steps` under the configured acceptance model.")
      .def("position_acceptance", &AdaptiveSpeculativeParams::position_acceptance, py::arg("position"),
           "Positional model: acceptance rate of draft position 1..64 given the earlier ones were accepted.")
      .def("cost_estimates", [](const AdaptiveSpeculativeParams& params, int batch_size, bool sampled) {
             const auto costs = params.cost_estimates(batch_size, sampled);
             py::dict out;
             for (std::size_t j = 0; j < costs.size(); ++j) out[py::int_(params.candidate_steps()[j])] = costs[j];
             return out;
           },
           py::arg("batch_size") = 0, py::arg("sampled") = false,
           "Tier -> seconds per round for this batch size and kind of round (batch_size 0: the last "
           "round's table), measured or estimated.")
      .def("measured_costs", [](const AdaptiveSpeculativeParams& params) {
             const auto table = params.measured_costs();
             py::dict out;
             for (const char* kind : {"greedy", "sampled"}) out[kind] = py::dict();
             for (std::size_t t = 0; t < table.size(); ++t) {
               py::dict row;
               for (std::size_t j = 0; j < table[t].size(); ++j) {
                 if (!std::isnan(table[t][j])) row[py::int_(params.candidate_steps()[j])] = table[t][j];
               }
               const int bucket = static_cast<int>(t) % AdaptiveSpeculativeParams::kNumBuckets;
               const char* kind = static_cast<int>(t) < AdaptiveSpeculativeParams::kNumBuckets ? "greedy" : "sampled";
               if (py::len(row)) out[kind].cast<py::dict>()[py::int_(1 << bucket)] = row;
             }
             return out;
           },
           "{'greedy'|'sampled': {smallest batch size of a bucket: {tier: EMA of measured seconds per round}}}.");

  m.attr("MAX_STEPS") = AdaptiveConfig::kMaxSteps;

  // --- graph capture and replay ---
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

  py::class_<graph::GraphRunner, StageResource, std::shared_ptr<graph::GraphRunner>>(m, "GraphRunner",
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

  // quantized weights (torch.ops.specswap.ggml_*); ggml itself is loaded at run time
#ifdef SPECSWAP_WITH_GGML
  m.attr("with_ggml") = true;
  m.def("ggml_load", &quant::ggml_load, py::arg("library_dir"),
        "Load libggml-base.so and libggml-cpu.so from this folder (once).");
  m.def("ggml_loaded", &quant::ggml_loaded);
  m.def("ggml_row_bytes", &quant::ggml_row_bytes, py::arg("weight_type"), py::arg("in_features"));
  m.def("ggml_set_fast_kernels", &quant::set_fast_kernels, py::arg("enabled"),
        "Multi-row Q8_0/Q5_0/Q4_0/Q4_K/Q6_K kernels on (default where AVX2 exists) or off; returns the previous.");
  m.def("ggml_fast_kernels_available", &quant::fast_kernels_available);
  m.def("ggml_set_vnni", &quant::set_vnni, py::arg("enabled"),
        "The AVX-512 VNNI variant of the Q8_0-family kernels on (default where it exists) or off; same bits.");
  m.def("ggml_vnni_available", &quant::vnni_available);
#else
  m.attr("with_ggml") = false;
#endif
}
