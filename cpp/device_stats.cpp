// Statistics of device tensors with bounded memory and no wait on the job's
// thread (see device_stats.h).
//
// - Memory: a tensor is reduced in pieces of at most kPieceElements
//   elements, each converted to float64 on its own; a dense tensor is read
//   through a flat view of its memory, so no full-size copy is ever made.
//   What a piece costs at most is stated at piece_row.
// - Launches: a tensor of up to kStageMaxElements elements costs one launch:
//   a copy, converted to float64, into the batch's staging buffer; when the
//   batch closes, about twenty segment reductions over that buffer measure
//   all of its tensors at once (segment_rows). A larger tensor is reduced at
//   once, piece by piece, about fifteen launches a piece (piece_row). On a
//   backend with a kernel for opdump::fused_stats, every tensor is one launch
//   of that kernel. Each way a measurement gives one row of kFields values
//   per piece or tensor.
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

#include "opdump/cpp/device_stats.h"

#include <pthread.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "opdump/cpp/internal.h"
#include "opdump/cpp/opdump.h"
#include "opdump/cpp/signature.h"
#include "opdump/cpp/stats_acc.h"

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

namespace {

// One row per piece (kFields, device_stats.h): finite count, NaN count, +inf
// count, zero count, and over the finite values min, max, mean and the sum of
// squared deviations from that mean.
// piece_row keeps at most about 17 bytes per element of a piece alive at
// once (two float64 copies and a one-byte mask); the pieces are sized for 64
// bytes per element, which leaves room for a backend's own temporaries.
constexpr int64_t kPieceElements = kDeviceScratchBytes / 64;
// Staging: one float64 buffer per open batch, and at a batch's close a few
// temporaries of its size (segment_rows: at most about 41 bytes an element
// at once, the buffer included), within the same budget.
constexpr int64_t kStageElements = kDeviceScratchBytes / 64;
constexpr int64_t kStageMaxElements = kStageElements / 4;
constexpr size_t kBatchResults = 256;
constexpr size_t kMaxInFlight = 4;

struct Settings {
  bool sync = false;
  bool block = true;
  std::chrono::milliseconds wait{10000};
};

const Settings& settings() {
  static const Settings s = [] {
    const DeviceSettings d = device_settings();
    return Settings{d.sync, d.block, std::chrono::milliseconds(d.wait_ms)};
  }();
  return s;
}

struct Batch {
  uint64_t id = 0;
  c10::Device device;
  c10::Stream stream;
  at::Tensor probe;  // an empty tensor on the device, to ask about captures
  std::vector<at::Tensor> rows;  // one [kFields] tensor per piece, on the device
  // One [kSignatureHead + K] tensor per signature piece (signature_row), on the device.
  std::vector<at::Tensor> sig_rows;
  at::Tensor stage;              // the staged tensors, one after the other
  std::vector<int64_t> lengths;  // elements of each staged tensor
  int64_t staged = 0;
  struct Part {
    DeviceResultPtr result;
    int64_t first;                     // its first piece row, or
    int64_t segment;                   // its segment of the staging buffer (-1: none)
    std::vector<int64_t> piece_numel;  // elements of each of its pieces (or of the tensor)
    int64_t sig_first = -1;            // its first signature row (-1: none)
    int64_t sig_count = 0;
  };
  std::vector<Part> parts;
  // Set when the batch closes: the rows of the pieces, then those of the
  // segments.
  int64_t piece_rows = 0;
  int64_t stats_values = 0;  // the host copy: the statistics rows, then the signature rows
  int sig_k = 0;
  at::Tensor lengths_host;
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
  uint64_t next_id = 1;
  std::mutex results;  // DeviceResult's fields
};
State& g = *new State;

std::atomic<int64_t> g_measured{0}, g_dropped{0}, g_capturing{0}, g_job_waits{0}, g_failed{0};

c10::Stream current_stream(c10::Device d) { return c10::impl::getDeviceGuardImpl(d.type())->getStream(d); }

// The backend's kernel for opdump::fused_stats, where it registered one
// (device_stats.h), asked once per device type: backends register theirs
// when they load, before their tensors are measured.
const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>* fused_kernel(const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opdump::fused_stats", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  // 0: not asked yet, 1: none, 2: registered.
  static std::array<std::atomic<uint8_t>, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
      known{};
  auto& k = known[static_cast<size_t>(t.device().type())];
  uint8_t v = k.load(std::memory_order_relaxed);
  if (v == 0) {
    v = op.hasKernelForDispatchKey(c10::legacyExtractDispatchKey(t.key_set())) ? 2 : 1;
    k.store(v, std::memory_order_relaxed);
  }
  return v == 2 ? &op : nullptr;
}

// ---- launching -------------------------------------------------------------

// The pieces of `t`, each of at most kPieceElements elements. A dense
// tensor (any order of dimensions) is read through a flat view of its memory;
// any other is split along its outer dimensions into views, each converted
// on its own by piece_row.
// The pieces are consecutive runs of the tensor's elements in logical order.
template <typename F>
void split(const at::Tensor& t, F&& f, int64_t most = kPieceElements) {
  if (t.numel() <= most || t.dim() == 0) return f(t);
  int64_t d = 0;
  while (t.size(d) == 1) ++d;
  const int64_t inner = t.numel() / t.size(d);
  if (inner <= most) {
    const int64_t step = most / inner;
    for (int64_t i = 0; i < t.size(d); i += step) f(t.narrow(d, i, std::min(step, t.size(d) - i)));
  } else {
    for (int64_t i = 0; i < t.size(d); ++i) split(t.select(d, i), f, most);
  }
}

// The fingerprint and sketch take pieces of at most this many elements: their
// int64 words and hashes cost about 60 bytes an element at once.
constexpr int64_t kSignaturePieceElements = kDeviceScratchBytes / 64 / 4;

template <typename F>
void for_each_piece(const at::Tensor& t, F&& f) {
  if (t.is_non_overlapping_and_dense()) {
    const at::Tensor flat = t.as_strided({t.numel()}, {1}, t.storage_offset());
    for (int64_t i = 0; i < flat.numel(); i += kPieceElements)
      f(flat.narrow(0, i, std::min(kPieceElements, flat.numel() - i)));
  } else {
    split(t, f);
  }
}

// The row of one piece, launched on the current stream. Non-finite values
// are replaced by the mean of the finite ones, which leaves the extremes, the
// mean and the spread of the finite values as they are, so one var_mean and
// one aminmax serve tensors with and without NaN or infinities. Alive at
// once at most: the float64 piece, the replaced copy and a mask.
at::Tensor piece_row(const at::Tensor& piece, at::ScalarType acc) {
  const at::Tensor x = (piece.is_complex() ? at::abs(piece) : piece).to(acc);
  at::Tensor finite, mean, count;
  {
    const at::Tensor zeroed = at::nan_to_num(x, 0.0, 0.0, 0.0);
    finite = at::eq(zeroed, x);
    count = finite.sum(acc);
    mean = at::div(zeroed.sum(), count);  // NaN when nothing is finite
  }
  at::Tensor var, mu, lo, hi;
  {
    const at::Tensor replaced = at::where(finite, x, mean);
    finite.reset();
    std::tie(var, mu) = at::var_mean(replaced, at::OptionalIntArrayRef(), std::optional<at::Scalar>(at::Scalar(0)), false);
    std::tie(lo, hi) = at::aminmax(replaced);
  }
  const auto inf = std::numeric_limits<double>::infinity();
  // The replaced elements sit at the mean: n times the variance over all n
  // elements is the finite values' sum of squared deviations.
  const at::Tensor m2 = at::mul(var, static_cast<double>(piece.numel()));
  return at::stack({count, at::ne(x, x).sum(acc), at::eq(x, inf).sum(acc), at::eq(x, 0).sum(acc), lo, hi, mu, m2});
}

// The rows of the staged tensors `x` (float64, one after the other, of
// `lengths` elements), as piece_row gives them, with segment reductions over
// the whole buffer: non-finite values are replaced by their tensor's finite
// mean, spread back over the elements with repeat_interleave.
at::Tensor segment_rows(const at::Tensor& x, const at::Tensor& lengths) {
  auto seg = [&](const at::Tensor& v, c10::string_view how) {
    // unsafe: no check of the lengths, which would wait for the device.
    return at::segment_reduce(v, how, lengths, std::nullopt, std::nullopt, 0, /*unsafe=*/true);
  };
  const auto inf = std::numeric_limits<double>::infinity();
  const at::ScalarType acc = x.scalar_type();
  at::Tensor finite, count, sum, zeros, nans, pinf;
  {
    const at::Tensor zeroed = at::nan_to_num(x, 0.0, 0.0, 0.0);
    finite = at::eq(zeroed, x);
    count = seg(finite.to(acc), "sum");
    sum = seg(zeroed, "sum");
  }
  zeros = seg(at::eq(x, 0).to(acc), "sum");
  nans = seg(at::ne(x, x).to(acc), "sum");
  pinf = seg(at::eq(x, inf).to(acc), "sum");
  const at::Tensor mean = at::div(sum, count);  // NaN when nothing is finite
  at::Tensor lo, hi, m2;
  {
    const at::Tensor spread = at::repeat_interleave(mean, lengths, 0, x.numel());
    const at::Tensor replaced = at::where(finite, x, spread);
    finite.reset();
    const at::Tensor dev = at::sub(replaced, spread);
    m2 = seg(at::mul(dev, dev), "sum");
    lo = seg(replaced, "min");
    hi = seg(replaced, "max");
  }
  return at::stack({count, nans, pinf, zeros, lo, hi, mean, m2}, 1);
}

// The statistics of one piece from its row.
Acc piece_acc(const double* v, int64_t n) {
  Acc a;
  const auto count = static_cast<int64_t>(v[0]);
  a.nan = static_cast<int64_t>(v[1]);
  a.posinf = static_cast<int64_t>(v[2]);
  a.neginf = n - count - a.nan - a.posinf;
  a.zero = static_cast<int64_t>(v[3]);
  if (count > 0) {
    a.finite = count;
    a.min = v[4];
    a.max = v[5];
    a.mean = v[6];
    a.m2 = v[7];
    a.sum = v[6] * static_cast<double>(count);
    a.sumsq = a.m2 + static_cast<double>(count) * v[6] * v[6];
  }
  return a;
}

// ---- completing --------------------------------------------------------------

void submit(PendingCall& pc) {
  try {
    op_submit(pc.departure, pc.call);
  } catch (...) {
  }
}

void deliver(const DeviceResult::Waiter& w, const TensorStats& stats, const SignatureValues& sig, bool ok) {
  TensorStats s = stats;
  if (ok && w.repeat > 1) scale_repeated(s, w.repeat);
  const StatsStatus status = ok ? w.status : StatsStatus::Failed;
  const bool take = ok && w.signature && w.repeat == 1 && sig.has;
  PendingCall& pc = *w.call;
  {
    std::lock_guard<std::mutex> lock(pc.mutex);
    if (pc.exited) {
      TensorRow& row = pc.call.tensors[w.row];
      row.stats = s;
      row.status = status;
      if (take) put_signature(sig, row);
    } else {
      pc.early.push_back({w.row, s, status, take ? sig : SignatureValues{}});
    }
  }
  if (pc.outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) submit(pc);
}

void complete(const DeviceResultPtr& r, const TensorStats& stats, SignatureValues sig, bool ok) {
  std::vector<DeviceResult::Waiter> waiters;
  {
    std::lock_guard<std::mutex> lock(g.results);
    r->done = true;
    r->ok = ok;
    r->stats = stats;
    r->signature = std::move(sig);
    waiters.swap(r->waiters);
  }
  for (const auto& w : waiters) deliver(w, stats, r->signature, ok);
}

void complete_batch(Batch& b) {
  bool ok = !b.failed;
  if (ok) {
    try {
      b.event->synchronize();
    } catch (const std::exception& e) {
      ok = false;
      warn(rust::Str(std::string("waiting for device statistics failed: ") + e.what()));
    }
  }
  const double* v = ok ? b.host.const_data_ptr<double>() : nullptr;
  TensorStats none{};
  null_stats(none);
  for (const auto& part : b.parts) {
    if (!ok) {
      g_failed.fetch_add(1, std::memory_order_relaxed);
      complete(part.result, none, {}, false);
      continue;
    }
    Acc acc;
    const int64_t first = part.segment >= 0 ? b.piece_rows + part.segment : part.first;
    for (size_t i = 0; i < part.piece_numel.size(); ++i)
      acc.merge(piece_acc(v + (first + static_cast<int64_t>(i)) * kFields, part.piece_numel[i]));
    SignatureValues sv;
    if (part.sig_count > 0) {
      sig::Signature s;
      s.k = b.sig_k;
      const int64_t width = kSignatureHead + b.sig_k;
      for (int64_t i = 0; i < part.sig_count; ++i)
        signature_finish_row(v + b.stats_values + (part.sig_first + i) * width, b.sig_k, s);
      sv.has = true;
      sv.fingerprint = s.fingerprint();
      sv.sketch.assign(s.sketch, s.sketch + s.k);
    }
    complete(part.result, stats_of(acc), std::move(sv), true);
  }
}

// opdump-device: completes the batches in flight in the order they closed.
void completion_loop() {
  pthread_setname_np(pthread_self(), "opdump-device");
  relax_capture_mode_for_this_thread();
  for (;;) {
    Batch* b;
    {
      std::unique_lock<std::mutex> lock(g.mutex);
      g.changed.wait(lock, [] { return !g.in_flight.empty(); });
      b = g.in_flight.front().get();  // only this thread pops
    }
    complete_batch(*b);
    std::unique_ptr<Batch> done;
    {
      std::lock_guard<std::mutex> lock(g.mutex);
      done = std::move(g.in_flight.front());
      g.in_flight.pop_front();
      g.stalled = false;
    }
    g.changed.notify_all();
    // `done` goes here: its buffers back to their allocators.
  }
}

// ---- batches (g.mutex held) -------------------------------------------------

// Room for one more batch in flight, waiting for it under the queue rules.
bool make_room(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline) {
  if (g.in_flight.size() < kMaxInFlight) return true;
  if (!settings().block || g.stalled) return false;
  g_job_waits.fetch_add(1, std::memory_order_relaxed);
  if (g.changed.wait_until(lock, deadline, [] { return g.in_flight.size() < kMaxInFlight; })) return true;
  g.stalled = true;
  warn(rust::Str("device statistics have not come back within OPDUMP_QUEUE_WAIT_MS (a stalled device?); "
                 "measurements are dropped and counted until they do"));
  return false;
}

std::vector<std::unique_ptr<Batch>>::iterator find_open(c10::Device d, c10::Stream s) {
  for (auto it = g.open.begin(); it != g.open.end(); ++it)
    if ((*it)->device == d && (*it)->stream == s) return it;
  return g.open.end();
}

// Launches the stacking, the copy to the host and the event of the open
// batch `it` on its own stream, and hands it to opdump-device. There must be
// room in flight.
void close(std::vector<std::unique_ptr<Batch>>::iterator it) {
  std::unique_ptr<Batch> b = std::move(*it);
  g.open.erase(it);
  if (b->parts.empty()) return;
  try {
    // Unseen by opdump itself (which would measure these ops), by autograd
    // and by user modes, as the measurement's own ops are. It may run
    // outside measure(): at a flush.
    c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
    c10::StreamGuard guard(b->stream);
    std::vector<at::Tensor> blocks;
    b->piece_rows = static_cast<int64_t>(b->rows.size());
    if (!b->rows.empty()) blocks.push_back(at::stack(b->rows));
    b->rows.clear();
    if (!b->lengths.empty()) {
      // The lengths go to the device from host memory that the batch keeps
      // until its event: pinned on CUDA, so that the copy does not wait.
      const auto n = static_cast<int64_t>(b->lengths.size());
      b->lengths_host = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(b->device.is_cuda()));
      std::copy(b->lengths.begin(), b->lengths.end(), b->lengths_host.mutable_data_ptr<int64_t>());
      const at::Tensor lengths = b->lengths_host.to(b->device, /*non_blocking=*/true);
      blocks.push_back(segment_rows(b->stage.narrow(0, 0, b->staged), lengths));
      b->stage.reset();  // back to the allocator, in stream order
    }
    // One flat host copy: the statistics rows, then the signature rows.
    for (auto& block : blocks) block = block.reshape({-1});
    b->stats_values = 0;
    for (const auto& block : blocks) b->stats_values += block.numel();
    if (!b->sig_rows.empty()) blocks.push_back(at::cat(b->sig_rows));
    b->sig_rows.clear();
    b->device_rows = blocks.size() == 1 ? blocks[0] : at::cat(blocks);
    if (b->device_rows.scalar_type() != at::kDouble) b->device_rows = b->device_rows.to(at::kDouble);
    b->host = at::empty(b->device_rows.sizes(),
                        at::TensorOptions().dtype(at::kDouble).pinned_memory(b->device.is_cuda()));
    b->host.copy_(b->device_rows, /*non_blocking=*/true);
    b->event.emplace(b->device.type());
    b->event->record(b->stream);
  } catch (const std::exception& e) {
    b->failed = true;
    warn(rust::Str(std::string("sending device statistics to the host failed: ") + e.what()));
  }
  g.in_flight.push_back(std::move(b));
  if (!g.thread_started) {
    std::thread(completion_loop).detach();
    g.thread_started = true;
  }
  g.changed.notify_all();
}

// Closes the open batch of (d, s) and waits until it has come back.
void close_and_wait(std::unique_lock<std::mutex>& lock, c10::Device d, c10::Stream s) {
  const auto deadline = std::chrono::steady_clock::now() + settings().wait;
  if (!make_room(lock, deadline)) return;
  auto it = find_open(d, s);
  if (it == g.open.end()) return;
  const uint64_t id = (*it)->id;
  close(it);
  g_job_waits.fetch_add(1, std::memory_order_relaxed);
  g.changed.wait_until(lock, deadline, [id] {
    for (const auto& b : g.in_flight)
      if (b->id == id) return false;
    return true;
  });
}

}  // namespace

// ---- the interface -----------------------------------------------------------

DeviceLaunch device_measure(const at::Tensor& t, DeviceResultPtr& result) {
  if (stream_capturing(t)) {
    g_capturing.fetch_add(1, std::memory_order_relaxed);
    return DeviceLaunch::Capturing;
  }
  const c10::Device device = t.device();
  const c10::Stream stream = current_stream(device);
  const at::ScalarType acc = device.is_mps() ? at::kFloat : at::kDouble;  // MPS has no float64
  const auto* fused = fused_kernel(t);
  const bool stage = fused == nullptr && t.numel() <= kStageMaxElements;
  std::unique_lock<std::mutex> lock(g.mutex);
  auto full = [&](const Batch& b) {
    return b.parts.size() >= kBatchResults || (stage && b.staged + t.numel() > kStageElements);
  };
  auto it = find_open(device, stream);
  if (it != g.open.end() && full(**it)) {
    if (!make_room(lock, std::chrono::steady_clock::now() + settings().wait)) {
      g_dropped.fetch_add(1, std::memory_order_relaxed);
      return DeviceLaunch::Dropped;
    }
    it = find_open(device, stream);  // the wait let other threads in
    if (it != g.open.end() && full(**it)) close(it);
    it = find_open(device, stream);
  }
  if (it == g.open.end()) {
    auto b = std::make_unique<Batch>(device, stream);
    b->id = g.next_id++;
    b->probe = at::empty({0}, at::TensorOptions().device(device));
    g.open.push_back(std::move(b));
    it = std::prev(g.open.end());
  }
  Batch& b = **it;
  Batch::Part part{std::make_shared<DeviceResult>(), static_cast<int64_t>(b.rows.size()), -1, {}};
  if (fused != nullptr) {
    at::Tensor row = fused->call(t);
    // A row of another shape would fail the whole batch at its close.
    TORCH_CHECK(row.numel() == kFields && row.scalar_type() == at::kDouble && row.device() == device,
                "the backend's opdump::fused_stats returned ", row.sizes(), " ", row.scalar_type(), " on ",
                row.device(), ", not ", kFields, " float64 values on ", device);
    b.rows.push_back(row.reshape({kFields}));
    part.piece_numel.push_back(t.numel());
  } else if (stage) {
    if (!b.stage.defined()) b.stage = at::empty({kStageElements}, at::TensorOptions().dtype(acc).device(device));
    const at::Tensor src = t.is_complex() ? at::abs(t) : t;
    b.stage.narrow(0, b.staged, t.numel()).view(t.sizes()).copy_(src);
    part.segment = static_cast<int64_t>(b.lengths.size());
    part.piece_numel.push_back(t.numel());
    b.lengths.push_back(t.numel());
    b.staged += t.numel();
  } else {
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
  // The fingerprint and sketch, on devices that accumulate in float64 (the
  // fingerprint's sums must be exact).
  if (const int k = sketch_size_once(); k > 0 && acc == at::kDouble) {
    const size_t before = b.sig_rows.size();
    try {
      int64_t first = 0;
      part.sig_first = static_cast<int64_t>(before);
      split(
          t,
          [&](const at::Tensor& p) {
            b.sig_rows.push_back(signature_row(p, first, k, kSignaturePieceElements));
            first += p.numel();
          },
          kSignaturePieceElements);
      part.sig_count = static_cast<int64_t>(b.sig_rows.size() - before);
      b.sig_k = k;
    } catch (...) {
      b.sig_rows.resize(before);
      part.sig_first = -1;
      part.sig_count = 0;
    }
  }
  result = part.result;
  b.parts.push_back(std::move(part));
  g_measured.fetch_add(1, std::memory_order_relaxed);
  if (settings().sync) close_and_wait(lock, device, stream);
  return DeviceLaunch::Queued;
}

bool device_wait_for(const DeviceResultPtr& r, const Later& later, StatsStatus status, int64_t repeat,
                     TensorRow& row) {
  TensorStats stats;
  bool ok;
  {
    std::lock_guard<std::mutex> lock(g.results);
    if (!r->done) {
      auto& pc = *later.call;
      if (!pc) pc = std::make_shared<PendingCall>();
      pc->outstanding.fetch_add(1, std::memory_order_relaxed);
      r->waiters.push_back({pc, later.row, status, repeat, later.signature});
      return true;
    }
    stats = r->stats;
    ok = r->ok;
    if (ok && later.signature && repeat == 1 && r->signature.has) put_signature(r->signature, row);
  }
  if (ok) {
    row.stats = stats;
    if (repeat > 1) scale_repeated(row.stats, repeat);
    row.status = status;
  } else {
    null_stats(row.stats);
    row.status = StatsStatus::Failed;
  }
  return false;
}

void device_call_exited(std::shared_ptr<PendingCall> pending, OpCall&& call) {
  pending->departure = op_depart();
  {
    std::lock_guard<std::mutex> lock(pending->mutex);
    pending->call = std::move(call);
    for (const auto& e : pending->early) {
      TensorRow& row = pending->call.tensors[e.row];
      row.stats = e.stats;
      row.status = e.status;
      if (e.signature.has) put_signature(e.signature, row);
    }
    pending->early.clear();
    pending->exited = true;
  }
  if (pending->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) submit(*pending);
}

// Every measurement launched so far back and its rows complete; batches on a
// stream that is capturing stay open (and make this false).
bool device_flush(int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  std::unique_lock<std::mutex> lock(g.mutex);
  bool all = true;
  // Oldest first; a batch on a stream that captures stays open.
  for (size_t i = 0; i < g.open.size();) {
    Batch& b = *g.open[i];
    bool capturing;
    try {
      c10::StreamGuard guard(b.stream);
      capturing = stream_capturing(b.probe);
    } catch (const std::exception&) {
      capturing = true;
    }
    if (capturing || b.parts.empty()) {
      all = all && b.parts.empty();
      ++i;
      continue;
    }
    if (g.in_flight.size() >= kMaxInFlight &&
        !g.changed.wait_until(lock, deadline, [] { return g.in_flight.size() < kMaxInFlight; }))
      return false;
    close(g.open.begin() + static_cast<std::ptrdiff_t>(i));  // erases it: same i again
  }
  return g.changed.wait_until(lock, deadline, [] { return g.in_flight.empty(); }) && all;
}

void register_device_ops(torch::Library& ops) {
  ops.def("fused_stats(Tensor t) -> Tensor");
  register_capture_ops(ops);
}

rust::Vec<int64_t> device_counts() {
  rust::Vec<int64_t> v;
  for (const auto* c : {&g_measured, &g_dropped, &g_capturing, &g_job_waits, &g_failed})
    v.push_back(c->load(std::memory_order_relaxed));
  return v;
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
  g.thread_started = false;
  g.stalled = false;
  g.results.unlock();
  g.mutex.unlock();
}

}  // namespace opdump
