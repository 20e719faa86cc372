#include "graph/cpu/op_tape.h"

#include <ATen/core/List.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "graph/graph_runner.h"

namespace specswap::graph {
namespace {

constexpr auto kRecordKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
thread_local OpTape* tls_recording_tape = nullptr;

void record_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpTape* tape = tls_recording_tape;
  if (tape == nullptr) {
    c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
    op.callBoxed(stack);
    return;
  }
  tape->on_operator(op, stack);
}

}  // namespace

// The recording hook: a boxed fallback on a mode key that is switched on only
// while a tape records, on the recording thread.
TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&record_fallback>());
}

void OpTape::record(const std::function<void()>& body) {
  if (tls_recording_tape != nullptr) throw std::logic_error("OpTape::record cannot nest");
  entries_.clear();
  num_slots_ = 0;
  tls_recording_tape = this;
  try {
    c10::impl::IncludeDispatchKeyGuard include(kRecordKey);
    body();
  } catch (...) {
    tls_recording_tape = nullptr;
    slot_of_impl_.clear();
    keep_alive_.clear();
    entries_.clear();
    throw;
  }
  tls_recording_tape = nullptr;
  finish();
}

OpTape::TensorRef OpTape::ref_for(const at::Tensor& tensor) const {
  const void* impl = tensor.unsafeGetTensorImpl();
  // newest first: an in-place op re-maps its output to a new slot
  for (auto it = slot_of_impl_.rbegin(); it != slot_of_impl_.rend(); ++it) {
    if (it->first == impl) return TensorRef{it->second, {}};
  }
  return TensorRef{-1, tensor};
}

OpTape::Arg OpTape::arg_for(const c10::IValue& value) const {
  Arg arg;
  if (value.isTensor()) {
    arg.kind = Arg::Kind::kTensor;
    arg.tensor = ref_for(value.toTensor());
  } else if (value.isTensorList()) {
    arg.kind = Arg::Kind::kTensorList;
    for (const at::Tensor& t : value.toTensorVector()) arg.list.emplace_back(ref_for(t));
  } else if (value.isList() && value.toListRef().size() > 0 &&
             std::any_of(value.toListRef().begin(), value.toListRef().end(),
                         [](const c10::IValue& v) { return v.isTensor(); })) {
    arg.kind = Arg::Kind::kOptionalTensorList;
    for (const c10::IValue& v : value.toListRef()) {
      if (v.isNone()) {
        arg.list.emplace_back(std::nullopt);
      } else {
        arg.list.emplace_back(ref_for(v.toTensor()));
      }
    }
  } else {
    arg.kind = Arg::Kind::kConstant;
    arg.constant = value;
  }
  return arg;
}

int OpTape::new_slot(const at::Tensor& tensor) {
  const int slot = num_slots_++;
  slot_of_impl_.emplace_back(tensor.unsafeGetTensorImpl(), slot);
  keep_alive_.emplace_back(tensor);
  return slot;
}

namespace {
// Uninitialised allocations whose contents the caller fills outside the
// dispatcher: torch.tensor(python_data) is aten::empty + a memcpy + lift_fresh.
// Replaying the allocation would hand later ops fresh garbage, so the tensor
// made at capture (with the data written into it) is kept as a constant.
bool is_raw_allocation(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().operator_name().name;
  return name == "aten::empty" || name == "aten::empty_strided";
}
}  // namespace

void OpTape::on_operator(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (is_raw_allocation(op)) {
    // not recorded: later operators see its output as a constant
    c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
    op.callBoxed(stack);
    return;
  }
  const auto& schema = op.schema();
  const std::size_t num_args = schema.arguments().size();
  Entry entry{op, {}, {}, {}, {}};
  entry.args.reserve(num_args);
  for (std::size_t i = stack->size() - num_args; i < stack->size(); ++i) {
    entry.args.push_back(arg_for((*stack)[i]));
  }
  max_stack_ = std::max(max_stack_, num_args);
  {
    c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
    op.callBoxed(stack);
  }
  const std::size_t num_returns = schema.returns().size();
  for (std::size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    const c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      entry.outputs.push_back({new_slot(value.toTensor())});
      entry.output_is_list.push_back(false);
    } else if (value.isTensorList()) {
      std::vector<int> slots;
      for (const at::Tensor& t : value.toTensorVector()) slots.push_back(new_slot(t));
      entry.outputs.push_back(std::move(slots));
      entry.output_is_list.push_back(true);
    } else if (value.isNone()) {
      entry.outputs.push_back({});
      entry.output_is_list.push_back(false);
    } else {
      throw std::runtime_error(
          "graph capture: " + schema.operator_name().name + " returns a host value (" +
          value.tagKind() + "), which a captured graph would freeze; keep host syncs "
          "(item(), bool of a tensor, data-dependent shapes) out of the captured region");
    }
  }
  entries_.push_back(std::move(entry));
}

void OpTape::finish() {
  // Free each intermediate right after its last use, as eager would.
  std::vector<int> last_use(num_slots_, -1);
  auto touch = [&](const TensorRef& ref, int index) {
    if (ref.slot >= 0) last_use[ref.slot] = index;
  };
  for (int index = 0; index < static_cast<int>(entries_.size()); ++index) {
    for (const Arg& arg : entries_[index].args) {
      if (arg.kind == Arg::Kind::kTensor) touch(arg.tensor, index);
      for (const auto& item : arg.list) {
        if (item) touch(*item, index);
      }
    }
    for (const auto& slots : entries_[index].outputs) {
      for (int slot : slots) last_use[slot] = std::max(last_use[slot], index);
    }
  }
  for (int slot = 0; slot < num_slots_; ++slot) {
    if (last_use[slot] >= 0) entries_[last_use[slot]].release_after.push_back(slot);
  }
  slot_of_impl_.clear();
  keep_alive_.clear();
}

void OpTape::replay() const {
  std::vector<c10::IValue> slots(static_cast<std::size_t>(num_slots_));
  torch::jit::Stack stack;
  stack.reserve(max_stack_ + 4);
  auto resolve = [&](const TensorRef& ref) -> at::Tensor {
    return ref.slot >= 0 ? slots[ref.slot].toTensor() : ref.constant;
  };
  for (const Entry& entry : entries_) {
    stack.clear();
    for (const Arg& arg : entry.args) {
      switch (arg.kind) {
        case Arg::Kind::kConstant:
          stack.push_back(arg.constant);
          break;
        case Arg::Kind::kTensor:
          stack.emplace_back(resolve(arg.tensor));
          break;
        case Arg::Kind::kTensorList: {
          c10::List<at::Tensor> list;
          list.reserve(arg.list.size());
          for (const auto& item : arg.list) list.push_back(resolve(*item));
          stack.emplace_back(std::move(list));
          break;
        }
        case Arg::Kind::kOptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(arg.list.size());
          for (const auto& item : arg.list) {
            list.push_back(item ? std::optional<at::Tensor>(resolve(*item)) : std::nullopt);
          }
          stack.emplace_back(std::move(list));
          break;
        }
      }
    }
    entry.op.callBoxed(&stack);
    const std::size_t first = stack.size() - entry.outputs.size();
    for (std::size_t i = 0; i < entry.outputs.size(); ++i) {
      const auto& out_slots = entry.outputs[i];
      if (out_slots.empty()) continue;
      if (entry.output_is_list[i]) {
        auto tensors = stack[first + i].toTensorVector();
        for (std::size_t j = 0; j < out_slots.size(); ++j) slots[out_slots[j]] = std::move(tensors[j]);
      } else {
        slots[out_slots[0]] = std::move(stack[first + i]);
      }
    }
    for (int slot : entry.release_after) slots[slot] = c10::IValue();
  }
}

std::size_t OpTape::constant_bytes(const GraphPool& pool, std::vector<const void*> seen) const {
  std::size_t bytes = 0;
  auto count = [&](const TensorRef& ref) {
    if (ref.slot >= 0 || !ref.constant.defined() || pool.is_shared(ref.constant)) return;
    const void* storage = ref.constant.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), storage) != seen.end()) return;
    seen.push_back(storage);
    bytes += ref.constant.storage().nbytes();
  };
  for (const Entry& entry : entries_) {
    for (const Arg& arg : entry.args) {
      if (arg.kind == Arg::Kind::kTensor) count(arg.tensor);
      for (const auto& item : arg.list) {
        if (item) count(*item);
      }
    }
  }
  return bytes;
}

namespace {

class CpuGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "cpu"; }

 protected:
  void do_capture(const std::function<void()>& body) override { tape_.record(body); }
  void do_replay() override { tape_.replay(); }
  std::size_t backend_bytes() const override {
    // constants the tape holds that are neither shared nor the runner's own buffers
    std::vector<const void*> own;
    for (const auto& name : buffer_names()) own.push_back(buffer(name).storage().unsafeGetStorageImpl());
    return tape_.constant_bytes(*pool(), std::move(own));
  }

 private:
  OpTape tape_;
};

}  // namespace

std::shared_ptr<GraphRunner> make_cpu_runner(Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool) {
  return std::make_shared<CpuGraphRunner>(stage, steps, bucket, std::move(pool));
}

}  // namespace specswap::graph
