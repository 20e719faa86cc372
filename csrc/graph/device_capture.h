// The capture sequence every device backend (CUDA, Ascend NPU) runs, written
// once and free of torch so that tests/cpp/test_device_capture.cpp can drive
// it with a fake device. A backend supplies the device operations as
// DeviceCaptureHooks; run_device_capture() puts them in order:
//
//   synchronize the device (the caller's stream wrote the buffers; the
//   capture stream must see that work)
//   on the capture stream:
//     body()                    warm-up outside capture: lazy library
//                               handles, workspace allocations
//     synchronize the stream
//     before = reserved bytes   after the warm-up: what it cached belongs to
//                               the ordinary allocator, not the graph
//     begin capture; body(); end capture
//       on any failure: abort the capture (end it, discard the partial
//       graph, stop routing allocations to the graph pool), then rethrow
//       naming backend, stage, steps and bucket
//   synchronize the device
//   return reserved bytes - before (0 if the allocator shrank meanwhile)
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>

namespace specswap::graph {

class DeviceCaptureHooks {
 public:
  virtual ~DeviceCaptureHooks() = default;
  // Waits for all work on the device (every stream).
  virtual void synchronize_device() = 0;
  // Runs fn with the capture stream as the current stream, restoring the previous one after.
  virtual void on_capture_stream(const std::function<void()>& fn) = 0;
  virtual void synchronize_capture_stream() = 0;
  // Bytes the device's caching allocator holds (reserved), all pools.
  virtual std::size_t reserved_bytes() = 0;
  virtual void begin_capture() = 0;
  virtual void end_capture() = 0;
  // Undoes a capture that begin_capture() may have started and end_capture()
  // did not complete: the stream leaves capture mode, the partial graph is
  // discarded and the caching allocator stops routing allocations to the
  // graph pool. Safe to call whatever state the capture is in; never throws.
  virtual void abort_capture() noexcept = 0;
};

// What a failed capture's message names.
struct CaptureLabel {
  std::string backend;  // "CUDA", "NPU"
  std::string stage;    // "draft", "verify", ...
  int steps = 0;
  int bucket = 0;
  std::string hint;  // appended in parentheses when not empty
};

inline std::string capture_failure_message(const CaptureLabel& label, const std::string& what) {
  std::string message = label.backend + " graph capture of the " + label.stage + " runner (steps=" +
                        std::to_string(label.steps) + ", bucket=" + std::to_string(label.bucket) + ") failed: " + what;
  if (!label.hint.empty()) message += " (" + label.hint + ")";
  return message;
}

// Runs the warm-up and the capture of `body`; returns the bytes the capture
// added to the caching allocator's reservation (the graph's memory).
inline std::size_t run_device_capture(DeviceCaptureHooks& hooks, const std::function<void()>& body,
                                      const CaptureLabel& label) {
  hooks.synchronize_device();
  std::size_t before = 0;
  hooks.on_capture_stream([&] {
    body();
    hooks.synchronize_capture_stream();
    before = hooks.reserved_bytes();
    std::string failure;
    try {
      hooks.begin_capture();
      body();
      hooks.end_capture();
      return;
    } catch (const std::exception& error) {
      failure = error.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    hooks.abort_capture();
    throw std::runtime_error(capture_failure_message(label, failure));
  });
  hooks.synchronize_device();
  const std::size_t after = hooks.reserved_bytes();
  return after > before ? after - before : 0;
}

}  // namespace specswap::graph
