// CPU graphs: record the dispatcher-level operators a stage runs once, then
// replay that tape from C++ without Python. Replay calls the kernels eager ran
// (a row gather runs as index_select, the same copy), so outputs are
// bit-identical; what it removes is Python's per-op overhead, which dominates
// small models on the CPU.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace specswap::graph {

class GraphPool;

class OpTape {
 public:
  // Runs `body` with recording on. Composite operators (CompositeImplicitAutograd:
  // linear, matmul, to, reshape, ...) are decomposed while recording, so the tape
  // holds the kernels they reach (mm, view, _to_copy) and replay skips the layers
  // in between. Throws if the body needs a host value from a tensor (item(), a
  // bool result), which a tape would freeze.
  // `pool` (may be null): where repacked weights are shared (GraphPool::pack_linear_weights).
  void record(const std::function<void()>& body, GraphPool* pool = nullptr);
  // Not reentrant: a tape reuses its argument stack and slot table.
  void replay();

  std::size_t num_ops() const noexcept { return entries_.size(); }
  // Bytes of tensors the tape holds as constants, except shared ones and
  // the storages in `exclude` (the runner's own buffers, counted elsewhere).
  std::size_t constant_bytes(const GraphPool& pool, std::vector<const void*> exclude) const;

  // Called by the dispatcher fallback while recording.
  void on_operator(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

 private:
  struct TensorRef {
    int slot = -1;          // >= 0: produced by an earlier recorded op
    at::Tensor constant;    // otherwise: a tensor that existed before (weights, buffers) or a view of one
  };
  struct Arg {
    enum class Kind { kConstant, kTensor, kTensorList, kOptionalTensorList } kind = Kind::kConstant;
    c10::IValue constant;
    TensorRef tensor;
    std::vector<std::optional<TensorRef>> list;
  };
  struct Entry {
    c10::OperatorHandle op;
    c10::DispatchKeySet keys;               // where eager dispatched it (below the recording key)
    std::vector<Arg> args;
    std::vector<std::vector<int>> outputs;  // per return: slot(s) (a list return has several)
    std::vector<bool> output_is_list;
    std::vector<int> release_after;         // slots whose last use is this entry
  };

  // A slot the tape knows a tensor by (identity first, else its memory: see op_tape.cpp), else a constant.
  // Throws UnfollowedTensor for a tensor over memory a recorded operator made that no slot has.
  TensorRef ref_for(const at::Tensor& tensor) const;
  void record_operator(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  void save_before_write(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  Arg arg_for(const c10::IValue& value) const;
  std::vector<Arg> args_on(const torch::jit::Stack& stack, std::size_t num_args) const;
  int new_slot(const at::Tensor& tensor);
  void record_entry(Entry entry, const torch::jit::Stack& stack);
  void record_row_gather(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const at::Tensor& rows,
                         torch::jit::Stack* stack);
  void decompose(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  bool record_packed_linear(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  static bool reads_slots(const std::vector<Arg>& args);
  void finish();

  std::vector<Entry> entries_;
  int num_slots_ = 0;
  GraphPool* pool_ = nullptr;  // while recording
  // replay only: reused every call, so the hot path does not allocate its tables
  std::vector<c10::IValue> slots_;
  torch::jit::Stack stack_;
  // Memory allocated during the capture outside recorded operators (aten::empty: torch.tensor(data)) and
  // written in place there: copied back to its content before the first write at the start of each replay.
  struct Restore {
    c10::Storage storage;
    std::vector<char> saved;
  };
  std::vector<Restore> restores_;
  // recording only: which slot holds the tensor with this TensorImpl (the tensor held: see ref_for)
  struct Known {
    const void* impl;
    int slot;
    at::Tensor tensor;
  };
  std::vector<Known> slot_of_impl_;
  // recording only: [start, end) of the storages recorded operators allocated (`made_`) and of those
  // aten::empty allocated unrecorded (`raw_`, with the storage and whether it was saved for a Restore)
  std::map<std::uintptr_t, std::uintptr_t> made_;
  struct RawBlock {
    std::uintptr_t end;
    c10::Storage storage;
    bool saved = false;
  };
  std::map<std::uintptr_t, RawBlock> raw_;
  std::vector<const void*> folded_;      // views of constants, computed once at capture
  std::vector<c10::IValue> keep_alive_;  // recorded values, so impl addresses stay unique while recording
};

}  // namespace specswap::graph
