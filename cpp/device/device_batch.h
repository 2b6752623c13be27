// The batches of device measurements (device_batches.cpp): the open batch of
// each device and stream, which stages small tensors and collects the rows of
// its measurements, and the closed batches in flight to the host, which
// opdump-device completes (device_complete.cpp). See device_stats.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include "opdump/cpp/device/device_stats.h"

namespace opdump {

struct DeviceResult {
  // All guarded by g.results.
  bool done = false;
  bool ok = false;
  TensorStats stats{};
  SignatureValues signature;
  struct Waiter {
    std::shared_ptr<PendingCall> call;
    size_t row;
    StatsStatus status;
    int64_t repeat;
    bool signature;
  };
  std::vector<Waiter> waiters;
};

namespace devstats {

class WatchingAllocator;  // held_memory.cpp

// Staging: one float64 buffer per open batch, laid out as rows of
// kRowWidth elements: every staged tensor starts a row, and the rest of its
// last row is NaN, which the reductions skip and the host takes back out of
// the NaN count. One reduction per statistic then covers every row of the
// batch (row_stats), and the host merges each tensor's rows. The buffer lives
// from the batch's first read to its close, beside the job's memory the batch
// holds for it (stage_held_bytes), within kDeviceScratchBytes: 30 + 24 MiB.
// At the close the held memory is back and row_stats adds 8 bytes an
// element (60 MiB). With the sketch the buffer is 28 MiB: at the close
// staged_fingerprints takes chunks of at most 28 MiB beside it, and the
// sketch 9 bytes an element inside row_stats (17 in all, 60 MiB). An int64
// tensor with the sketch also stages its words, as int32 values (exact in
// float64), in rows of their own for its fingerprint: 3 elements each.
constexpr int64_t kRowWidth = kStagedRowWidth;
inline int64_t stage_elements(bool sketch) { return sketch ? int64_t{7} << 19 : int64_t{15} << 18; }
inline int64_t stage_held_bytes(bool) { return int64_t{24} << 20; }
// A tensor's elements rounded up to whole rows.
inline int64_t row_padded(int64_t numel) { return (numel + kRowWidth - 1) / kRowWidth * kRowWidth; }
// Whether a held tensor of `dtype` stages its words too (with the sketch).
inline bool stages_words(at::ScalarType dtype) { return dtype == at::kLong; }
// The elements a held tensor takes in the staging buffer.
inline int64_t held_stage_elements(at::ScalarType dtype, int64_t numel, bool sketch) {
  return row_padded(numel) + (sketch && stages_words(dtype) ? row_padded(2 * numel) : 0);
}
// The largest tensor a batch holds; a larger one is reduced at once, in
// pieces.
inline int64_t stage_max_elements(bool sketch) { return sketch ? int64_t{1} << 19 : int64_t{5} << 18; }
// The job's memory a batch read by the backend's batch kernel holds, at
// most: a close costs two launches (the kernel, the copy of its rows), so
// the holds set how many a step takes. At 32 MiB a TinyLM step closes 3
// batches, not 6 (0.017 launches a measured tensor, not 0.024), and its
// peak device memory grows by 9 MiB over the job's, not 3. A tensor of up
// to a quarter of it is held; a larger one is read at once.
constexpr int64_t kHoldBytes = kDeviceScratchBytes / 2;
constexpr size_t kBatchResults = 1024;
constexpr size_t kMaxInFlight = 4;

struct Settings {
  bool sync = false;
  bool hold = true;
  bool block = true;
  std::chrono::milliseconds wait{10000};
};

// OPDUMP_DEVICE_SYNC, OPDUMP_DEVICE_HOLD and the OPDUMP_QUEUE_FULL rules,
// read once.
const Settings& settings();

// The backend's kernel for opdump::fused_stats_batch (device_stats.h).
using BatchKernel = c10::TypedOperatorHandle<at::Tensor(at::TensorList, int64_t)>;

struct Batch {
  uint64_t id = 0;
  c10::Device device;
  c10::Stream stream;
  at::Tensor probe;  // an empty tensor on the device, to ask about captures
  std::vector<at::Tensor> rows;  // one [kFields] tensor per piece, on the device
  // One [kSignatureHead + K] tensor per signature piece (signature_row), on the device.
  std::vector<at::Tensor> sig_rows;  // or blocks of such rows, flat
  int64_t sig_row_count = 0;         // rows in sig_rows
  std::vector<at::Tensor> keep;      // host memory its copies read, kept until its event
  // Blocks of the backend's batch kernel, [n, kFields + kSignatureHead + K] each.
  std::vector<at::Tensor> kernel_blocks;
  int64_t kernel_rows = 0;
  at::Tensor stage;  // the staged tensors, each from the start of a row (kRowWidth)
  int64_t staged = 0;  // elements taken, in whole rows: filled, or held to be staged at the close
  int64_t filled = 0;  // elements in the buffer, in whole rows
  struct Part {
    DeviceResultPtr result;
    int64_t first = 0;                 // its first piece row, or
    int64_t stage_row = -1;            // its first row of the staging buffer (-1: none)
    std::vector<int64_t> piece_numel;  // elements of each of its pieces (or of the tensor)
    int64_t sig_first = -1;            // its first signature row (-1: none)
    int64_t sig_count = 0;
    int64_t kernel_row = -1;           // its row of the batch kernel's blocks (-1: none)
    // Held until the batch closes (or an op is about to write its memory):
    // an alias of the measured tensor, read then. `storage`: its memory.
    at::Tensor held;
    const c10::StorageImpl* storage = nullptr;
    // Its memory's address, and the watch on its allocations, when it was
    // held (held_memory.cpp).
    const void* held_address = nullptr;
    WatchingAllocator* watch = nullptr;
    uint64_t allocations = 0;
    bool held_signature = false;  // its fingerprint and sketch are made from `held` too
    // ... from its rows of the staging buffer (staged_fingerprints, staged_sketch), as `sig_dtype`.
    bool sig_staged = false;
    at::ScalarType sig_dtype = at::kFloat;
    int64_t word_row = -1;        // an int64 tensor's first row of its words (-1: none)
    bool failed = false;          // reading it failed: its result fails
  };
  std::vector<Part> parts;
  int64_t held = 0;        // parts holding a tensor
  int64_t held_bytes = 0;  // their bytes, for the batch kernel's bound
  const BatchKernel* kernel = nullptr;  // the batch kernel its held parts go to, if any
  // Set when the batch closes: the rows of the pieces (kFields values each),
  // then those of the staging buffer (kFields each, see row_stats).
  int64_t piece_rows = 0;
  int64_t stats_values = 0;  // the host copy: the statistics rows, then the signature rows
  int64_t kernel_values = 0;  // then the batch kernel's rows, from here
  int sig_k = 0;
  at::Tensor stage_sig;          // staged_fingerprints of the staging buffer, or undefined
  at::Tensor stage_q;            // each row's index in its tensor, on the device, for the sketch
  at::Tensor stage_sketch;       // staged_sketch of the staging buffer, or undefined
  int64_t stage_sig_at = -1;     // where the fingerprints start in the host copy
  int64_t stage_sketch_at = -1;  // and the sketches
  at::Tensor device_rows;
  at::Tensor host;
  std::optional<c10::Event> event;
  bool failed = false;

  Batch(c10::Device d, c10::Stream s) : device(d), stream(s) {}
};

// The shared state lives for the whole process and is never destroyed: at
// exit opdump-device still waits on g.changed (destroying a condition
// variable with a waiter blocks), and the batches hold device tensors that
// must not be freed after torch has gone.
struct State {
  std::mutex mutex;  // the open batches, the batches in flight, stalled
  std::condition_variable changed;
  std::vector<std::unique_ptr<Batch>> open;  // one per device and stream
  std::deque<std::unique_ptr<Batch>> in_flight;
  bool stalled = false;  // a wait for room timed out; no more waits until room is made
  bool thread_started = false;
  std::atomic<int64_t> held{0};  // parts holding a tensor, in all open batches
  uint64_t next_id = 1;
  std::mutex results;  // DeviceResult's fields
};
extern State& g;

// ---- batches (g.mutex held) -------------------------------------------------

// Room for one more batch in flight, waiting for it under the queue rules.
bool make_room(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline);
// The open batch of (d, s), or g.open.end().
std::vector<std::unique_ptr<Batch>>::iterator find_open(c10::Device d, c10::Stream s);
// Hands the open batch `it` to opdump-device (there must be room in flight).
void close(std::vector<std::unique_ptr<Batch>>::iterator it);
// The signature rows of `t` for a sketch of length `k`, launched now; none
// when one fails (the row then has statistics without a fingerprint).
void launch_signature(const at::Tensor& t, int k, Batch& b, Batch::Part& part);
// Reads the held tensors of `parts` (indexes into b.parts) now, on the
// batch's stream: staged, or given to the batch kernel (device_hold.cpp).
void read_held(Batch& b, const std::vector<size_t>& parts);
// Closes every open batch not on a capturing stream, waiting for room in
// flight until `deadline`; false when a batch stayed open.
bool close_open(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline);
// Closes the open batch of (d, s) and waits until it has come back.
void close_and_wait(std::unique_lock<std::mutex>& lock, c10::Device d, c10::Stream s);

// A held part's memory watched from now until unwatch_memory, which must
// come before its alias is released (held_memory.cpp; g.mutex held).
void watch_memory(Batch::Part& part);
// Whether the memory under a held part changed owner since it was held:
// freed and allocated again, at another address or the same one.
bool memory_changed(const Batch::Part& part);
void unwatch_memory(Batch::Part& part);

// opdump-device's loop (device_complete.cpp), started at the first close.
void completion_loop();

}  // namespace devstats
}  // namespace opdump
