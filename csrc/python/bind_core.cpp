// The C++ core for Python, one section each: runtime states and the state
// pool, AdaptiveConfig (every member, default and check from the table in
// core/adaptive_config_fields.h), the round observation, and the adaptive
// policy (a policy written in Python included).
#include <pybind11/stl.h>

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/adaptive_params.h"
#include "core/state_pool.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace specswap::python {
namespace {

// A stage resource is a Python object (the worker's per-tier buffers, a
// StageGraphs, a dict): the state holds it, Python reads it back unchanged.
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
  return std::make_shared<PyObjectResource>(std::move(object));
}

py::object unwrap_stage(const std::shared_ptr<const StageResource>& resource) {
  if (!resource) return py::none();
  if (auto* py_resource = dynamic_cast<const PyObjectResource*>(resource.get())) {
    return py_resource->object();
  }
  // A resource a C++ caller built (not through these bindings): opaque to Python.
  return py::str("<C++ stage resource>");
}

using StatePtr = std::shared_ptr<RuntimeState>;

StatePtr to_mutable(std::shared_ptr<const RuntimeState> state) {
  // pybind11 holders are non-const; the object itself is still immutable
  // (every field is const).
  return std::const_pointer_cast<RuntimeState>(std::move(state));
}

// ---- AdaptiveConfig from its field table ----------------------------------------
// A choice is a string in Python, every other field its own type.
template <class T> using PyValue = std::conditional_t<std::is_enum_v<T>, std::string, T>;

template <class T> PyValue<T> to_python(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return enum_name(value);
  } else {
    return value;
  }
}

template <class T> T from_python(PyValue<T> value) {
  if constexpr (std::is_enum_v<T>) {
    return enum_from_name<T>(value);
  } else {
    return value;
  }
}

template <std::size_t I>
using FieldType = typename std::tuple_element_t<I, std::remove_const_t<decltype(kAdaptiveConfigFields)>>::type;

py::dict config_to_dict(const AdaptiveConfig& config) {
  py::dict out;
  for_each_config_field([&](const auto& field) { out[field.name] = to_python(config.*field.member); });
  return out;
}

// AdaptiveConfig(*, policy=..., candidate_steps=..., ...): one keyword per
// field, typed, with the struct's default; validated before it is returned.
template <std::size_t... I>
void def_config_init(py::class_<AdaptiveConfig>& cls, std::index_sequence<I...>) {
  const AdaptiveConfig defaults;
  cls.def(py::init([](PyValue<FieldType<I>>... values) {
            AdaptiveConfig config;
            // a comma fold runs left to right: a bad choice is reported in table order
            ((config.*(std::get<I>(kAdaptiveConfigFields).member) = from_python<FieldType<I>>(std::move(values))),
             ...);
            config.validate();
            return config;
          }),
          py::kw_only(),
          py::arg_v(std::get<I>(kAdaptiveConfigFields).name,
                    to_python(defaults.*(std::get<I>(kAdaptiveConfigFields).member)))...);
}

py::list config_schema() {
  const AdaptiveConfig defaults;
  py::list out;
  for_each_config_field([&](const auto& field) {
    using T = typename std::decay_t<decltype(field)>::type;
    py::dict row;
    row["name"] = field.name;
    row["kind"] = field_kind<T>();
    row["default"] = to_python(defaults.*field.member);
    row["valid"] = valid_words(field);
    row["doc"] = field.doc;
    row["low"] = field.bounds.low;
    row["high"] = field.bounds.high;
    row["low_open"] = field.bounds.low_open;
    row["high_open"] = field.bounds.high_open;
    if constexpr (std::is_enum_v<T>) {
      py::list choices;
      for (const char* name : EnumNames<T>::names) choices.append(name);
      row["choices"] = choices;
    }
    out.append(row);
  });
  return out;
}

void bind_config(py::module_& m) {
  py::class_<AdaptiveConfig> cls(m, "AdaptiveConfig",
      "Adaptive policy settings; validated when a policy is built or validate() is called.");
  def_config_init(cls, std::make_index_sequence<std::tuple_size_v<decltype(kAdaptiveConfigFields)>>{});
  for_each_config_field([&](const auto& field) {
    cls.def_property_readonly(field.name, [member = field.member](const AdaptiveConfig& c) {
      return to_python(c.*member);
    }, field.doc);
  });
  cls.def("validate", &AdaptiveConfig::validate)
      .def("to_dict", &config_to_dict)
      .def("__repr__", [](const AdaptiveConfig& c) {
        return "AdaptiveConfig(" + py::repr(config_to_dict(c)).cast<std::string>() + ")";
      });
  m.def("adaptive_config_schema", &config_schema,
        "One dict per AdaptiveConfig field, in order: name, kind (choice, steps, integer, number, bool), "
        "default, valid (the rule in words), doc, low/high/low_open/high_open (bounds; steps: of each "
        "entry) and, for a choice, choices.");
}

// {rows: cost} (Python's table) to the C++ one: empty for an empty mapping; throws naming a bad table.
RowCosts row_costs_from(const std::map<int, double>& table) {
  std::vector<int> rows;
  std::vector<double> costs;
  for (const auto& [count, cost] : table) {
    rows.push_back(count);
    costs.push_back(cost);
  }
  return rows.empty() ? RowCosts{} : RowCosts(std::move(rows), std::move(costs));
}

py::dict row_costs_dict(const RowCosts& costs) {
  py::dict out;
  for (std::size_t i = 0; i < costs.rows().size(); ++i) out[py::int_(costs.rows()[i])] = costs.costs()[i];
  return out;
}

// ---- the policy's input: one round --------------------------------------------------------
// A RoundObservation that owns its numbers: Python builds one a round and reads one in a Python policy.
struct OwnedObservation {
  std::vector<int> accept_lengths, chain_accept_lengths, chain_depths, deep_checks, shadow_accept_lengths;
  double round_seconds = RoundObservation::kNoTiming;
  bool sampled = false;
  int shadow_steps = 0;
  int plain_requests = 0;

  RoundObservation view() const {
    RoundObservation round;
    round.accept_lengths = accept_lengths;
    round.round_seconds = round_seconds;
    round.sampled = sampled;
    round.chain_accept_lengths = chain_accept_lengths;
    round.chain_depths = chain_depths;
    round.deep_checks = deep_checks;
    round.shadow_accept_lengths = shadow_accept_lengths;
    round.shadow_steps = shadow_steps;
    round.plain_requests = plain_requests;
    return round;
  }

  static OwnedObservation of(const RoundObservation& round) {
    auto copy = [](std::span<const int> values) { return std::vector<int>(values.begin(), values.end()); };
    return {copy(round.accept_lengths), copy(round.chain_accept_lengths), copy(round.chain_depths),
            copy(round.deep_checks), copy(round.shadow_accept_lengths), round.round_seconds, round.sampled,
            round.shadow_steps, round.plain_requests};
  }
};

py::object seconds_or_none(double seconds) {
  return std::isnan(seconds) ? py::object(py::none()) : py::object(py::float_(seconds));
}

void bind_observation(py::module_& m) {
  using Ints = std::vector<int>;
  py::class_<OwnedObservation>(m, "RoundObservation",
      "Everything one round tells the policy (AdaptiveSpeculativeParams.observe): a verify at the current tier, "
      "or a plain decode in its place, and the drafter's tier-0 checks; each part empty where the round had none.")
      .def(py::init([](Ints accept_lengths, std::optional<double> round_seconds, bool sampled,
                       Ints chain_accept_lengths, Ints chain_depths, Ints deep_checks, Ints shadow_accept_lengths,
                       int shadow_steps, int plain_requests) {
             return OwnedObservation{std::move(accept_lengths), std::move(chain_accept_lengths),
                                     std::move(chain_depths), std::move(deep_checks),
                                     std::move(shadow_accept_lengths),
                                     round_seconds.value_or(RoundObservation::kNoTiming), sampled, shadow_steps,
                                     plain_requests};
           }),
           py::kw_only(), py::arg("accept_lengths") = Ints{}, py::arg("round_seconds") = py::none(),
           py::arg("sampled") = false, py::arg("chain_accept_lengths") = Ints{}, py::arg("chain_depths") = Ints{},
           py::arg("deep_checks") = Ints{}, py::arg("shadow_accept_lengths") = Ints{}, py::arg("shadow_steps") = 0,
           py::arg("plain_requests") = 0)
      .def_readonly("accept_lengths", &OwnedObservation::accept_lengths,
                    "The verify: accepted drafts (bonus excluded) of each request that speculated; [] for none.")
      .def_property_readonly("round_seconds", [](const OwnedObservation& o) { return seconds_or_none(o.round_seconds); },
                             "The verify's or plain decode's wall time (None: untimed).")
      .def_readonly("sampled", &OwnedObservation::sampled, "The round sampled (not all-greedy).")
      .def_readonly("chain_accept_lengths", &OwnedObservation::chain_accept_lengths,
                    "At a tree tier, per verified request: the drafts on its first-child path accepted.")
      .def_readonly("chain_depths", &OwnedObservation::chain_depths, "... and that path's depth.")
      .def_readonly("deep_checks", &OwnedObservation::deep_checks,
                    "At a chain tier, per verified request: 1 / 0 its next draft accepted / rejected, -1 unchecked.")
      .def_readonly("shadow_accept_lengths", &OwnedObservation::shadow_accept_lengths,
                    "What drafts of shadow_steps tokens would have accepted per request (tier-0 checks).")
      .def_readonly("shadow_steps", &OwnedObservation::shadow_steps)
      .def_readonly("plain_requests", &OwnedObservation::plain_requests,
                    "Requests of a plain decode run in the drafting tier's place (0: none).")
      .def("__repr__", [](const OwnedObservation& o) {
        return "RoundObservation(accept_lengths=" + py::repr(py::cast(o.accept_lengths)).cast<std::string>() +
               ", round_seconds=" + py::repr(seconds_or_none(o.round_seconds)).cast<std::string>() +
               ", shadow_accept_lengths=" + py::repr(py::cast(o.shadow_accept_lengths)).cast<std::string>() +
               ", plain_requests=" + std::to_string(o.plain_requests) + ")";
      });
}

// ---- a policy written in Python ------------------------------------------------------------
// Its object's observe(RoundObservation) returns the tier to run next (a Tier or its key), or None to stay.
class PythonPolicy final : public ModelFreePolicy {
 public:
  PythonPolicy(py::object policy, const AdaptiveConfig& config, const std::vector<int>& candidates,
               std::size_t index)
      : ModelFreePolicy(config, candidates, index), policy_(std::move(policy)), candidates_(candidates) {
    if (!py::hasattr(policy_, "observe") || !PyCallable_Check(policy_.attr("observe").ptr())) {
      throw py::type_error("a Python policy needs a method observe(round) -> tier or None; " +
                           py::repr(policy_).cast<std::string>() + " has none");
    }
  }
  ~PythonPolicy() override {
    if (!Py_IsInitialized()) {
      policy_.release();  // interpreter gone: leak rather than crash
      return;
    }
    py::gil_scoped_acquire gil;
    policy_ = py::object();
  }

  std::size_t observe(const RoundObservation& round, const PolicyState& state) override {
    py::gil_scoped_acquire gil;
    const py::object choice = policy_.attr("observe")(OwnedObservation::of(round));
    if (choice.is_none()) return state.index;
    const py::object key = py::hasattr(choice, "key") ? choice.attr("key") : choice;
    if (!py::isinstance<py::int_>(key) || py::isinstance<py::bool_>(key)) {
      throw py::type_error("a Python policy's observe() returns a Tier, a tier key or None, got " +
                           py::repr(choice).cast<std::string>());
    }
    const int wanted = key.cast<int>();
    for (std::size_t j = 0; j < candidates_.size(); ++j) {
      if (candidates_[j] == wanted) return j;
    }
    throw std::invalid_argument("the Python policy chose tier " + std::to_string(wanted) +
                                ", not a candidate (" + py::repr(py::cast(candidates_)).cast<std::string>() + ")");
  }

 private:
  py::object policy_;
  std::vector<int> candidates_;
};

// policy(tiers, start) -> an object with observe(): tiers the candidates' keys in order, start the initial key.
AdaptiveSpeculativeParams::PolicyFactory python_factory(const py::object& policy, const AdaptiveConfig& config) {
  if (policy.is_none()) return {};
  if (config.policy != PolicyKind::kPython) {
    throw std::invalid_argument(std::string("a policy object is for policy 'python'; the config's is '") +
                                policy_name(config.policy) + "'");
  }
  return [policy](const AdaptiveConfig& config, const std::vector<int>& candidates, std::size_t index) {
    py::gil_scoped_acquire gil;
    return std::make_unique<PythonPolicy>(policy(candidates, candidates[index]), config, candidates, index);
  };
}

// ---- the policy's driver ---------------------------------------------------------------------
void def_policy_statistics(py::class_<AdaptiveSpeculativeParams>& cls) {
  cls.def_property_readonly("current_tier", &AdaptiveSpeculativeParams::current_tier, "The active tier's key.")
      .def_property_readonly("ema", &AdaptiveSpeculativeParams::ema)
      .def_property_readonly("alpha", &AdaptiveSpeculativeParams::alpha,
                             "Per-token acceptance estimate (goodput's model; 0.5 before any draft).")
      .def_property_readonly("num_batches", &AdaptiveSpeculativeParams::num_batches)
      .def_property_readonly("candidate_tiers", &AdaptiveSpeculativeParams::candidate_tiers,
                             "The candidates' keys, in the policy's order.")
      .def_property_readonly("config", &AdaptiveSpeculativeParams::config)
      .def_static("expected_tokens", &AdaptiveSpeculativeParams::expected_tokens,
                  py::arg("alpha"), py::arg("steps"),
                  "Expected tokens per round at `steps` drafts, bonus included.")
      .def("model_tokens", py::overload_cast<int>(&AdaptiveSpeculativeParams::model_tokens, py::const_), py::arg("steps"),
           "Expected tokens per round at `steps` under the configured acceptance model, as goodput's "
           "decisions price it now (positional: the positions observed at the current tier and the checks "
           "past it, the deepest of them standing in beyond).")
      .def("position_acceptance", &AdaptiveSpeculativeParams::position_acceptance, py::arg("position"),
           "Positional model: acceptance rate of draft position 1..64 given the earlier ones were accepted.")
      .def("cost_estimates", [](const AdaptiveSpeculativeParams& params, int batch_size, bool sampled) {
             const auto costs = params.cost_estimates(batch_size, sampled);
             py::dict out;
             for (std::size_t j = 0; j < costs.size(); ++j) out[py::int_(params.candidate_tiers()[j])] = costs[j];
             return out;
           },
           py::arg("batch_size") = 0, py::arg("sampled") = false,
           "Tier -> seconds per round for this batch size and kind of round (batch_size 0: the last "
           "round's table), measured or estimated.")
      .def("drafting_can_pay", &AdaptiveSpeculativeParams::drafting_can_pay,
           "Whether some drafting tier could beat tier 0 at the last batch's costs with every draft accepted "
           "(False only once tier 0 was timed there); the drafter's tier-0 checks pause while it is False.")
      .def("measured_costs", [](const AdaptiveSpeculativeParams& params) {
             const auto table = params.measured_costs();
             py::dict out;
             for (const char* kind : {"greedy", "sampled"}) out[kind] = py::dict();
             for (std::size_t t = 0; t < table.size(); ++t) {
               py::dict row;
               for (std::size_t j = 0; j < table[t].size(); ++j) {
                 if (!std::isnan(table[t][j])) row[py::int_(params.candidate_tiers()[j])] = table[t][j];
               }
               const int bucket = static_cast<int>(t) % AdaptiveSpeculativeParams::kNumBuckets;
               const char* kind = static_cast<int>(t) < AdaptiveSpeculativeParams::kNumBuckets ? "greedy" : "sampled";
               if (py::len(row)) out[kind].cast<py::dict>()[py::int_(1 << bucket)] = row;
             }
             return out;
           },
           "{'greedy'|'sampled': {smallest batch size of a bucket: {tier: EMA of measured seconds per round}}}.");
}

void bind_policy(py::module_& m) {
  py::class_<AdaptiveSpeculativeParams> cls(m, "AdaptiveSpeculativeParams",
      "The adaptive policy (config.policy): sglang's EMA thresholds, goodput's argmax E(k)/cost(k), or a policy "
      "written in Python; fed one observe() a round.");
  cls.def(py::init([](int initial_tier, py::object config, py::object policy) {
            AdaptiveConfig cfg = config.is_none() ? AdaptiveConfig{} : config.cast<AdaptiveConfig>();
            const auto factory = python_factory(policy, cfg);
            return AdaptiveSpeculativeParams(initial_tier, std::move(cfg), factory);
          }),
          py::arg("initial_tier"), py::arg("config") = py::none(), py::arg("policy") = py::none(),
          "policy: for config policy 'python', policy(tiers, start) -> an object whose observe(RoundObservation) "
          "returns the tier to run next (a Tier or its key) or None; tiers are the candidates' keys, start the "
          "initial one's.")
      .def_static("tiers_for", &AdaptiveSpeculativeParams::tiers_for, py::arg("initial_tier"),
                  py::arg("config"),
                  "(the candidates' keys in the policy's order, the initial tier's index among them) for this "
                  "config started at initial_tier (a key).")
      .def("observe", [](AdaptiveSpeculativeParams& params, const OwnedObservation& round) {
             return params.observe(round.view());
           },
           py::arg("round"),
           "Feed one round (RoundObservation): its shadows, a plain decode in the tier's place, or a verify made "
           "at current_tier with its chain and checks past it. True only if the tier changed (on a verify only).")
      .def("update", [](AdaptiveSpeculativeParams& params, const std::vector<int>& accept_lengths,
                        std::optional<double> round_seconds, bool sampled) {
             return params.update(accept_lengths,
                                  round_seconds.value_or(AdaptiveSpeculativeParams::kNoTiming), sampled);
           },
           py::arg("accept_lengths"), py::arg("round_seconds") = py::none(), py::arg("sampled") = false,
           "observe() of a round that is a verify alone: accepted draft tokens per request (bonus excluded) at "
           "current_tier, the round's wall time in seconds (None: untimed), whether it sampled.")
      .def("shadow", [](AdaptiveSpeculativeParams& params, const std::vector<int>& accept_lengths, int steps) {
             RoundObservation round;
             round.shadow_accept_lengths = accept_lengths;
             round.shadow_steps = steps;
             params.observe(round);
           },
           py::arg("accept_lengths"), py::arg("steps"),
           "observe() of a round that is the drafter's tier-0 checks alone: what drafts of `steps` tokens would "
           "have accepted per request.")
      .def("set_row_costs", [](AdaptiveSpeculativeParams& params, std::optional<std::map<int, double>> costs) {
             params.set_row_costs(row_costs_from(costs.value_or(std::map<int, double>{})));
           },
           py::arg("row_costs"),
           "The verify's cost per row count ({rows: cost}, 1 among the rows; divided by the cost at 1), measured "
           "at start-up: goodput prices tiers never timed as cost_prior_slope per draft step plus the verify at "
           "their row count, interpolated between the counts given (None or {}: back to 1 + cost_prior_slope * k). "
           "ValueError on a bad table.")
      .def_property_readonly("row_costs", [](const AdaptiveSpeculativeParams& params) {
             return row_costs_dict(params.row_costs());
           },
           "The row costs set_row_costs() gave, divided by the cost at 1 row ({} if none).")
      .def("set_tier_surcharges", [](AdaptiveSpeculativeParams& params, const std::vector<double>& seconds) {
             params.set_tier_surcharges(seconds);
           }, py::arg("seconds"),
           "Seconds added to each candidate's estimated round cost (one per candidate, in order) where the goodput "
           "policy prices tiers: a hybrid's model drafter at its current share of rounds. Others ignore them.")
      .def("expect_shadows", &AdaptiveSpeculativeParams::expect_shadows,
           "The drafter sends shadow observations at tier 0 (every built-in drafter): it is not blind there, so "
           "goodput does not hold tier 0 back by blind_zero_margin and never probes out of tier 0.");
  def_policy_statistics(cls);
}

// ---- states and the pool ----------------------------------------------------------------------
void bind_states(py::module_& m) {
  py::class_<RowCosts>(m, "RowCosts",
      "The verify's relative cost per row count, as the goodput policy reads it (docs/policy.md).")
      .def(py::init([](const std::map<int, double>& table) {
             if (table.empty()) throw std::invalid_argument("row costs need at least two row counts, the first 1");
             return row_costs_from(table);
           }),
           py::arg("costs"), "{rows: cost}: 1 among the rows, costs finite and > 0; ValueError naming a bad one.")
      .def("at", &RowCosts::at, py::arg("rows"),
           "The relative cost at rows: linear between the counts, beyond the last along the last segment (never "
           "falling).")
      .def_property_readonly("costs", &row_costs_dict, "{rows: cost divided by the cost at 1 row}.");
  py::class_<RuntimeState, StatePtr>(m, "SpecRuntimeState",
      "Everything one decode round needs for one tier: its stages and the round that runs them. Immutable.")
      .def(py::init([](int speculative_num_steps, int speculative_num_draft_tokens,
                       py::object draft, py::object verify, py::object draft_extend, py::object round,
                       int speculative_eagle_topk) {
             return std::make_shared<RuntimeState>(
                 speculative_num_steps, speculative_num_draft_tokens,
                 wrap_stage(std::move(draft)), wrap_stage(std::move(verify)),
                 wrap_stage(std::move(draft_extend)), wrap_stage(std::move(round)), speculative_eagle_topk);
           }),
           py::arg("speculative_num_steps"), py::arg("speculative_num_draft_tokens"),
           py::arg("draft") = py::none(), py::arg("verify") = py::none(),
           py::arg("draft_extend") = py::none(), py::arg("round") = py::none(),
           py::arg("speculative_eagle_topk") = 1)
      .def_readonly("speculative_num_steps", &RuntimeState::speculative_num_steps)
      .def_readonly("speculative_eagle_topk", &RuntimeState::speculative_eagle_topk)
      .def_property_readonly("key", &RuntimeState::key, "The pool's key for this tier (tier_key)")
      .def_readonly("speculative_num_draft_tokens",
                    &RuntimeState::speculative_num_draft_tokens)
      .def_property_readonly("draft", [](const RuntimeState& s) { return unwrap_stage(s.draft); })
      .def_property_readonly("verify", [](const RuntimeState& s) { return unwrap_stage(s.verify); })
      .def_property_readonly("draft_extend",
                             [](const RuntimeState& s) { return unwrap_stage(s.draft_extend); })
      .def_property_readonly("round", [](const RuntimeState& s) { return unwrap_stage(s.round); })
      .def("__repr__", [](const RuntimeState& s) {
        return "SpecRuntimeState(speculative_num_steps=" +
               std::to_string(s.speculative_num_steps) +
               ", speculative_num_draft_tokens=" +
               std::to_string(s.speculative_num_draft_tokens) + ")";
      });

  m.def("tier_key", [](int steps, int topk, int tokens) { return tier_key({steps, topk, tokens}); },
        py::arg("speculative_num_steps"), py::arg("speculative_eagle_topk") = 1,
        py::arg("speculative_num_draft_tokens") = -1,
        "A tier's key in the state pool and the policy: a chain's step count, a tree's encoded shape.");
  m.def("tier_shape", [](int key) { return tier_shape(key); }, py::arg("key"),
        "(speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens) of a tier key.");
}

void bind_pool(py::module_& m) {
  py::class_<StatePool>(m, "StatePool",
      "One prebuilt runtime state per tier; acquire() is one atomic load and "
      "activate() one atomic store.")
      .def(py::init<>())
      .def("register", [](StatePool& pool, StatePtr state) { pool.register_state(std::move(state)); },
           py::arg("state"), "Add a prebuilt state; each tier once.")
      .def("activate", &StatePool::activate, py::arg("tier"),
           "Publish a registered tier (its key); True if the active tier changed.")
      .def("acquire", [](const StatePool& pool) -> py::object {
             auto state = pool.acquire_shared();
             if (!state) return py::none();
             return py::cast(to_mutable(std::move(state)));
           },
           "The active state (None before the first activate).")
      .def_property_readonly("active_tier", [](const StatePool& pool) -> py::object {
        const int key = pool.active_tier();
        if (key < 0) return py::none();
        return py::int_(key);
      }, "The active tier's key (None before the first activate).")
      .def_property_readonly("num_switches", &StatePool::num_switches)
      .def("tiers", &StatePool::tiers)
      .def("__contains__", &StatePool::contains)
      .def("__len__", &StatePool::size)
      .def("stats", [](const StatePool& pool) {
        py::list out;
        for (const TierStats& tier : pool.stats()) {
          py::dict row;
          row["speculative_num_steps"] = tier.tier;  // the key, by the stats' name for it
          row["active"] = tier.active;
          row["activations"] = tier.activations;
          row["seconds_active"] = tier.seconds_active;
          out.append(row);
        }
        return out;
      }, "Per tier: speculative_num_steps (its key), active, activations, seconds_active.");
}

}  // namespace

void bind_core(py::module_& m) {
  bind_states(m);
  bind_pool(m);
  bind_config(m);
  bind_observation(m);
  bind_policy(m);
}

}  // namespace specswap::python
