#include "graph/cpu/op_tape.h"

#include <ATen/Functions.h>
#include <ATen/core/List.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "graph/graph_runner.h"

namespace specswap::graph {
namespace {

// The recording hook sits on TESTING_ONLY_GenericMode, a mode key (switched
// on per thread through the local dispatch key set, not carried by tensors).
// Why this key (docs/graphs.md, "Why a testing dispatch key"):
//  - It is the highest-priority key the C++ dispatcher visits (only PreDispatch
//    and PythonDispatcher rank above it), so the fallback sees each operator as
//    the caller called it, before Python modes, functorch, autocast, autograd
//    and BackendSelect, and a CompositeImplicitAutograd operator before it is
//    decomposed: the tape itself decides to decompose it or record it whole.
//  - Torch registers no kernel or fallback for it and never switches it on
//    (only its own dispatcher unit test does, which the wheel does not ship).
//    Every other key at that height belongs to torch: PythonDispatcher,
//    PreDispatch, Python, PythonTLSSnapshot, FuncTorchDynamicLayerFrontMode,
//    BackendSelect and the Autocast keys all carry torch's fallbacks, and a
//    second fallback on a key is refused at registration.
// What guarantees it: the key is on only inside OpTape::record, on the
// recording thread (IncludeDispatchKeyGuard, thread-local); replay
// redispatches with the keys captured below it, so it never passes the hook;
// if anything else switches the key on, the fallback runs the operator with
// the key excluded, so it is transparent there; if another library registers a
// fallback on it, loading the extension fails (torch refuses a second one)
// instead of recording wrongly; and a torch that renames the key fails to
// compile this file (torch is pinned, pyproject.toml).
constexpr auto kRecordKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
thread_local OpTape* tls_recording_tape = nullptr;

// A host value inside the recorded region; a composite that hits one is recorded whole.
struct HostValueError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void record_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  OpTape* tape = tls_recording_tape;
  if (tape == nullptr) {
    c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
    op.callBoxed(stack);
    return;
  }
  tape->on_operator(op, keys.remove(kRecordKey), stack);
}

void call_unrecorded(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
  op.callBoxed(stack);
}

// A tensor over memory a recorded operator made that the tape cannot map to a slot (ref_for).
struct UnfollowedTensor : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Uninitialised allocations whose contents the caller fills outside the
// dispatcher: torch.tensor(python_data) is aten::empty + a memcpy + lift_fresh.
// Replaying the allocation would hand later ops fresh garbage, so the tensor
// made at capture (with the data written into it) is kept as a constant; if a
// recorded operator writes into it, its content before that write is restored
// at the start of every replay (OpTape::save_before_write).
bool is_raw_allocation(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().operator_name().name;
  return name == "aten::empty" || name == "aten::empty_strided";
}

// An operator that only calls other operators (linear -> t, mm; matmul -> view, mm, _unsafe_view).
bool is_composite(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

// Returns aliases of its inputs and writes nothing: t, view, slice, transpose, expand, ...
bool is_view(const c10::FunctionSchema& schema) {
  const auto& returns = schema.returns();
  return !returns.empty() && !schema.is_mutable() &&
         std::all_of(returns.begin(), returns.end(), [](const c10::Argument& ret) {
           return ret.alias_info() != nullptr && !ret.alias_info()->isWrite();
         });
}

// Where a tensor's storage starts and ends (0, 0: no plain memory, e.g. a repacked mkldnn weight, or none).
std::pair<std::uintptr_t, std::uintptr_t> storage_range(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.layout() != c10::kStrided || !tensor.has_storage()) return {0, 0};
  const c10::Storage& storage = tensor.storage();
  const auto start = reinterpret_cast<std::uintptr_t>(storage.data());
  if (start == 0 || storage.nbytes() == 0) return {0, 0};
  return {start, start + storage.nbytes()};
}

// The first byte a tensor views (0: no plain memory).
std::uintptr_t address_of(const at::Tensor& tensor) {
  const auto [start, end] = storage_range(tensor);
  if (start == 0) return 0;
  return start + static_cast<std::uintptr_t>(tensor.storage_offset() * static_cast<int64_t>(tensor.itemsize()));
}

// The block of `blocks` ([start, end) by start) holding `address`, or end().
template <typename Map>
auto block_holding(Map& blocks, std::uintptr_t address) {
  auto it = blocks.upper_bound(address);
  if (it == blocks.begin()) return blocks.end();
  --it;
  const std::uintptr_t end = [&] {
    if constexpr (std::is_same_v<typename Map::mapped_type, std::uintptr_t>) {
      return it->second;
    } else {
      return it->second.end;
    }
  }();
  return address < end ? it : blocks.end();
}

// Same memory, seen the same way: what a shallow copy of a tensor (a new TensorImpl) keeps.
bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return address_of(a) == address_of(b) && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.device() == b.device();
}

// The row index of aten::index(self, [rows]) when that is a gather of whole rows of dim 0 by a 1-D
// integer tensor (how every layer reads its request's KV-cache row: key_buffer[slots, :, :L]).
std::optional<at::Tensor> gathered_rows(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& name = op.schema().operator_name();
  if (name.name != "aten::index" || name.overload_name != "Tensor") return std::nullopt;
  const auto indices = stack.back().toListRef();
  if (indices.empty() || !indices[0].isTensor()) return std::nullopt;
  for (std::size_t i = 1; i < indices.size(); ++i) {
    if (!indices[i].isNone()) return std::nullopt;
  }
  const at::Tensor& rows = indices[0].toTensor();
  if (rows.dim() != 1 || (rows.scalar_type() != at::kLong && rows.scalar_type() != at::kInt)) return std::nullopt;
  return rows;
}

}  // namespace

// The recording hook: a boxed fallback on kRecordKey (why that key: above).
TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&record_fallback>());
}

void OpTape::record(const std::function<void()>& body, GraphPool* pool) {
  if (tls_recording_tape != nullptr) throw std::logic_error("OpTape::record cannot nest");
  entries_.clear();
  restores_.clear();
  num_slots_ = 0;
  pool_ = pool;
  tls_recording_tape = this;
  try {
    c10::impl::IncludeDispatchKeyGuard include(kRecordKey);
    body();
  } catch (...) {
    tls_recording_tape = nullptr;
    pool_ = nullptr;
    slot_of_impl_.clear();
    made_.clear();
    raw_.clear();
    folded_.clear();
    keep_alive_.clear();
    entries_.clear();
    restores_.clear();
    throw;
  }
  tls_recording_tape = nullptr;
  pool_ = nullptr;
  finish();
}

// A tensor is known by its TensorImpl first; where that misses but its memory was made by a recorded
// operator, by its memory and geometry. Identity alone is not enough: torch's Python factories (torch.zeros,
// ones, full, zeros_like, full_like, arange(dtype=), eye) pass their result through autograd's make_variable,
// which hands Python a shallow copy (a new TensorImpl over the same storage) whenever another reference to the
// result exists, and the tape holds one (keep_alive_, so that addresses stay unique while recording). Taken for
// a constant, such a tensor pinned the capture's memory: replay wrote into it again (torch.zeros(4).add_(x)
// gave 2, 3, 4). Matching by memory follows any wrapper that keeps the storage, where holding outputs some
// other way would rely on make_variable's reference count test staying as it is. Memory that existed before
// the capture (weights, caches, buffers) is not matched this way: it stays what it was, a constant.
OpTape::TensorRef OpTape::ref_for(const at::Tensor& tensor) const {
  const void* impl = tensor.unsafeGetTensorImpl();
  // newest first: an in-place op re-maps its output to a new slot
  for (auto it = slot_of_impl_.rbegin(); it != slot_of_impl_.rend(); ++it) {
    if (it->impl == impl) return TensorRef{it->slot, {}};
  }
  const std::uintptr_t address = address_of(tensor);
  // (aten::empty's memory is a constant, even where it took the place of a block made_ still lists)
  if (address != 0 && block_holding(made_, address) != made_.end() && block_holding(raw_, address) == raw_.end()) {
    for (auto it = slot_of_impl_.rbegin(); it != slot_of_impl_.rend(); ++it) {
      if (same_view(it->tensor, tensor)) return TensorRef{it->slot, {}};
    }
    throw UnfollowedTensor(
        "uses a tensor over memory made during the capture that no recorded operator returned in that shape (a "
        "view made outside torch's operators, e.g. through numpy or DLPack): replay could not follow it to the "
        "memory the replay makes; make that view with torch operators");
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

std::vector<OpTape::Arg> OpTape::args_on(const torch::jit::Stack& stack, std::size_t num_args) const {
  std::vector<Arg> args;
  args.reserve(num_args);
  for (std::size_t i = stack.size() - num_args; i < stack.size(); ++i) args.push_back(arg_for(stack[i]));
  return args;
}

bool OpTape::reads_slots(const std::vector<Arg>& args) {
  for (const auto& arg : args) {
    if (arg.kind == Arg::Kind::kTensor && arg.tensor.slot >= 0) return true;
    for (const auto& item : arg.list) {
      if (item && item->slot >= 0) return true;
    }
  }
  return false;
}

int OpTape::new_slot(const at::Tensor& tensor) {
  const int slot = num_slots_++;
  slot_of_impl_.push_back(Known{tensor.unsafeGetTensorImpl(), slot, tensor});
  keep_alive_.emplace_back(tensor);
  return slot;
}

void OpTape::on_operator(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  try {
    record_operator(op, keys, stack);
  } catch (const UnfollowedTensor& error) {
    throw std::runtime_error("graph capture: " + op.schema().operator_name().name + " " + error.what());
  }
}

// Before a recorded operator writes into memory aten::empty made unrecorded during the capture (a constant of
// the tape, as torch.tensor(data) is), that memory's content is saved, to be restored at the start of each
// replay: every replay then starts from what eager started from, and earlier reads of it see the same.
// An in-place view (tagged inplace_view: detach_, which torch.tensor(data) calls, squeeze_, set_, ...) changes
// a tensor's metadata, not its memory.
void OpTape::save_before_write(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (raw_.empty() || op.hasTag(at::Tag::inplace_view)) return;
  const auto& arguments = op.schema().arguments();
  const std::size_t base = stack.size() - arguments.size();
  auto save = [&](const at::Tensor& tensor) {
    const auto block = block_holding(raw_, address_of(tensor));
    if (block == raw_.end() || block->second.saved) return;
    const c10::Storage& storage = block->second.storage;
    std::vector<char> saved(storage.nbytes());
    std::memcpy(saved.data(), storage.data(), saved.size());
    restores_.push_back(Restore{storage, std::move(saved)});
    block->second.saved = true;
  };
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    const c10::IValue& value = stack[base + i];
    if (value.isTensor()) {
      save(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorVector()) save(tensor);
    }
  }
}

void OpTape::record_operator(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (is_raw_allocation(op)) {
    call_unrecorded(op, stack);  // not recorded: later operators see its output as a constant
    const at::Tensor& made = stack->back().toTensor();
    const auto [start, end] = storage_range(made);
    if (start != 0) {
      raw_[start] = RawBlock{end, made.storage()};
      keep_alive_.emplace_back(made);  // its address stays its own while recording
    }
    return;
  }
  save_before_write(op, *stack);
  const auto& schema = op.schema();
  const std::size_t num_args = schema.arguments().size();
  if (is_composite(op)) {
    decompose(op, keys, stack);
    return;
  }
  if (auto rows = gathered_rows(op, *stack)) {
    record_row_gather(op, keys, *rows, stack);
    return;
  }
  if (pool_ != nullptr && pool_->pack_linear_weights() && record_packed_linear(op, stack)) return;
  std::vector<Arg> args = args_on(*stack, num_args);
  call_unrecorded(op, stack);
  if (is_view(schema) && !reads_slots(args)) {
    // a view of weights or buffers has the same sizes and strides every replay: keep the capture's as a constant
    for (std::size_t i = stack->size() - schema.returns().size(); i < stack->size(); ++i) {
      for (const at::Tensor& t : (*stack)[i].isTensor() ? std::vector<at::Tensor>{(*stack)[i].toTensor()}
                                                         : (*stack)[i].toTensorVector()) {
        folded_.push_back(t.unsafeGetTensorImpl());
        keep_alive_.emplace_back(t);
      }
    }
    return;
  }
  record_entry(Entry{op, keys, std::move(args), {}, {}, {}}, *stack);
}

// index_select copies the same rows faster than the general index kernel (docs/graphs.md). Recorded in
// its place only where it returns the very same tensor (sizes, strides, values: a copy either way).
void OpTape::record_row_gather(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const at::Tensor& rows,
                               torch::jit::Stack* stack) {
  static const auto index_select = c10::Dispatcher::singleton().findSchemaOrThrow("aten::index_select", "");
  const at::Tensor self = (*stack)[stack->size() - 2].toTensor();
  std::vector<Arg> args = args_on(*stack, 2);
  call_unrecorded(op, stack);
  const at::Tensor& gathered = stack->back().toTensor();
  at::Tensor selected;
  {
    c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
    selected = at::index_select(self, 0, rows);
  }
  if (selected.sizes() != gathered.sizes() || selected.strides() != gathered.strides()) {
    record_entry(Entry{op, keys, std::move(args), {}, {}, {}}, *stack);
    return;
  }
  stack->back() = selected;
  std::vector<Arg> select_args{std::move(args[0]), arg_for(c10::IValue(0)), arg_for(c10::IValue(rows))};
  record_entry(Entry{index_select, keys, std::move(select_args), {}, {}, {}}, *stack);
}

// aten::mm(x, weight.t()) in bf16 on the CPU, weight a contiguous [N, K] tensor that existed before capture:
// recorded as mkldnn::_linear_pointwise over the weight repacked once for oneDNN (shared by every runner of
// the pool), which skips the per-call weight handling of a plain matmul, the part that dominates at the few
// rows a decode step has (docs/graphs.md). Only where it returns the very same bits as mm at capture; otherwise mm is recorded.
bool OpTape::record_packed_linear(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  if (name.name != "aten::mm" || !name.overload_name.empty()) return false;
  const at::Tensor x = (*stack)[stack->size() - 2].toTensor();
  const at::Tensor transposed = stack->back().toTensor();
  if (x.device().type() != c10::DeviceType::CPU || x.scalar_type() != at::kBFloat16 ||
      transposed.scalar_type() != at::kBFloat16 || x.dim() != 2 || transposed.dim() != 2 ||
      transposed.is_mkldnn() || ref_for(transposed).slot >= 0) {
    return false;
  }
  const at::Tensor weight = transposed.t();  // [N, K]
  if (!weight.is_contiguous()) return false;
  static const auto reorder =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "");
  static const auto linear = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  auto linear_stack = [&](const at::Tensor& packed) {
    return torch::jit::Stack{x, packed, c10::IValue(), c10::IValue(std::string("none")),
                             c10::IValue(c10::List<std::optional<c10::Scalar>>()),
                             c10::IValue(std::string(""))};
  };
  at::Tensor packed;
  {
    c10::impl::ExcludeDispatchKeyGuard guard(kRecordKey);
    packed = pool_->derived(weight.data_ptr(), [&] {
      torch::jit::Stack call{weight, c10::IValue()};
      reorder.callBoxed(&call);
      return call.back().toTensor();
    });
    torch::jit::Stack check = linear_stack(packed);
    linear.callBoxed(&check);
    if (!at::equal(check.back().toTensor(), at::mm(x, transposed))) return false;
  }
  // called with recording on: the fallback records it with the keys eager dispatch picks for these arguments
  torch::jit::Stack call = linear_stack(packed);
  linear.callBoxed(&call);
  stack->resize(stack->size() - 2);
  stack->push_back(std::move(call.back()));
  return true;
}

void OpTape::decompose(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t num_args = schema.arguments().size();
  const std::size_t base = stack->size() - num_args;
  const std::vector<c10::IValue> inputs(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  const std::size_t first_entry = entries_.size();
  const std::size_t first_mapping = slot_of_impl_.size();
  // Record what the composite calls (recording stays on below it) ...
  bool stopped = false;
  try {
    op.redispatchBoxed(keys, stack);
  } catch (const HostValueError&) {
    // it needs a host value inside (aten::item reads _local_scalar_dense): record it whole, so a
    // host value it returns is refused below and one it only uses is recomputed on every replay
    stopped = true;
  }
  bool whole = stopped;
  // ... unless it returns a tensor made outside the dispatcher, which replay could not reproduce.
  auto known = [&](const at::Tensor& t) {
    const void* impl = t.unsafeGetTensorImpl();
    auto same = [impl](const Known& known) { return known.impl == impl; };
    if (std::any_of(slot_of_impl_.begin() + static_cast<std::ptrdiff_t>(first_mapping), slot_of_impl_.end(), same)) {
      return true;
    }
    if (std::find(folded_.begin(), folded_.end(), impl) != folded_.end()) return true;
    return std::any_of(inputs.begin(), inputs.end(), [impl](const c10::IValue& v) {
      return v.isTensor() && v.toTensor().unsafeGetTensorImpl() == impl;
    });
  };
  const std::size_t num_returns = schema.returns().size();
  for (std::size_t i = stack->size() - num_returns; !whole && i < stack->size(); ++i) {
    const c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      whole = !known(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) whole = whole || !known(t);
    } else if (!value.isNone()) {
      whole = true;
    }
  }
  if (!whole) return;
  // Record it as one operator instead: forget what it called.
  for (std::size_t i = first_entry; stopped && i < entries_.size(); ++i) {
    if (entries_[i].op.schema().is_mutable()) {  // running it again would write twice
      throw std::runtime_error("graph capture: " + schema.operator_name().name + " wrote through " +
                               entries_[i].op.schema().operator_name().name +
                               " before it needed a host value; it cannot be recorded");
    }
  }
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(first_entry), entries_.end());
  slot_of_impl_.resize(first_mapping);
  std::vector<Arg> args;
  args.reserve(num_args);
  for (const c10::IValue& value : inputs) args.push_back(arg_for(value));
  if (stopped) {
    // the decomposition stopped halfway: run it again in one piece
    stack->resize(base);
    stack->insert(stack->end(), inputs.begin(), inputs.end());
    call_unrecorded(op, stack);
  }
  record_entry(Entry{op, keys, std::move(args), {}, {}, {}}, *stack);
}

void OpTape::record_entry(Entry entry, const torch::jit::Stack& stack) {
  const auto& schema = entry.op.schema();
  const std::size_t num_returns = schema.returns().size();
  for (std::size_t i = stack.size() - num_returns; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    // a return that aliases no argument is memory the operator made (zeros, add, index_select, ...)
    const bool made = schema.returns()[i - (stack.size() - num_returns)].alias_info() == nullptr;
    auto note = [&](const at::Tensor& tensor) {
      const auto [start, end] = storage_range(tensor);
      if (made && start != 0) made_[start] = end;
      return new_slot(tensor);
    };
    if (value.isTensor()) {
      entry.outputs.push_back({note(value.toTensor())});
      entry.output_is_list.push_back(false);
    } else if (value.isTensorList()) {
      std::vector<int> slots;
      for (const at::Tensor& t : value.toTensorVector()) slots.push_back(note(t));
      entry.outputs.push_back(std::move(slots));
      entry.output_is_list.push_back(true);
    } else if (value.isNone()) {
      entry.outputs.push_back({});
      entry.output_is_list.push_back(false);
    } else {
      throw HostValueError(
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
  std::size_t max_args = 0;
  for (int slot = 0; slot < num_slots_; ++slot) {
    if (last_use[slot] >= 0) entries_[last_use[slot]].release_after.push_back(slot);
  }
  for (const Entry& entry : entries_) max_args = std::max(max_args, entry.args.size() + entry.outputs.size());
  slots_.assign(static_cast<std::size_t>(num_slots_), c10::IValue());
  stack_.reserve(max_args);
  slot_of_impl_.clear();
  made_.clear();
  raw_.clear();
  folded_.clear();
  keep_alive_.clear();
}

void OpTape::replay() {
  auto resolve = [&](const TensorRef& ref) -> const at::Tensor& {
    return ref.slot >= 0 ? slots_[ref.slot].toTensor() : ref.constant;
  };
  for (Restore& restore : restores_) {
    std::memcpy(restore.storage.mutable_data(), restore.saved.data(),
                std::min(restore.saved.size(), restore.storage.nbytes()));
  }
  for (const Entry& entry : entries_) {
    stack_.clear();
    for (const Arg& arg : entry.args) {
      switch (arg.kind) {
        case Arg::Kind::kConstant:
          stack_.push_back(arg.constant);
          break;
        case Arg::Kind::kTensor:
          stack_.emplace_back(resolve(arg.tensor));
          break;
        case Arg::Kind::kTensorList: {
          c10::List<at::Tensor> list;
          list.reserve(arg.list.size());
          for (const auto& item : arg.list) list.push_back(resolve(*item));
          stack_.emplace_back(std::move(list));
          break;
        }
        case Arg::Kind::kOptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(arg.list.size());
          for (const auto& item : arg.list) {
            list.push_back(item ? std::optional<at::Tensor>(resolve(*item)) : std::nullopt);
          }
          stack_.emplace_back(std::move(list));
          break;
        }
      }
    }
    // straight to the kernel eager reached (the keys were computed at capture)
    entry.op.redispatchBoxed(entry.keys, &stack_);
    const std::size_t first = stack_.size() - entry.outputs.size();
    for (std::size_t i = 0; i < entry.outputs.size(); ++i) {
      const auto& out_slots = entry.outputs[i];
      if (out_slots.empty()) continue;
      if (entry.output_is_list[i]) {
        auto tensors = stack_[first + i].toTensorVector();
        for (std::size_t j = 0; j < out_slots.size(); ++j) slots_[out_slots[j]] = std::move(tensors[j]);
      } else {
        slots_[out_slots[0]] = std::move(stack_[first + i]);
      }
    }
    for (int slot : entry.release_after) slots_[slot] = c10::IValue();
  }
  stack_.clear();
}

std::size_t OpTape::constant_bytes(const GraphPool& pool, std::vector<const void*> seen) const {
  std::size_t bytes = 0;
  auto count = [&](const TensorRef& ref) {
    // (a repacked weight has no storage; the pool counts it once: GraphPool::derived_bytes)
    if (ref.slot >= 0 || !ref.constant.defined() || ref.constant.is_mkldnn() || pool.is_shared(ref.constant)) {
      return;
    }
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
  for (const Restore& restore : restores_) bytes += restore.saved.size();
  return bytes;
}

namespace {

class CpuGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "cpu"; }

 protected:
  void do_capture(const std::function<void()>& body) override { tape_.record(body, pool().get()); }
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

// The CPU needs no pool of its own: GraphPool carries the device (and the repacked weights).
SPECSWAP_REGISTER_GRAPH_BACKEND(c10::DeviceType::CPU,
                                GraphBackend{"cpu",
                                             [](c10::Device device) { return std::make_shared<GraphPool>(device); },
                                             [](Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool)
                                                 -> std::shared_ptr<GraphRunner> {
                                               return std::make_shared<CpuGraphRunner>(stage, steps, bucket,
                                                                                       std::move(pool));
                                             }});

}  // namespace specswap::graph
