// Opening, closing and waiting for batches of device measurements (see
// device_batch.h).

#include "opdump/cpp/device/device_batch.h"

#include <algorithm>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/device/device_counters.h"
#include "opdump/cpp/device/device_reduce.h"
#include "opdump/cpp/common/common.h"
#include "opdump/cpp/stats/stats.h"

namespace opdump::devstats {

const Settings& settings() {
  static const Settings s = [] {
    const DeviceSettings d = device_settings();
    return Settings{d.sync, d.hold, d.block, std::chrono::milliseconds(d.wait_ms)};
  }();
  return s;
}

State& g = *new State;

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

namespace {

// The fingerprints of the batch's staged rows that take them
// (Part::sig_staged), into b.stage_sig, and each row's index in its tensor
// for their sketches, into b.stage_q; none when they fail (the rows then
// have statistics without a fingerprint). Before row_stats, which
// overwrites `x`.
void staged_signatures(Batch& b, at::Tensor& x) {
  const int64_t rows = x.size(0);
  // Each row's index in its tensor, for the sketch (an int64 tensor's word
  // rows: 0, unread), and the rows of each dtype's fingerprint with their
  // index in the tensor's words.
  std::vector<int64_t> q(static_cast<size_t>(rows), 0);
  struct Group {
    at::ScalarType dtype;
    std::vector<int64_t> rows, q;
  };
  std::vector<Group> groups;
  auto group = [&](at::ScalarType dt) -> Group& {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.dtype == dt; });
    if (it != groups.end()) return *it;
    groups.push_back({dt, {}, {}});
    return groups.back();
  };
  for (const auto& p : b.parts) {
    if (!p.sig_staged) continue;
    const int64_t n = p.piece_numel.empty() ? 0 : p.piece_numel[0];
    for (int64_t r = 0; r * kRowWidth < n; ++r) q[static_cast<size_t>(p.stage_row + r)] = r;
    if (p.word_row >= 0) {
      Group& g = group(at::kInt);
      for (int64_t r = 0; r * kRowWidth < 2 * n; ++r) {
        g.rows.push_back(p.word_row + r);
        g.q.push_back(r);
      }
    } else {
      Group& g = group(p.sig_dtype);
      for (int64_t r = 0; r * kRowWidth < n; ++r) {
        g.rows.push_back(p.stage_row + r);
        g.q.push_back(r);
      }
    }
  }
  if (groups.empty()) return;
  // The floating group with the most rows takes every row, first (no
  // gathering; the others' sums are overwritten, rows of no group unread);
  // the others gather their rows.
  auto every = groups.end();
  for (auto it = groups.begin(); it != groups.end(); ++it)
    if (at::isFloatingType(it->dtype) && (every == groups.end() || it->rows.size() > every->rows.size())) every = it;
  if (every != groups.end()) std::rotate(groups.begin(), every, every + 1);
  std::vector<StagedGroup> staged;
  std::vector<int64_t> meta = q;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& gr = groups[i];
    const bool all = i == 0 && every != groups.end();
    StagedGroup sg{gr.dtype, -1, -1, all ? rows : static_cast<int64_t>(gr.rows.size())};
    if (!all) {
      sg.rows_at = static_cast<int64_t>(meta.size());
      meta.insert(meta.end(), gr.rows.begin(), gr.rows.end());
      sg.q_at = static_cast<int64_t>(meta.size());
      meta.insert(meta.end(), gr.q.begin(), gr.q.end());
    }
    staged.push_back(sg);
  }
  try {
    at::Tensor host = at::empty({static_cast<int64_t>(meta.size())},
                                at::TensorOptions().dtype(at::kLong).pinned_memory(b.device.is_cuda()));
    std::copy(meta.begin(), meta.end(), host.mutable_data_ptr<int64_t>());
    const at::Tensor on_device = host.to(b.device, /*non_blocking=*/true);
    b.keep.push_back(host);  // read by the copy until the batch's event
    b.stage_sig = staged_fingerprints(x, on_device, staged, b.sig_k, stage_max_elements(true));
    b.stage_q = on_device.narrow(0, 0, rows);
  } catch (const std::exception&) {
    b.stage_sig.reset();
  }
  if (!b.stage_sig.defined())
    for (auto& p : b.parts) p.sig_staged = false;
}

// The statistics rows of batch `b` on the device, as flat blocks: the rows
// of the pieces, then those of the staging buffer; and the sketches of the
// staged rows, into b.stage_sketch, once row_stats has made their
// non-finite values NaN.
std::vector<at::Tensor> stats_blocks(Batch& b) {
  std::vector<at::Tensor> blocks;
  b.piece_rows = static_cast<int64_t>(b.rows.size());
  if (!b.rows.empty()) blocks.push_back(at::stack(b.rows));
  b.rows.clear();
  if (b.filled > 0) {
    at::Tensor x = b.stage.narrow(0, 0, b.filled).view({b.filled / kRowWidth, kRowWidth});
    if (b.sig_k > 0) staged_signatures(b, x);
    RowsHook sketch;
    if (b.stage_sig.defined())
      sketch = [&b](const at::Tensor& nan_made, const at::Tensor& starts) {
        try {
          b.stage_sketch = staged_sketch(nan_made, b.stage_q, starts, b.sig_k, stage_max_elements(true));
        } catch (const std::exception&) {
          b.stage_sketch.reset();
        }
      };
    blocks.push_back(row_stats(x, sketch));
    b.stage_q.reset();
    if (!b.stage_sketch.defined()) {
      b.stage_sig.reset();
      for (auto& p : b.parts) p.sig_staged = false;
    }
    x.reset();
    b.stage.reset();  // back to the allocator, in stream order
  }
  for (auto& block : blocks) block = block.reshape({-1});
  return blocks;
}

// One flat host copy: the statistics rows, the signature rows, then the
// batch kernel's rows; and the event that says it has arrived.
void copy_to_host(Batch& b, std::vector<at::Tensor> blocks) {
  b.stats_values = 0;
  for (const auto& block : blocks) b.stats_values += block.numel();
  b.kernel_values = b.stats_values;
  if (!b.sig_rows.empty()) {
    blocks.push_back(at::cat(b.sig_rows));
    b.kernel_values += blocks.back().numel();
  }
  b.sig_rows.clear();
  if (b.stage_sig.defined() && b.stage_sketch.defined()) {
    b.stage_sig_at = b.kernel_values;
    blocks.push_back(b.stage_sig.reshape({-1}));
    b.kernel_values += blocks.back().numel();
    b.stage_sketch_at = b.kernel_values;
    blocks.push_back(b.stage_sketch.reshape({-1}));
    b.kernel_values += blocks.back().numel();
  }
  b.stage_sig.reset();
  b.stage_sketch.reset();
  for (const auto& block : b.kernel_blocks) blocks.push_back(block.reshape({-1}));
  b.kernel_blocks.clear();
  b.device_rows = blocks.size() == 1 ? blocks[0] : at::cat(blocks);
  if (b.device_rows.scalar_type() != at::kDouble) b.device_rows = b.device_rows.to(at::kDouble);
  b.host = at::empty(b.device_rows.sizes(),
                     at::TensorOptions().dtype(at::kDouble).pinned_memory(b.device.is_cuda()));
  b.host.copy_(b.device_rows, /*non_blocking=*/true);
  b.event.emplace(b.device.type());
  b.event->record(b.stream);
}

}  // namespace

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
    if (b->held > 0) {
      std::vector<size_t> held;
      for (size_t i = 0; i < b->parts.size(); ++i)
        if (b->parts[i].held.defined()) held.push_back(i);
      read_held(*b, held);
    }
    copy_to_host(*b, stats_blocks(*b));
  } catch (const std::exception& e) {
    b->failed = true;
    warn(rust::Str(std::string("sending device statistics to the host failed: ") + e.what()));
  }
  // A held part left (its read threw before it was released) goes now.
  for (auto& p : b->parts)
    if (p.held.defined()) {
      unwatch_memory(p);
      p.held.reset();
      g.held.fetch_sub(1, std::memory_order_relaxed);
    }
  g.in_flight.push_back(std::move(b));
  if (!g.thread_started) {
    start_thread("opdump-device", completion_loop);
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

}  // namespace opdump::devstats
