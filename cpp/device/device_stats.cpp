// Statistics of device tensors with bounded memory and no wait on the job's
// thread (see device_stats.h).
//
// - Memory: a tensor is reduced in pieces of at most kPieceElements
//   elements, each converted to float64 on its own; a dense tensor is read
//   through a flat view of its memory, so no full-size copy is ever made.
//   What a piece costs at most is stated at piece_row.
// - Launches: a tensor of up to stage_max_elements elements is held by its
//   batch (device_hold.cpp) and read with the others when the batch closes:
//   one concatenation into the batch's float64 staging buffer, laid out in
//   rows, then one reduction per statistic over all rows (row_stats), and
//   with the sketch its fingerprints and sketches from the same rows
//   (staged_fingerprints, staged_sketch). A complex one, or any under
//   OPDUMP_DEVICE_HOLD=0, is copied into the buffer at once. A larger tensor is reduced at once, piece by piece, about
//   fifteen launches a piece (piece_row). On a backend with a kernel for
//   opdump::fused_stats_batch, the held tensors of a batch are one launch of
//   it; with only opdump::fused_stats, every tensor is one launch. Each way a
//   measurement gives one row of kFields values per piece or tensor.
//   A batch collects up to kBatchResults measurements on one device and
//   stream; closing it computes the staged rows, copies all rows to the host
//   asynchronously (pinned memory on CUDA) and records an event, all on that
//   stream.
// - Waiting: opdump-device waits for each closed batch's event, merges the
//   rows of each measurement (Chan's formula, as on the CPU) and completes
//   the rows that wait for it. At most kMaxInFlight batches are closed and
//   not yet back; a batch that must close while they are all still out makes
//   the job's thread wait under OPDUMP_QUEUE_FULL's rules, as the record
//   channel does: `block` waits at most OPDUMP_QUEUE_WAIT_MS, `drop` does not
//   wait; a measurement that finds no room is not made, and is counted.
// - Memory that a measurement reads stays valid: every kernel that reads a
//   tensor is launched on the tensor's current stream before the job's
//   thread leaves the op, that is before the job can free the tensor. The
//   caching allocators of stream-based devices hand a freed block to new work
//   only in stream order after that point, so the block is not reused before
//   the reads have run; a block used across streams needs record_stream for
//   the job's own op already, which then also covers these reads. opdump's
//   own buffers (the rows, the stacked rows and the host copy) belong to the
//   batch until its event has completed.
// - Capture: while the current stream captures a graph, nothing is launched
//   (the row gets the status `capturing`); batches are closed only on
//   streams that do not capture.

#include "opdump/cpp/device/device_stats.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "opdump/cpp/device/device_batch.h"
#include "opdump/cpp/device/device_counters.h"
#include "opdump/cpp/device/device_reduce.h"
#include "opdump/cpp/stats/stats.h"
#include "opdump/cpp/opdump.h"

namespace opdump {

using namespace devstats;

namespace {

c10::Stream current_stream(c10::Device d) { return c10::impl::getDeviceGuardImpl(d.type())->getStream(d); }

// How a measurement goes into a batch.
enum class Way : uint8_t {
  Stage,   // copied into the staging buffer at once
  Hold,    // held, staged at the close (or before a write)
  Kernel,  // held, given to the backend's batch kernel at the close
  Now,     // reduced at once: in pieces, or by the backend's kernel
};

// `need`: the elements it takes in the staging buffer.
bool is_full(const Batch& b, Way way, int64_t need, int64_t nbytes, bool sketch) {
  if (b.parts.size() >= kBatchResults) return true;
  switch (way) {
    case Way::Stage:
      return b.staged + need > stage_elements(sketch);
    case Way::Hold:
      return b.staged + need > stage_elements(sketch) ||
             b.held_bytes + nbytes > stage_held_bytes(sketch);
    case Way::Kernel:
      return b.held_bytes + nbytes > kHoldBytes;
    case Way::Now:
      return false;
  }
  return false;
}

// The open batch of (device, stream) with room for a measurement of `need`
// elements of the staging buffer: a full one is closed (waiting for room in flight under the queue
// rules), a missing one opened. nullptr when no room was made. g.mutex held.
Batch* batch_with_room(std::unique_lock<std::mutex>& lock, c10::Device device, c10::Stream stream, Way way,
                       int64_t need, int64_t nbytes, bool sketch) {
  auto it = find_open(device, stream);
  if (it != g.open.end() && is_full(**it, way, need, nbytes, sketch)) {
    if (!make_room(lock, std::chrono::steady_clock::now() + settings().wait)) return nullptr;
    it = find_open(device, stream);  // the wait let other threads in
    if (it != g.open.end() && is_full(**it, way, need, nbytes, sketch)) close(it);
    it = find_open(device, stream);
  }
  if (it == g.open.end()) {
    auto b = std::make_unique<Batch>(device, stream);
    b->id = g.next_id++;
    b->probe = at::empty({0}, at::TensorOptions().device(device));
    g.open.push_back(std::move(b));
    it = std::prev(g.open.end());
  }
  return it->get();
}

// The statistics row of `t` from the backend's own kernel.
void launch_fused(const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>& fused, const at::Tensor& t,
                  Batch& b, Batch::Part& part) {
  at::Tensor row = fused.call(t);
  // A row of another shape would fail the whole batch at its close.
  TORCH_CHECK(row.numel() == kFields && row.scalar_type() == at::kDouble && row.device() == b.device,
              "the backend's opdump::fused_stats returned ", row.sizes(), " ", row.scalar_type(), " on ",
              row.device(), ", not ", kFields, " float64 values on ", b.device);
  b.rows.push_back(row.reshape({kFields}));
  part.piece_numel.push_back(t.numel());
}

// `t` copied, in `acc`, into the batch's staging buffer from the start of
// a row, the rest of its last row NaN: its rows come from row_stats at the
// batch's close. One launch when `t` is contiguous. Its fingerprint and
// sketch come from those rows too, as a held tensor's, where float64 holds
// its values exactly (staged_signature_dtype, no complex dtype): its values
// are copied in logical order. A batch has a sketch only where `acc` is
// float64.
void stage(const at::Tensor& t, at::ScalarType acc, Batch& b, Batch::Part& part) {
  part.sig_staged = b.sig_k > 0 && staged_signature_dtype(t.scalar_type());
  part.sig_dtype = t.scalar_type();
  const auto opts = at::TensorOptions().dtype(acc).device(b.device);
  if (!b.stage.defined()) b.stage = at::empty({stage_elements(b.sig_k > 0)}, opts);
  const int64_t n = t.numel(), padded = row_padded(n);
  part.stage_row = b.filled / kRowWidth;
  part.piece_numel.push_back(n);
  if (padded > 0) {
    // Complex tensors are staged by magnitude; the buffer is float64.
    const at::Tensor src = t.is_complex() ? at::abs(t) : t;
    at::Tensor dst = b.stage.narrow(0, b.filled, padded);
    if (src.is_contiguous()) {
      at::cat_out(dst, {src.reshape({-1}), row_padding(opts, padded - n)});
    } else {
      dst.narrow(0, 0, n).view(t.sizes()).copy_(src);
      if (padded > n) dst.narrow(0, n, padded - n).fill_(std::numeric_limits<double>::quiet_NaN());
    }
  }
  b.staged += padded;
  b.filled += padded;
}

// `t` held by the batch until it closes: an alias, so that the job may
// change its sizes without changing what is read. The part counts in the
// staging buffer (or the kernel's bound) from now on.
void hold(const at::Tensor& t, Way way, Batch& b, Batch::Part& part) {
  // Made here, not by aten::alias, which records the tensor as the view's
  // base: a grad held that way would count one more use, and autograd would
  // copy it instead of taking it (the job's ops would change).
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(t.storage()), t.key_set(),
                                                   t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  part.held = at::Tensor(std::move(impl));
  part.storage = t.storage().unsafeGetStorageImpl();
  watch_memory(part);
  ++b.held;
  g.held.fetch_add(1, std::memory_order_relaxed);
  if (way == Way::Hold) b.staged += held_stage_elements(t.scalar_type(), t.numel(), b.sig_k > 0);
  b.held_bytes += static_cast<int64_t>(t.nbytes());
}

// Whether `a` and `b`, views of one storage at one offset, hold the same
// elements: the same (stride, size) pairs in any order (a view reordered by
// transpose or permute, or the same one made by split, narrow and
// as_strided).
bool same_elements(const at::Tensor& a, const at::Tensor& b) {
  auto pairs = [](const at::Tensor& t) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.size(d) != 1) v.emplace_back(t.stride(d), t.size(d));
    std::sort(v.begin(), v.end());
    return v;
  };
  return pairs(a) == pairs(b);
}

// The result of a part of `b` that holds the elements of `t` already, or
// nullptr: a tensor measured again while held (an op's output, then the
// input of the next ops, or views of one slice made by split, narrow and
// as_strided) is staged and read once. With the fingerprint (`ordered`),
// only a view of the same elements in the same order.
DeviceResultPtr held_twin(const Batch& b, const at::Tensor& t, bool ordered) {
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  for (const auto& p : b.parts) {
    if (p.storage != storage || !p.held.defined()) continue;
    const at::Tensor& h = p.held;
    if (h.scalar_type() != t.scalar_type() || h.storage_offset() != t.storage_offset() || h.numel() != t.numel())
      continue;
    const bool same = ordered ? h.sizes() == t.sizes() && h.strides() == t.strides() : same_elements(h, t);
    if (same && !memory_changed(p)) return p.result;
  }
  return nullptr;
}

// The rows of `t`'s pieces, reduced now; none of them when one fails.
void launch_pieces(const at::Tensor& t, at::ScalarType acc, Batch& b, Batch::Part& part) {
  const size_t rows_before = b.rows.size();
  try {
    for_each_piece(t, [&](const at::Tensor& p) {
      b.rows.push_back(piece_row(p, acc));
      part.piece_numel.push_back(p.numel());
    });
  } catch (...) {
    b.rows.resize(rows_before);
    throw;
  }
}

}  // namespace

namespace devstats {

// The signature rows of `t` for a sketch of length `k`; none when one fails
// (the row then has statistics without a fingerprint).
void launch_signature(const at::Tensor& t, int k, Batch& b, Batch::Part& part) {
  const size_t before = b.sig_rows.size();
  const int64_t rows_before = b.sig_row_count;
  try {
    int64_t first = 0;
    part.sig_first = rows_before;
    split(
        t,
        [&](const at::Tensor& p) {
          b.sig_rows.push_back(signature_row(p, first, k, kSignaturePieceElements));
          ++b.sig_row_count;
          first += p.numel();
        },
        kSignaturePieceElements);
    part.sig_count = b.sig_row_count - rows_before;
    b.sig_k = k;
  } catch (...) {
    b.sig_rows.resize(before);
    b.sig_row_count = rows_before;
    part.sig_first = -1;
    part.sig_count = 0;
  }
}

}  // namespace devstats

DeviceLaunch device_measure(const at::Tensor& t, DeviceResultPtr& result) {
  if (stream_capturing(t)) {
    g_capturing.fetch_add(1, std::memory_order_relaxed);
    return DeviceLaunch::Capturing;
  }
  const c10::Device device = t.device();
  const c10::Stream stream = current_stream(device);
  const at::ScalarType acc = device.is_mps() ? at::kFloat : at::kDouble;  // MPS has no float64
  // The fingerprint and sketch, on devices that accumulate in float64 (the
  // fingerprint's sums must be exact).
  const int k = acc == at::kDouble ? sketch_size_once() : 0;
  const BatchKernel* kernel = settings().hold ? batch_kernel(t) : nullptr;
  const auto* fused = kernel == nullptr ? fused_kernel(t) : nullptr;
  const auto nbytes = static_cast<int64_t>(t.nbytes());
  Way way = Way::Now;
  if (kernel != nullptr) {
    way = nbytes <= kHoldBytes / 4 ? Way::Kernel : Way::Now;
  } else if (fused == nullptr && t.numel() <= stage_max_elements(k > 0)) {
    // Held: real tensors (complex ones are staged by magnitude at once).
    const bool holdable = settings().hold && acc == at::kDouble && !t.is_complex();
    way = holdable ? Way::Hold : Way::Stage;
  }
  // Memory an op running now writes may change without another op: read
  // at once.
  if ((way == Way::Hold || way == Way::Kernel) && being_written(t.storage().unsafeGetStorageImpl()))
    way = way == Way::Hold ? Way::Stage : Way::Now;
  std::unique_lock<std::mutex> lock(g.mutex);
  if (way == Way::Hold) {
    auto open = find_open(device, stream);
    DeviceResultPtr twin = open == g.open.end() ? nullptr : held_twin(**open, t, k > 0);
    if (twin != nullptr) {
      result = std::move(twin);
      g_measured.fetch_add(1, std::memory_order_relaxed);
      if (settings().sync) close_and_wait(lock, device, stream);
      return DeviceLaunch::Queued;
    }
  }
  const int64_t need =
      way == Way::Hold ? held_stage_elements(t.scalar_type(), t.numel(), k > 0) : row_padded(t.numel());
  Batch* batch = batch_with_room(lock, device, stream, way, need, nbytes, k > 0);
  if (batch == nullptr) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return DeviceLaunch::Dropped;
  }
  Batch& b = *batch;
  if (k > 0) b.sig_k = k;
  Batch::Part part;
  part.result = std::make_shared<DeviceResult>();
  part.first = static_cast<int64_t>(b.rows.size());
  switch (way) {
    case Way::Kernel:
      b.kernel = kernel;
      hold(t, way, b, part);
      break;
    case Way::Hold:
      hold(t, way, b, part);
      part.held_signature = k > 0;
      break;
    case Way::Stage:
      stage(t, acc, b, part);
      break;
    case Way::Now:
      if (kernel != nullptr) {
        // Too large to hold: the batch kernel on it alone, below.
        b.kernel = kernel;
        hold(t, Way::Kernel, b, part);
      } else if (fused != nullptr) {
        launch_fused(*fused, t, b, part);
      } else {
        launch_pieces(t, acc, b, part);
      }
      break;
  }
  // A held tensor gets its fingerprint and sketch when it is read, a
  // staged one from its rows at the close.
  if (k > 0 && !part.held.defined() && !part.sig_staged) launch_signature(t, k, b, part);
  result = part.result;
  b.parts.push_back(std::move(part));
  if (way == Way::Now && kernel != nullptr) read_held(b, {b.parts.size() - 1});
  g_measured.fetch_add(1, std::memory_order_relaxed);
  if (settings().sync) close_and_wait(lock, device, stream);
  return DeviceLaunch::Queued;
}

// Every measurement launched so far back and its rows complete; batches on a
// stream that is capturing stay open (and make this false).
bool device_flush(int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  std::unique_lock<std::mutex> lock(g.mutex);
  const bool all = close_open(lock, deadline);
  return g.changed.wait_until(lock, deadline, [] { return g.in_flight.empty(); }) && all;
}

void register_device_ops(torch::Library& ops) {
  ops.def("fused_stats(Tensor t) -> Tensor");
  ops.def("fused_stats_batch(Tensor[] tensors, int sketch=0) -> Tensor");
  register_capture_ops(ops);
}

// A forked child cannot use the parent's device work (nor, for CUDA, the
// device at all): it starts with nothing open and nothing in flight, and
// leaks what the parent had rather than free device memory from the child.
void device_atfork_prepare() {
  g.mutex.lock();
  g.results.lock();
}
void device_atfork_parent() {
  g.results.unlock();
  g.mutex.unlock();
}
void device_atfork_child() {
  for (auto& b : g.open) b.release();
  for (auto& b : g.in_flight) b.release();
  g.open.clear();
  g.in_flight.clear();
  g.held.store(0, std::memory_order_relaxed);
  g.thread_started = false;
  g.stalled = false;
  g.results.unlock();
  g.mutex.unlock();
}

}  // namespace opdump
