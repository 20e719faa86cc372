// The capture sequence shared by the CUDA and NPU graph runners
// (csrc/graph/device_capture.h), driven by a fake device that records every
// call: the device is synchronised before the warm-up, a failed capture is
// aborted (never ended), the message names the runner, and the graph's bytes
// are the reservation's growth across the capture.
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "graph/device_capture.h"

using specswap::graph::CaptureLabel;
using specswap::graph::DeviceCaptureHooks;
using specswap::graph::run_device_capture;

namespace {

struct FakeDevice final : DeviceCaptureHooks {
  std::vector<std::string> calls;
  std::vector<std::size_t> reserved;  // what reserved_bytes() answers, in order
  std::size_t reserved_reads = 0;
  bool on_stream = false;
  bool capturing = false;
  bool throw_on_begin = false;
  bool throw_on_end = false;

  void synchronize_device() override { calls.push_back("sync_device"); }
  void on_capture_stream(const std::function<void()>& fn) override {
    calls.push_back("enter_stream");
    struct Leave {
      FakeDevice& device;
      ~Leave() {
        device.on_stream = false;
        device.calls.push_back("leave_stream");
      }
    } leave{*this};
    on_stream = true;
    fn();
  }
  void synchronize_capture_stream() override { calls.push_back(on_stream ? "sync_stream" : "sync_stream_off_stream"); }
  std::size_t reserved_bytes() override {
    calls.push_back("reserved");
    return reserved_reads < reserved.size() ? reserved[reserved_reads++] : 0;
  }
  void begin_capture() override {
    calls.push_back(on_stream ? "begin" : "begin_off_stream");
    if (throw_on_begin) throw std::runtime_error("begin refused");
    capturing = true;
  }
  void end_capture() override {
    calls.push_back("end");
    if (throw_on_end) throw std::runtime_error("capture invalidated");
    capturing = false;
  }
  void abort_capture() noexcept override {
    calls.push_back(on_stream ? "abort" : "abort_off_stream");
    capturing = false;
  }

  // A body that records whether it ran as the warm-up or under capture.
  std::function<void()> body(bool throw_when_captured = false, bool throw_in_warmup = false) {
    return [this, throw_when_captured, throw_in_warmup] {
      calls.push_back(capturing ? "body_captured" : "body_warmup");
      if (capturing && throw_when_captured) throw std::runtime_error("host sync in capture");
      if (!capturing && throw_in_warmup) throw std::runtime_error("warm-up failed");
    };
  }
};

int count(const std::vector<std::string>& calls, const std::string& name) {
  int n = 0;
  for (const auto& call : calls) n += call == name;
  return n;
}

int index_of(const std::vector<std::string>& calls, const std::string& name) {
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (calls[i] == name) return static_cast<int>(i);
  }
  return -1;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const CaptureLabel kLabel{"FAKE", "draft_extend", 3, 4, "no host sync"};

// Runs a capture expected to fail; returns its message.
std::string failure_of(FakeDevice& device, const std::function<void()>& body) {
  try {
    run_device_capture(device, body, kLabel);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

int main() {
  {  // a capture that succeeds: the whole sequence, in order
    FakeDevice device;
    device.reserved = {1000, 1000 + 4096};
    const std::size_t bytes = run_device_capture(device, device.body(), kLabel);
    const std::vector<std::string> expected{"sync_device", "enter_stream", "body_warmup", "sync_stream", "reserved",
                                            "begin",       "body_captured", "end",        "leave_stream", "sync_device",
                                            "reserved"};
    CHECK(device.calls == expected);
    CHECK(bytes == 4096);  // after - before, the warm-up's allocations excluded
    CHECK(count(device.calls, "abort") == 0);
  }
  {  // the device (every stream), not only the capture stream, is synchronised before the warm-up
    FakeDevice device;
    run_device_capture(device, device.body(), kLabel);
    CHECK(index_of(device.calls, "sync_device") == 0);
    CHECK(index_of(device.calls, "sync_device") < index_of(device.calls, "body_warmup"));
    CHECK(index_of(device.calls, "sync_stream") < index_of(device.calls, "begin"));
  }
  {  // the allocator shrank during the capture: 0 bytes, not a wrapped-around size_t
    FakeDevice device;
    device.reserved = {8192, 4096};
    CHECK(run_device_capture(device, device.body(), kLabel) == 0);
  }
  {  // the body throws under capture: the capture is aborted on the capture stream, never ended
    FakeDevice device;
    device.reserved = {1000, 2000};
    const std::string message = failure_of(device, device.body(/*throw_when_captured=*/true));
    CHECK(!message.empty());
    CHECK(count(device.calls, "abort") == 1);
    CHECK(count(device.calls, "end") == 0);
    CHECK(index_of(device.calls, "body_captured") < index_of(device.calls, "abort"));
    CHECK(index_of(device.calls, "abort") < index_of(device.calls, "leave_stream"));
    CHECK(!device.capturing);
    // the message names the backend, the runner's stage, steps and bucket, the cause and the hint
    CHECK(contains(message, "FAKE graph capture"));
    CHECK(contains(message, "draft_extend runner"));
    CHECK(contains(message, "steps=3"));
    CHECK(contains(message, "bucket=4"));
    CHECK(contains(message, "host sync in capture"));
    CHECK(contains(message, "(no host sync)"));
  }
  {  // ending the capture fails (e.g. invalidated): aborted after the failed end
    FakeDevice device;
    device.throw_on_end = true;
    const std::string message = failure_of(device, device.body());
    CHECK(contains(message, "capture invalidated") && contains(message, "draft_extend"));
    CHECK(count(device.calls, "abort") == 1);
    CHECK(index_of(device.calls, "end") < index_of(device.calls, "abort"));
  }
  {  // beginning the capture fails: aborted (routing to the pool may have begun), the body not captured
    FakeDevice device;
    device.throw_on_begin = true;
    const std::string message = failure_of(device, device.body());
    CHECK(contains(message, "begin refused"));
    CHECK(count(device.calls, "abort") == 1);
    CHECK(count(device.calls, "body_captured") == 0 && count(device.calls, "end") == 0);
  }
  {  // an exception that is no std::exception is aborted too, and reported as a runtime_error
    FakeDevice device;
    const std::string message = failure_of(device, [&device] {
      device.calls.push_back(device.capturing ? "body_captured" : "body_warmup");
      if (device.capturing) throw 42;
    });
    CHECK(contains(message, "draft_extend"));
    CHECK(count(device.calls, "abort") == 1 && count(device.calls, "end") == 0);
  }
  {  // the warm-up throws: nothing was begun, so nothing is aborted; its error passes unchanged
    FakeDevice device;
    std::string message;
    try {
      run_device_capture(device, device.body(false, /*throw_in_warmup=*/true), kLabel);
    } catch (const std::runtime_error& error) {
      message = error.what();
    }
    CHECK(message == "warm-up failed");
    CHECK(count(device.calls, "begin") == 0 && count(device.calls, "abort") == 0);
    CHECK(device.calls.back() == "leave_stream");
  }
  return 0;
}
