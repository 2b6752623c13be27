// Statistics of tensors on a device other than the CPU, measured on that
// device without making the job's thread wait for it (device_stats.cpp).
//
// A measurement launches its reductions on the tensor's current stream at
// once, so it reads the values the op left, and returns. The small results
// of many measurements come back to the host together, in batches, with one
// asynchronous copy and an event; opdump's own thread (`opdump-device`) waits
// for the event and completes the rows. A recorded call whose rows wait for
// device results is handed to Rust only once they are all complete, so every
// value written is final.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "opdump/src/bridge.rs.h"

namespace torch {
class Library;
}

namespace opdump {

struct Acc;

// A tensor's fingerprint and sketch as they travel with its statistics.
struct SignatureValues {
  bool has = false;
  uint64_t fingerprint = 0;
  std::vector<double> sketch;
};
// Into a row, and out of one (signature_device.cpp).
void put_signature(const SignatureValues& s, TensorRow& row);
SignatureValues signature_of_row(const TensorRow& row);
// The row of one piece of a device tensor, a run of its elements in logical
// order starting at element `first`: the fingerprint's kSignatureHead limb
// sums, then y_0 .. y_{k-1}, in float64 on the piece's device; and its
// addition to a signature on the host (signature_device.cpp). `most`: the
// largest piece there will be.
constexpr int64_t kSignatureHead = 3;
at::Tensor signature_row(const at::Tensor& piece, int64_t first, int k, int64_t most);
// The rows of consecutive tensors in `flat` (1-D, contiguous), of `lengths`
// elements each (at most `most` in all), each as signature_row gives it for
// the whole tensor: [m, kSignatureHead + k], flat, in a fixed number of
// launches. `lengths_on_device` holds the lengths, then their starts in
// `flat` (int64, 2m).
at::Tensor signature_rows(const at::Tensor& flat, const at::Tensor& lengths_on_device, int64_t m, int k,
                          int64_t most);
// The fingerprints and sketches of the rows of a staging buffer `x`
// ([rows, kStagedRowWidth] float64, each tensor from the start of a row,
// NaN after its end), from the values themselves for tensors whose dtype
// float64 holds exactly (staged_signature_dtype), at most `elems` elements
// each, and for int64 tensors from rows of their words as int32 values.
// staged_fingerprints gives [rows] float64, per row the row's fingerprint
// sum (mod 2^64) as the bits of an int64 (it may make the NaNs of `x`
// canonical). `meta` (int64, on the device): each row's index in its tensor (or
// in its words), then for each group that is not every row its rows and
// their indexes (StagedGroup); the group of every row, if any, first.
// staged_sketch, once the non-finite values of `x` are NaN, gives [rows, k]:
// each row's sketch before its Hadamard transform; `q` is the rows' indexes
// in their tensors, `starts` (int32) the first element of each row.
constexpr int64_t kStagedRowWidth = 1024;
struct StagedGroup {
  at::ScalarType dtype;
  int64_t rows_at = -1;  // where its rows are in `meta`; -1: every row of `x`
  int64_t q_at = -1;     // where their indexes are
  int64_t count = 0;     // its rows
};
bool staged_signature_dtype(at::ScalarType t);
at::Tensor staged_fingerprints(at::Tensor& x, const at::Tensor& meta, const std::vector<StagedGroup>& groups, int k,
                               int64_t elems);
at::Tensor staged_sketch(const at::Tensor& x, const at::Tensor& q, const at::Tensor& starts, int k, int64_t elems);
// What the NaN padding of a tensor of `n` elements of `dtype` adds to the
// fingerprint sum of its rows.
uint64_t staged_padding_fingerprint(at::ScalarType dtype, int64_t n);
namespace sig {
struct Signature;
}
void signature_finish_row(const double* v, int k, sig::Signature& s);

// The most extra device memory measuring one tensor may take, beyond the
// tensor itself: the size of the pieces it is reduced in follows from it.
constexpr int64_t kDeviceScratchBytes = int64_t{64} << 20;

// The row of statistics a measurement gives on the device, float64:
// [finite count, NaN count, +inf count, zero count, min, max, mean, m2], the
// last four over the finite values (m2: the sum of their squared deviations
// from their mean; anything when none is finite). Complex tensors are
// measured by magnitude, integers and bools as float64.
//
// A backend may compute it in one kernel: opdump defines the ops
//   opdump::fused_stats(Tensor t) -> Tensor      (the row, on t's device)
//   opdump::fused_stats_batch(Tensor[] tensors, int sketch=0) -> Tensor
//     (a row per tensor: the statistics, then, for sketch K > 0, the
//     signature row of signature_row for the whole tensor)
// and uses a backend's kernel for them, registered on the backend's dispatch
// key, when there is one (it must take at most kDeviceScratchBytes of device
// memory). Otherwise the rows come from ATen ops.
constexpr int64_t kFields = 8;

// A recorded call whose rows wait for device results. The job's thread fills
// `call` and leaves the op; results may arrive before or after that. Whoever
// completes the last one (the job's thread at exit, or opdump-device) hands
// the call to Rust.
struct PendingCall {
  OpCall call;
  Departure departure;  // the call's place, from Rust, at the op's exit
  std::mutex mutex;
  bool exited = false;  // `call` is final: results go straight into its rows
  struct Early {
    size_t row;
    TensorStats stats;
    StatsStatus status;
    SignatureValues signature;  // empty unless the row takes it
  };
  std::vector<Early> early;  // results that came before the op's exit
  // One for the op itself until it exits, plus one per row still waiting.
  std::atomic<int64_t> outstanding{1};
};

// The statistics of one measured device tensor, complete once its batch has
// come back. Rows that take them (the measured row, later rows that reuse
// them, views of the same elements) wait on it.
struct DeviceResult;
using DeviceResultPtr = std::shared_ptr<DeviceResult>;

// Where a row whose statistics are not known yet will get them.
struct Later {
  std::shared_ptr<PendingCall>* call;  // the row builder's, made at the first wait
  size_t row;                          // its index in the call's rows
  // Set by measure() when the row waits: for what, and how many times each
  // element is repeated.
  DeviceResultPtr result = nullptr;
  int64_t repeat = 1;
  // Whether the row also takes the result's fingerprint and sketch: not a
  // view that reorders or repeats the elements.
  bool signature = true;
};

enum class DeviceLaunch : uint8_t {
  Queued,     // launched; `result` completes later
  Capturing,  // the stream is capturing a graph: nothing launched
  Dropped,    // the pool of pending results stayed full (counted)
};

// Launches the measurement of `t` on its device and current stream.
DeviceLaunch device_measure(const at::Tensor& t, DeviceResultPtr& result);

// For the run of an op that writes the memory of its Tensor(a!) arguments
// (device_hold.cpp): the held measurements of that memory are read first,
// and until the op returns, tensors on that memory are read when measured,
// not held, since the op's kernel may write them without another op.
class WriteScope {
 public:
  WriteScope(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& stack);
  ~WriteScope();
  WriteScope(const WriteScope&) = delete;
  WriteScope& operator=(const WriteScope&) = delete;

 private:
  size_t pushed_ = 0;
};
// Whether a WriteScope of the op's calls would note any memory: the op
// writes an argument, or is a collective. Asked once per op (fallback.cpp),
// so that the calls of other ops open none.
bool opens_write_scope(const c10::FunctionSchema& schema);
// Whether an op running on this thread writes `s` (a WriteScope is open).
bool being_written(const c10::StorageImpl* s);
// Closes the open batches (opdump is switched off: writes are no longer seen).
void device_close_open();

// Row `later.row` takes `r`'s statistics, `repeat` times each element (a
// broadcast view), with `status`. When they are known already they are put
// into `row` and this returns false; otherwise the row waits.
bool device_wait_for(const DeviceResultPtr& r, const Later& later, StatsStatus status, int64_t repeat,
                     TensorRow& row);

// At the op's exit on the job's thread: `call` is complete but for the rows
// still waiting; hands it to Rust now or when the last result arrives.
void device_call_exited(std::shared_ptr<PendingCall> pending, OpCall&& call);

void device_atfork_prepare();
void device_atfork_parent();
void device_atfork_child();

// Whether the current stream of `t`'s device is capturing a graph
// (graph_capture.cpp).
bool stream_capturing(const at::Tensor& t);
// Defines opdump::stream_capturing in `ops` and registers its kernels
// (graph_capture.cpp).
void register_capture_ops(torch::Library& ops);
// Defines the ops a backend may implement for the device path in `ops`:
// opdump::stream_capturing and opdump::fused_stats.
void register_device_ops(torch::Library& ops);
// Lets opdump-device wait for events while another thread captures (CUDA's
// global capture mode forbids it otherwise).
void relax_capture_mode_for_this_thread();

// Statistics from what Acc gathered; statistics that do not exist
// (stats.cpp).
TensorStats stats_of(const Acc& acc);
void null_stats(TensorStats& s);
// Scales statistics for elements each repeated `k` times (stats.cpp).
void scale_repeated(TensorStats& s, int64_t k);

}  // namespace opdump
