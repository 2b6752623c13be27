// Held measurements: many tensors read per launch (see device_stats.h).
//
// A measured tensor that fits a batch is not read at once: the batch keeps
// an alias of it and reads all its held tensors together when it closes,
// with a few launches per dtype (a concatenation into the staging buffer)
// or one call of the backend's batch kernel. What it holds must still hold
// the values it had when it was measured, so before any op that writes
// memory (an in-place op, an out= argument, a Tensor(a!)[] list, the
// running statistics batch norm updates and the tensors of c10d's
// collectives, neither of which their schemas mark) the held tensors on that
// memory are read first, all of them in one go (WriteScope). Releasing the
// alias at the read lets the job's freed memory go back to the allocator in
// stream order, as it would have.
//
// Why hold rather than copy at once: a copy costs a launch per tensor, which
// is what the launch limit forbids; multi-tensor reductions (`_foreach_`)
// give norms and maxima but not the counts, the minimum or the mean of the
// finite values, and each would still need elementwise temporaries.
//
// Writes that do not go through the dispatcher are not seen: kernels the job
// launches itself (Triton, extensions that take raw pointers) and the fused
// kernels of Inductor, which may write into an extern kernel's output. For
// such jobs OPDUMP_DEVICE_HOLD=0 reads every tensor when it is measured.

#include <algorithm>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/rows/call_args.h"
#include "opdump/cpp/device/device_batch.h"
#include "opdump/cpp/device/device_counters.h"
#include "opdump/cpp/device/device_reduce.h"
#include "opdump/cpp/common/common.h"
#include "opdump/cpp/stats/stats.h"

namespace opdump {

using namespace devstats;

namespace {

void release(Batch& b, Batch::Part& p) {
  b.held_bytes -= static_cast<int64_t>(p.held.nbytes());
  unwatch_memory(p);
  p.held.reset();
  p.storage = nullptr;
  --b.held;
  g.held.fetch_sub(1, std::memory_order_relaxed);
}

// The held tensors of `idx` given to the backend's batch kernel: one launch.
void read_by_kernel(Batch& b, const std::vector<size_t>& idx) {
  const int k = b.sig_k;
  std::vector<at::Tensor> list;
  list.reserve(idx.size());
  for (size_t i : idx) list.push_back(b.parts[i].held);
  at::Tensor block = b.kernel->call(list, k);
  const int64_t width = kFields + (k > 0 ? kSignatureHead + k : 0);
  const auto n = static_cast<int64_t>(idx.size());
  // A block of another shape would fail the whole batch at its close.
  TORCH_CHECK(block.dim() == 2 && block.size(0) == n && block.size(1) == width &&
                  block.scalar_type() == at::kDouble && block.device() == b.device,
              "the backend's opdump::fused_stats_batch returned ", block.sizes(), " ", block.scalar_type(), " on ",
              block.device(), ", not [", n, ", ", width, "] float64 values on ", b.device);
  b.kernel_blocks.push_back(block.contiguous());
  for (size_t j = 0; j < idx.size(); ++j) {
    Batch::Part& p = b.parts[idx[j]];
    p.kernel_row = b.kernel_rows + static_cast<int64_t>(j);
    p.piece_numel.assign(1, p.held.numel());
  }
  b.kernel_rows += n;
}

void signatures(Batch& b, const std::vector<size_t>& members, const at::Tensor& src);

// The held tensors of `idx` copied (and converted) into the staging buffer,
// each from the start of a row with NaN padding to the row's end: one
// concatenation for them all. An int64 tensor (which float64 does not hold
// exactly) adds its words as int32 values for its fingerprint. Fingerprints
// and sketches of the other dtypes float64 does not hold (unsigned 32- and
// 64-bit) are made from one concatenation per dtype in their own dtype,
// which then goes into the buffer.
void read_by_staging(Batch& b, const std::vector<size_t>& idx) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(b.device);
  if (!b.stage.defined()) b.stage = at::empty({stage_elements(b.sig_k > 0)}, opts);
  // Each held tensor as a flat run: in logical order, for the fingerprint
  // and sketch; otherwise a dense tensor's memory in any order, as the
  // statistics do not depend on it. Any other is copied (one launch).
  auto flat = [&](size_t i) {
    const at::Tensor& t = b.parts[i].held;
    if (t.is_contiguous() || (t.is_non_overlapping_and_dense() && !b.parts[i].held_signature))
      return t.as_strided({t.numel()}, {1}, t.storage_offset());
    return t.contiguous().view({-1});
  };
  // Appends `run` and its padding to `list`, and gives part i its rows.
  std::vector<at::Tensor> list;
  const int64_t start = b.filled;
  auto place = [&](size_t i, const at::Tensor& run) {
    Batch::Part& p = b.parts[i];
    const int64_t n = run.numel(), padded = row_padded(n);
    list.push_back(run);
    if (padded > n) list.push_back(row_padding(opts, padded - n));
    p.stage_row = b.filled / kRowWidth;
    p.piece_numel.assign(1, n);
    b.filled += padded;
  };
  // Fingerprints and sketches come from the rows at the close where
  // float64 holds the values exactly, or their words (int64); the others'
  // from their concatenation now.
  std::vector<size_t> now;
  for (size_t i : idx) {
    Batch::Part& p = b.parts[i];
    const auto dt = p.held.scalar_type();
    const bool words = p.held_signature && stages_words(dt);
    if (p.held_signature && !staged_signature_dtype(dt) && !words) {
      now.push_back(i);
      continue;
    }
    p.sig_staged = p.held_signature;
    p.sig_dtype = dt;
    const at::Tensor run = flat(i);
    place(i, run);
    if (words) {
      // Its fingerprint's words (low, then high) as int32 values, which
      // float64 holds exactly, in rows of their own after its values.
      const at::Tensor w = run.view(at::kInt);
      const int64_t n = w.numel(), padded = row_padded(n);
      list.push_back(w);
      if (padded > n) list.push_back(row_padding(opts, padded - n));
      p.word_row = b.filled / kRowWidth;
      b.filled += padded;
    }
  }
  if (!now.empty()) {
    std::vector<std::pair<at::ScalarType, std::vector<size_t>>> groups;
    for (size_t i : now) {
      const auto dt = b.parts[i].held.scalar_type();
      auto it = std::find_if(groups.begin(), groups.end(), [dt](const auto& g) { return g.first == dt; });
      if (it == groups.end()) {
        groups.push_back({dt, {}});
        it = std::prev(groups.end());
      }
      it->second.push_back(i);
    }
    for (const auto& [dt, members] : groups) {
      std::vector<at::Tensor> flats;
      flats.reserve(members.size());
      for (size_t i : members) flats.push_back(flat(i));
      const at::Tensor src = flats.size() == 1 ? flats[0] : at::cat(flats);
      int64_t offset = 0;
      for (size_t i : members) {
        const int64_t n = b.parts[i].held.numel();
        place(i, src.narrow(0, offset, n));
        offset += n;
      }
      signatures(b, members, src);
    }
  }
  if (b.filled > start) {
    at::Tensor dst = b.stage.narrow(0, start, b.filled - start);
    at::cat_out(dst, list);
  }
}

// The fingerprints and sketches of the held tensors `members`, which are
// one after the other in `src`, in logical order: a fixed number of
// launches per run of up to kSignaturePieceElements elements.
void signatures(Batch& b, const std::vector<size_t>& members, const at::Tensor& src) {
  const int k = b.sig_k;
  std::vector<size_t> run;
  int64_t run_start = 0, run_len = 0, offset = 0;
  auto flush = [&] {
    if (run.empty()) return;
    const auto m = static_cast<int64_t>(run.size());
    at::Tensor meta = at::empty({2 * m}, at::TensorOptions().dtype(at::kLong).pinned_memory(b.device.is_cuda()));
    int64_t* v = meta.mutable_data_ptr<int64_t>();
    int64_t start = 0;
    for (int64_t j = 0; j < m; ++j) {
      v[j] = b.parts[run[j]].held.numel();
      v[m + j] = start;
      start += v[j];
    }
    try {
      const at::Tensor on_device = meta.to(b.device, /*non_blocking=*/true);
      b.keep.push_back(meta);  // read by the copy until the batch's event
      b.sig_rows.push_back(signature_rows(src.narrow(0, run_start, run_len), on_device, m, k, kSignaturePieceElements));
      for (int64_t j = 0; j < m; ++j) {
        b.parts[run[j]].sig_first = b.sig_row_count + j;
        b.parts[run[j]].sig_count = 1;
      }
      b.sig_row_count += m;
    } catch (const std::exception&) {
      // Statistics without fingerprints, as when one tensor's fails.
    }
    run.clear();
    run_len = 0;
  };
  for (size_t i : members) {
    Batch::Part& p = b.parts[i];
    const int64_t n = p.held.numel();
    if (p.held_signature) {
      if (run_len + n > kSignaturePieceElements) flush();
      if (run.empty()) run_start = offset;
      run.push_back(i);
      run_len += n;
    } else {
      flush();
    }
    offset += n;
  }
  flush();
}

// Whether the memory `t` views is still all there.
bool still_there(const at::Tensor& t) {
  const c10::Storage& s = t.storage();
  if (s.data() == nullptr) return false;
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<int64_t>(s.nbytes()) >= (last + 1) * static_cast<int64_t>(t.element_size());
}

bool capturing_now(const Batch& b) {
  try {
    c10::StreamGuard guard(b.stream);
    return stream_capturing(b.probe);
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace

namespace devstats {

void read_held(Batch& b, const std::vector<size_t>& idx) {
  if (idx.empty()) return;
  // Memory freed under the tensor without an op (a storage resized to
  // nothing, as FSDP does with unsharded parameters), or freed and
  // allocated again (held_memory.cpp), no longer holds what was measured:
  // that measurement fails, and is counted.
  std::vector<size_t> readable;
  readable.reserve(idx.size());
  for (size_t i : idx) {
    if (still_there(b.parts[i].held) && !memory_changed(b.parts[i]))
      readable.push_back(i);
    else
      b.parts[i].failed = true;
  }
  try {
    if (readable.empty()) {
    } else if (b.kernel != nullptr) {
      read_by_kernel(b, readable);
    } else {
      read_by_staging(b, readable);
    }
  } catch (const std::exception& e) {
    for (size_t i : readable) b.parts[i].failed = true;
    warn(rust::Str(std::string("reading held device tensors failed: ") + e.what()));
  }
  for (size_t i : idx) release(b, b.parts[i]);
}

bool close_open(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline) {
  bool all = true;
  for (size_t i = 0; i < g.open.size();) {
    Batch& b = *g.open[i];
    if (b.parts.empty()) {
      ++i;
      continue;
    }
    if (capturing_now(b)) {
      all = false;
      ++i;
      continue;
    }
    if (g.in_flight.size() >= kMaxInFlight &&
        !g.changed.wait_until(lock, deadline, [] { return g.in_flight.size() < kMaxInFlight; }))
      return false;
    close(g.open.begin() + static_cast<std::ptrdiff_t>(i));  // erases it: same i again
  }
  return all;
}

}  // namespace devstats

namespace {

// The memory the ops running on this thread write (WriteScope), as address
// ranges: a second storage object over the same memory (from_blob, DLPack)
// is the same memory.
struct Span {
  uintptr_t begin, end;
  bool overlaps(const Span& o) const { return begin < o.end && o.begin < end; }
};
thread_local std::vector<Span> t_writing;

Span span_of(const c10::StorageImpl* s) {
  const auto begin = reinterpret_cast<uintptr_t>(const_cast<c10::StorageImpl*>(s)->_mutable_data_ptr_no_checks().get());
  // A storage of no bytes still names its address, so that identity holds.
  return Span{begin, begin + std::max<size_t>(s->nbytes(), 1)};
}

// Arguments that kernels write though the schema does not say so: the
// running statistics of the batch-norm family (native_batch_norm and the
// composite ops above it update them in training). Taken as written in any
// mode: a read too early costs one launch, a write unseen a wrong row.
bool written_unannotated(const c10::Argument& a) {
  const std::string& n = a.name();
  return n.size() > 8 && n[0] == 'r' && (n == "running_mean" || n == "running_var");
}

// The held measurements of `written` read now, before an op writes it.
void read_before_write(const std::vector<Span>& all, size_t from) {
  if (g.held.load(std::memory_order_relaxed) == 0) return;
  const auto written = c10::ArrayRef<Span>(all).slice(from);
  try {
    c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
    std::lock_guard<std::mutex> lock(g.mutex);
    for (auto& bp : g.open) {
      Batch& b = *bp;
      if (b.held == 0) continue;
      std::vector<size_t> idx;
      for (size_t i = 0; i < b.parts.size(); ++i)
        if (b.parts[i].storage != nullptr) {
          const Span held = span_of(b.parts[i].storage);
          if (std::any_of(written.begin(), written.end(), [&](const Span& w) { return w.overlaps(held); }))
            idx.push_back(i);
        }
      // Under a capture nothing may be launched, and nothing the capture
      // records runs before it ends: the batch reads them at its close.
      if (idx.empty() || capturing_now(b)) continue;
      {
        c10::StreamGuard guard(b.stream);
        read_held(b, idx);
      }
      g_early_reads.fetch_add(1, std::memory_order_relaxed);
      // The write may come on another stream: it waits for these reads.
      const c10::Stream now = c10::impl::getDeviceGuardImpl(b.device.type())->getStream(b.device);
      if (now != b.stream) {
        c10::Event done(b.device.type());
        done.record(b.stream);
        done.block(now);
      }
    }
  } catch (const std::exception& e) {
    warn(rust::Str(std::string("reading held device tensors before a write failed: ") + e.what()));
  }
}

}  // namespace

bool opens_write_scope(const c10::FunctionSchema& schema) {
  if (schema.name().rfind("c10d::", 0) == 0) return true;
  for (const auto& a : schema.arguments())
    if (is_written(a) || written_unannotated(a)) return true;
  return false;
}

WriteScope::WriteScope(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const auto& args = schema.arguments();
  const size_t first = stack.size() - args.size();
  const size_t before = t_writing.size();
  // The collectives of c10d write their tensors in place (on the
  // communication stream, after the current one) with no annotation at all:
  // every tensor they take counts as written.
  const bool collective = schema.name().rfind("c10d::", 0) == 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!collective && !is_written(args[i]) && !written_unannotated(args[i])) continue;
    for_each_tensor_indexed(stack[first + i], [&](const at::Tensor& t, int64_t) {
      if (t.defined() && t.has_storage()) t_writing.push_back(span_of(t.storage().unsafeGetStorageImpl()));
    });
  }
  pushed_ = t_writing.size() - before;
  if (pushed_ > 0) read_before_write(t_writing, before);
}

WriteScope::~WriteScope() { t_writing.resize(t_writing.size() - pushed_); }

bool being_written(const c10::StorageImpl* s) {
  if (t_writing.empty()) return false;
  const Span span = span_of(s);
  return std::any_of(t_writing.begin(), t_writing.end(), [&](const Span& w) { return w.overlaps(span); });
}

void device_close_open() {
  try {
    c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
    std::unique_lock<std::mutex> lock(g.mutex);
    close_open(lock, std::chrono::steady_clock::now() + settings().wait);
  } catch (const std::exception& e) {
    warn(rust::Str(std::string("closing device batches failed: ") + e.what()));
  }
}

}  // namespace opdump
