// The host side of device measurements: opdump-device waits for each batch
// that comes back, merges the rows of each measurement and completes the rows
// of recorded calls that wait for it; a call goes to Rust when its last row
// is complete (see device_stats.h).

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "opdump/cpp/device/device_batch.h"
#include "opdump/cpp/device/device_counters.h"
#include "opdump/cpp/device/device_reduce.h"
#include "opdump/cpp/common/common.h"
#include "opdump/cpp/opdump.h"
#include "opdump/cpp/signature/signature.h"
#include "opdump/cpp/stats/stats_acc.h"

namespace opdump {
namespace devstats {
namespace {

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
    if (!ok || part.failed) {
      g_failed.fetch_add(1, std::memory_order_relaxed);
      complete(part.result, none, {}, false);
      continue;
    }
    Acc acc;
    SignatureValues sv;
    if (part.kernel_row >= 0) {
      // The batch kernel's row: statistics, then the signature's.
      const int64_t width = kFields + (b.sig_k > 0 ? kSignatureHead + b.sig_k : 0);
      const double* row = v + b.kernel_values + part.kernel_row * width;
      acc = piece_acc(row, part.piece_numel.empty() ? 0 : part.piece_numel[0]);
      if (b.sig_k > 0) {
        sig::Signature s;
        s.k = b.sig_k;
        signature_finish_row(row + kFields, b.sig_k, s);
        sv.has = true;
        sv.fingerprint = s.fingerprint();
        sv.sketch.assign(s.sketch, s.sketch + s.k);
      }
      complete(part.result, stats_of(acc), std::move(sv), true);
      continue;
    }
    if (part.stage_row >= 0) {
      // Its rows of the staging buffer, the last one padded.
      const int64_t n = part.piece_numel.empty() ? 0 : part.piece_numel[0];
      const double* row = v + (b.piece_rows + part.stage_row) * kFields;
      for (int64_t done = 0; done < n; done += kRowWidth, row += kFields)
        acc.merge(row_acc(row, std::min(kRowWidth, n - done)));
    } else {
      for (size_t i = 0; i < part.piece_numel.size(); ++i)
        acc.merge(piece_acc(v + (part.first + static_cast<int64_t>(i)) * kFields, part.piece_numel[i]));
    }
    if (part.sig_staged && b.stage_sig_at >= 0) {
      // Its rows of staged_fingerprints (an int64 tensor's: those of its
      // words) less what their padding added, and of staged_sketch.
      const int k = b.sig_k;
      const int64_t n = part.piece_numel.empty() ? 0 : part.piece_numel[0];
      const bool words = part.word_row >= 0;
      const int64_t fn = words ? 2 * n : n;
      const double* frow = v + b.stage_sig_at + (words ? part.word_row : part.stage_row);
      const double* yrow = v + b.stage_sketch_at + part.stage_row * k;
      uint64_t f = 0;
      double head[kSignatureHead + sig::kMaxSketch] = {};
      for (int64_t done = 0; done < fn; done += kRowWidth, ++frow) {
        uint64_t sum;
        std::memcpy(&sum, frow, sizeof sum);
        f += sum;
      }
      for (int64_t done = 0; done < n; done += kRowWidth, yrow += k)
        for (int j = 0; j < k; ++j) head[kSignatureHead + j] += yrow[j];
      f -= staged_padding_fingerprint(part.sig_dtype, n);  // 0 for integers
      head[0] = static_cast<double>(f & 0xffffffffu);
      head[2] = static_cast<double>(f >> 32);
      sig::Signature s;
      s.k = k;
      signature_finish_row(head, k, s);
      sv.has = true;
      sv.fingerprint = s.fingerprint();
      sv.sketch.assign(s.sketch, s.sketch + s.k);
    } else if (part.sig_count > 0) {
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

}  // namespace

// opdump-device: completes the batches in flight in the order they closed.
void completion_loop() {
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

}  // namespace devstats

using devstats::g;

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
  if (pending->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) devstats::submit(*pending);
}

}  // namespace opdump
