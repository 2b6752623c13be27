// The fingerprint and sketch of a piece of a device tensor, with ATen ops on
// the device (README: "Fingerprint and sketch"; signature.h holds the
// constants). A piece is a run of the tensor's elements in logical order;
// its row, [P0, P1, P2, y_0 .. y_{K-1}] in float64, adds up over the pieces:
// the P are the fingerprint's sum of word times key in 16-bit limbs,
// F = P0 + P1 * 2^16 + P2 * 2^32 (mod 2^64), each an exact integer in
// float64; y is the sketch before its Hadamard transform (signature.h's
// SketchState, folded), which the host applies.
//
// The hashes run in int64 on values below 2^32. A 32-bit product is formed
// from two 16-bit halves so that no int64 product overflows.

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "opdump/cpp/device/device_stats.h"
#include "opdump/cpp/signature/signature.h"

namespace opdump {

namespace {

constexpr int64_t kLow32 = 0xffffffffLL;

// (x * c) mod 2^32 for int64 x in [0, 2^32).
at::Tensor mul32(const at::Tensor& x, uint32_t c) {
  const int64_t cc = c;
  const at::Tensor lo = at::bitwise_and(x, 0xffff).mul(cc);
  const at::Tensor hi = at::bitwise_and(at::bitwise_and(x.__rshift__(16), 0xffff).mul(cc), 0xffff);
  return at::bitwise_and(lo.add(hi.__lshift__(16)), kLow32);
}

at::Tensor fmix32(at::Tensor h) {
  h = at::bitwise_xor(h, h.__rshift__(16));
  h = mul32(h, 0x85ebca6bu);
  h = at::bitwise_xor(h, h.__rshift__(13));
  h = mul32(h, 0xc2b2ae35u);
  return at::bitwise_xor(h, h.__rshift__(16));
}

// 0, 1, ..., n - 1 on `device` (int64), from one arange per device kept
// for the process: a piece's indexes are a slice of it plus a constant, one
// launch instead of an arange's (n is at most 2 * the largest piece).
at::Tensor iota(const at::TensorOptions& opts, int64_t n, int64_t most) {
  static std::mutex mu;
  static auto* kept = new std::unordered_map<c10::Device, at::Tensor>;  // never freed: torch may be gone at exit
  at::Tensor base;
  {
    std::lock_guard<std::mutex> lock(mu);
    at::Tensor& t = (*kept)[opts.device()];
    if (!t.defined() || t.numel() < n) t = at::arange(std::max(n, most), opts);
    base = t;
  }
  return base.narrow(0, 0, n);
}

// The fingerprint's 64 lane keys (signature.h) on `device`, kept for the
// process like the iota.
at::Tensor lane_keys(const at::TensorOptions& opts) {
  static std::mutex mu;
  static auto* kept = new std::unordered_map<c10::Device, at::Tensor>;  // never freed: torch may be gone at exit
  std::lock_guard<std::mutex> lock(mu);
  at::Tensor& t = (*kept)[opts.device()];
  if (!t.defined()) {
    std::vector<int64_t> k(sig::kLaneKeys.k, sig::kLaneKeys.k + sig::kBlockWords);
    t = at::tensor(k, at::TensorOptions().dtype(at::kLong)).to(opts.device());
  }
  return t;
}

// The sketch's place of the element at `e` (of k buckets, a power of two;
// signature_kernels.inc defines it): its bucket, and whether its sign is
// negative. The place tables encode it, each in its own way.
struct SketchPlace {
  uint32_t bucket;
  uint32_t negative;
};
SketchPlace sketch_place(int64_t e, int k) {
  const int lg = __builtin_ctz(static_cast<unsigned>(k));
  const uint32_t g = static_cast<uint32_t>(e >> lg) * sig::kGolden;
  const uint32_t r = static_cast<uint32_t>(e) & static_cast<uint32_t>(k - 1);
  const uint32_t a = sig::fmix32(g + sig::kSignSeed);
  const uint32_t c = sig::fmix32(g + sig::kProjSeed) & static_cast<uint32_t>(k - 1);
  return {r ^ c, (a >> r) & 1u};
}

// What the fingerprint and sketch give an element by its place alone, for
// the first `elems` elements of a tensor (2 * elems words), computed once on
// the host with the definition's own functions and kept on `device` for the
// process: the key of word w, and for element e its sketch bucket (bits 0-7)
// and whether its sign flips (bit 8). With them a batch of tensors needs no
// hashing on the device: one gather each.
struct PlaceTables {
  at::Tensor key;     // int64 [2 * elems]
  at::Tensor bucket;  // int64 [elems]
};
const PlaceTables& place_tables(const at::TensorOptions& opts, int k, int64_t elems) {
  static std::mutex mu;
  static auto* kept = new std::unordered_map<c10::Device, PlaceTables>;  // never freed: torch may be gone at exit
  std::lock_guard<std::mutex> lock(mu);
  PlaceTables& t = (*kept)[opts.device()];
  if (!t.key.defined()) {
    at::Tensor key = at::empty({2 * elems}, at::TensorOptions().dtype(at::kLong));
    int64_t* kv = key.mutable_data_ptr<int64_t>();
    for (int64_t w = 0; w < 2 * elems; ++w)
      kv[w] = (sig::block_key(static_cast<uint64_t>(w)) ^ sig::kLaneKeys.k[w & (sig::kBlockWords - 1)]) | 1u;
    at::Tensor bucket = at::empty({elems}, at::TensorOptions().dtype(at::kLong));
    int64_t* bv = bucket.mutable_data_ptr<int64_t>();
    for (int64_t e = 0; e < elems; ++e) {
      const SketchPlace p = sketch_place(e, k);
      bv[e] = static_cast<int64_t>(p.bucket) | (static_cast<int64_t>(p.negative) << 8);
    }
    t.key = key.to(opts.device());
    t.bucket = bucket.to(opts.device());
  }
  return t;
}

// Words times keys in 16-bit limbs, [n, 3] int64: u0 k0, u0 k1 + u1 k0,
// u1 k1, whose sums over a piece or a tensor are exact (each below 2^53).
at::Tensor limb_terms(const at::Tensor& u, const at::Tensor& key) {
  const at::Tensor u0 = at::bitwise_and(u, 0xffff), u1 = u.__rshift__(16);
  const at::Tensor k0 = at::bitwise_and(key, 0xffff), k1 = key.__rshift__(16);
  return at::stack({u0.mul(k0), u0.mul(k1).add(u1.mul(k0)), u1.mul(k1)}, 1);
}

// The values the sketch adds, in float64 and in order: complex ones by
// magnitude (in float64, as on the CPU), NaN and infinities as 0.
at::Tensor sketch_values(const at::Tensor& t) {
  const at::Tensor x = (t.is_complex() ? at::abs(t.to(at::kComplexDouble)) : t.to(at::kDouble)).reshape({-1});
  return at::nan_to_num(x, 0.0, 0.0, 0.0);
}

// The sign (+1 or -1, float64) and the bucket of entries of PlaceTables::bucket.
at::Tensor sign_of(const at::Tensor& sb) { return at::bitwise_and(sb.__rshift__(8), 1).mul(-2).add(1).to(at::kDouble); }
at::Tensor bucket_of(const at::Tensor& sb) { return at::bitwise_and(sb, 255); }

// The piece's values as 32-bit words (int64), in order, NaNs canonical.
at::Tensor words_of(at::Tensor x) {
  if (x.is_complex()) x = at::view_as_real(x.resolve_conj());
  x = x.resolve_neg().contiguous();
  if (x.is_floating_point() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ||
                                x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16))
    x = x.masked_fill(at::isnan(x), std::numeric_limits<double>::quiet_NaN());
  x = x.reshape({-1});
  switch (x.element_size()) {
    case 1:
      return x.view(at::kByte).to(at::kLong);
    case 2:
      return at::bitwise_and(x.view(at::kShort).to(at::kLong), 0xffff);
    case 4:
      return at::bitwise_and(x.view(at::kInt).to(at::kLong), kLow32);
    default: {
      const at::Tensor v = x.view(at::kLong);
      return at::stack({at::bitwise_and(v, kLow32), at::bitwise_and(v.__rshift__(32), kLow32)}, 1).reshape({-1});
    }
  }
}

}  // namespace

at::Tensor signature_row(const at::Tensor& piece, int64_t first, int k, int64_t most) {
  const auto opts = piece.options().dtype(at::kLong);
  // Fingerprint: the sum of word times key, in 16-bit limbs. A piece has at
  // most 4 * `most` words (complex128), 2^20: each limb sum stays below 2^53.
  const at::Tensor u = words_of(piece);
  const int64_t per = piece.is_complex() ? 2 : 1;
  const int64_t word0 = first * per * (piece.element_size() / per == 8 ? 2 : 1);
  const int64_t n = piece.numel();
  // Within the place tables (a tensor's first `most` elements): their keys
  // and buckets are slices of them, no hashing on the device.
  const bool tabled = first + n <= most && word0 + u.numel() <= 2 * most;
  const PlaceTables* place = tabled ? &place_tables(opts, k, most) : nullptr;
  at::Tensor key;
  if (tabled) {
    key = place->key.narrow(0, word0, u.numel());
  } else {
    const at::Tensor w = iota(opts, u.numel(), 4 * most).add(word0);
    const at::Tensor block = fmix32(
        at::bitwise_and(mul32(at::bitwise_and(w.__rshift__(6), kLow32), sig::kGolden).add(int64_t{sig::kBlockSeed}),
                        kLow32));
    key = at::bitwise_or(at::bitwise_xor(block, lane_keys(opts).index({at::bitwise_and(w, 63)})), 1);
  }
  const at::Tensor f = limb_terms(u, key).sum(0).to(at::kDouble);
  // Sketch: element e of group g = e / K at r = e mod K goes, signed by bit r
  // of a_g, to bucket r XOR c_g.
  const at::Tensor x = sketch_values(piece);
  at::Tensor sign, bucket;
  if (tabled) {
    const at::Tensor sb = place->bucket.narrow(0, first, n);
    sign = sign_of(sb);
    bucket = bucket_of(sb);
  } else {
    const int lg = __builtin_ctz(static_cast<unsigned>(k));
    const at::Tensor e = iota(opts, x.numel(), 2 * most).add(first);
    const at::Tensor g = mul32(at::bitwise_and(e.__rshift__(lg), kLow32), sig::kGolden);
    const at::Tensor r = at::bitwise_and(e, k - 1);
    const at::Tensor a = fmix32(at::bitwise_and(g.add(static_cast<int64_t>(sig::kSignSeed)), kLow32));
    const at::Tensor c =
        at::bitwise_and(fmix32(at::bitwise_and(g.add(static_cast<int64_t>(sig::kProjSeed)), kLow32)), k - 1);
    sign = at::bitwise_and(at::bitwise_right_shift(a, r), 1).mul(-2).add(1).to(at::kDouble);
    bucket = at::bitwise_xor(r, c);
  }
  const at::Tensor y = at::zeros({k}, x.options()).index_add_(0, bucket, x.mul(sign));
  return at::cat({f, y});
}

at::Tensor signature_rows(const at::Tensor& flat, const at::Tensor& meta, int64_t m, int k, int64_t most) {
  const auto opts = flat.options().dtype(at::kLong);
  const int64_t n = flat.numel();
  const PlaceTables& place = place_tables(opts, k, most);
  const at::Tensor lengths = meta.narrow(0, 0, m), starts = meta.narrow(0, m, m);
  // Each element's tensor (seg) and its index in that tensor (e).
  const at::Tensor seg = at::repeat_interleave(iota(opts, m, most), lengths, 0, n);
  const at::Tensor e = iota(opts, n, 2 * most).sub(at::repeat_interleave(starts, lengths, 0, n));
  at::Tensor f;
  {
    // Fingerprint: word w of a tensor is at 2e + j for 8-byte elements.
    const at::Tensor u = words_of(flat);
    const int64_t per = u.numel() / std::max<int64_t>(n, 1);
    at::Tensor w = e, wseg = seg;
    if (per > 1) {
      w = e.mul(per).unsqueeze(1).add(iota(opts, per, per).unsqueeze(0)).reshape({-1});
      wseg = seg.repeat_interleave(per);
    }
    // The limb sums per tensor.
    f = at::zeros({m, 3}, opts).index_add_(0, wseg, limb_terms(u, place.key.index({w}))).to(at::kDouble);
  }
  // Sketch: element e goes, its sign flipped or not, to its bucket in row
  // seg of a [m, k] table, as signature_row adds it.
  const at::Tensor x = sketch_values(flat);
  const at::Tensor sb = place.bucket.index({e});
  const at::Tensor idx = seg.mul(k).add(bucket_of(sb));
  const at::Tensor y = at::zeros({m * k}, x.options()).index_add_(0, idx, x.mul(sign_of(sb))).view({m, k});
  return at::cat({f, y}, 1).reshape({-1});
}

// ---- fingerprints and sketches of the staging buffer's rows ----------------

namespace {

// What the staged rows' fingerprints and sketches take from an element's or
// word's place, on `device`, made once on the host for tensors of up to
// `elems` elements and kept for the process (never freed: torch may be gone
// at exit). The key of word w is (B[w / 64] XOR L[w mod 64]) OR 1, which is
// (B & ~1) XOR (L | 1): blocks [2 * elems / 64] and lanes [64], int64
// below 2^32. An element's sketch bucket b and sign s as one index
// b + k * (s is -1), int32 [elems], into `signs` ([2k + 1, k] float64: the
// rows +e_b, then -e_b, then the zero row of the padding index 2k that
// non-finite values take), and `pad` (int32 [1]: 2k). `low32` and `low16`:
// one-element masks whose int64 type widens the int32 or int16 words they
// are applied to.
struct StagedTables {
  at::Tensor blocks, lanes, buckets, signs, pad, low32, low16;
};
const StagedTables& staged_tables(const at::TensorOptions& opts, int k, int64_t elems) {
  static std::mutex mu;
  static auto* kept = new std::unordered_map<c10::Device, StagedTables>;
  std::lock_guard<std::mutex> lock(mu);
  StagedTables& t = (*kept)[opts.device()];
  if (!t.blocks.defined()) {
    const int64_t nb = 2 * elems / sig::kBlockWords;
    at::Tensor blocks = at::empty({nb}, at::TensorOptions().dtype(at::kLong));
    int64_t* bv = blocks.mutable_data_ptr<int64_t>();
    for (int64_t i = 0; i < nb; ++i) bv[i] = sig::block_key(static_cast<uint64_t>(i) * sig::kBlockWords) & ~1u;
    at::Tensor lanes = at::empty({sig::kBlockWords}, at::TensorOptions().dtype(at::kLong));
    int64_t* lv = lanes.mutable_data_ptr<int64_t>();
    for (int j = 0; j < sig::kBlockWords; ++j) lv[j] = sig::kLaneKeys.k[j] | 1u;
    at::Tensor buckets = at::empty({elems}, at::TensorOptions().dtype(at::kInt));
    int32_t* uv = buckets.mutable_data_ptr<int32_t>();
    for (int64_t e = 0; e < elems; ++e) {
      const SketchPlace p = sketch_place(e, k);
      uv[e] = static_cast<int32_t>(p.bucket + static_cast<uint32_t>(k) * p.negative);
    }
    at::Tensor signs = at::zeros({2 * k + 1, k}, at::TensorOptions().dtype(at::kDouble));
    double* sv = signs.mutable_data_ptr<double>();
    for (int b = 0; b < k; ++b) {
      sv[b * k + b] = 1.0;
      sv[(k + b) * k + b] = -1.0;
    }
    const at::Tensor masks = at::tensor(std::vector<int64_t>{kLow32, 0xffff}, at::TensorOptions().dtype(at::kLong));
    t.blocks = blocks.to(opts.device());
    t.lanes = lanes.to(opts.device());
    t.buckets = buckets.to(opts.device());
    t.signs = signs.to(opts.device());
    t.pad = at::tensor(std::vector<int32_t>{2 * k}, at::TensorOptions().dtype(at::kInt)).to(opts.device());
    const at::Tensor m = masks.to(opts.device());
    t.low32 = m.narrow(0, 0, 1);
    t.low16 = m.narrow(0, 1, 1);
  }
  return t;
}

// The fingerprint's words of rows `x` ([n, width] float64, values of a
// tensor of `dtype`, NaN canonical), [n, width * words per element] int64,
// each below 2^32.
at::Tensor staged_words(const at::Tensor& x, at::ScalarType dtype, const StagedTables& tab) {
  switch (dtype) {
    case at::kDouble:
      // The two 32-bit halves of each value, low first (little-endian).
      return at::bitwise_and(x.view(at::kInt), tab.low32);
    case at::kFloat:
    case at::kBFloat16:
    case at::kHalf: {
      // A NaN converted keeps no canonical form (vectorised conversions to
      // bfloat16 give 0xffff, CUDA's to float32 0x7fffffff): the one
      // nan_to_num writes (the NaN scalar converted on the host), as
      // words_of's fill.
      const double inf = std::numeric_limits<double>::infinity();
      at::Tensor y = x.to(dtype);
      y.nan_to_num_(std::numeric_limits<double>::quiet_NaN(), inf, -inf);
      if (dtype == at::kFloat) return at::bitwise_and(y.view(at::kInt), tab.low32);
      return at::bitwise_and(y.view(at::kShort), tab.low16);
    }
    case at::kInt:
      // The padding (NaN) as 0: an integer has no NaN to convert to.
      return at::bitwise_and(at::nan_to_num(x, 0.0).to(dtype), tab.low32);
    case at::kShort:
      return at::bitwise_and(at::nan_to_num(x, 0.0).to(dtype), tab.low16);
    default:  // kBool, kByte, kChar
      return at::nan_to_num(x, 0.0).to(dtype).view(at::kByte).to(at::kLong);
  }
}

}  // namespace

bool staged_signature_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
    case at::kFloat:
    case at::kBFloat16:
    case at::kHalf:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

at::Tensor staged_fingerprints(at::Tensor& x, const at::Tensor& meta, const std::vector<StagedGroup>& groups, int k,
                               int64_t elems) {
  const int64_t rows = x.size(0), width = x.size(1);
  const auto longs = x.options().dtype(at::kLong);
  const StagedTables& tab = staged_tables(longs, k, elems);
  const at::Tensor q = meta.narrow(0, 0, rows);
  // One NaN for every NaN, as the fingerprint's words of float64 values
  // take it (the padding and the statistics are unchanged by it); the other
  // dtypes' words make theirs canonical after their conversion.
  const double inf = std::numeric_limits<double>::infinity();
  if (std::any_of(groups.begin(), groups.end(), [](const StagedGroup& g) { return g.dtype == at::kDouble; }))
    x.nan_to_num_(std::numeric_limits<double>::quiet_NaN(), inf, -inf);
  // The fingerprint sums (rows of no group: left as they are, unread), in
  // int64 arithmetic, which wraps modulo 2^64 as the fingerprint does:
  // word times key, each below 2^32, summed per row. The group over every
  // row comes first; the others' rows are gathered and overwrite theirs.
  // Words and keys take 16 bytes a word (24 when the rows are gathered
  // first): chunks of 1,792 rows of float32 words (28 MiB) or 2^20 words
  // (24 MiB) beside a full buffer of 28 MiB.
  at::Tensor f = at::empty({rows}, longs);
  for (const auto& g : groups) {
    const bool all = g.rows_at < 0;
    const int64_t per = g.dtype == at::kDouble ? 2 : 1;
    const int64_t chunk_words = all ? int64_t{7} << 18 : int64_t{1} << 20;
    const int64_t most = std::max<int64_t>(1, chunk_words / (width * per));
    for (int64_t r0 = 0; r0 < g.count; r0 += most) {
      const int64_t c = std::min(most, g.count - r0);
      const at::Tensor idx = all ? at::Tensor() : meta.narrow(0, g.rows_at + r0, c);
      const at::Tensor xd = all ? x.narrow(0, r0, c) : x.index_select(0, idx);
      const at::Tensor qd = all ? q.narrow(0, r0, c) : meta.narrow(0, g.q_at + r0, c);
      at::Tensor u = staged_words(xd, g.dtype, tab);
      const int64_t per_row = u.size(1) / sig::kBlockWords;
      const at::Tensor blocks = tab.blocks.view({-1, per_row}).index_select(0, qd);
      u.view({c, per_row, sig::kBlockWords}).mul_(at::bitwise_xor(blocks.unsqueeze(2), tab.lanes.view({1, 1, -1})));
      if (all) {
        at::Tensor part = f.narrow(0, r0, c);
        at::sum_out(part, u, 1);
      } else {
        f.index_copy_(0, idx, u.sum(1));
      }
    }
  }
  return f.view(at::kDouble);
}

at::Tensor staged_sketch(const at::Tensor& x, const at::Tensor& q, const at::Tensor& starts, int k, int64_t elems) {
  const int64_t rows = x.size(0), width = x.size(1);
  const StagedTables& tab = staged_tables(x.options().dtype(at::kLong), k, elems);
  // Element e of its tensor adds its value to its row's bucket b, negated
  // when its sign flips: one embedding_bag over the rows, with the values
  // as the per-sample weights of the rows of `signs` that its index picks
  // (b, or b + k when negated). A non-finite value (NaN by now) counts as
  // 0: its index is the padding index, which embedding_bag skips (NaN times
  // a zero row would be NaN). Alive beside `x`: the indexes and
  // embedding_bag's own index of bags, 8 bytes an element (9 while the mask
  // lives; row_stats makes its own again after, rather than keep it: 3.5 MiB
  // more at the peak for one launch less).
  at::Tensor pick = tab.buckets.view({-1, width}).index_select(0, q);
  at::where_out(pick, at::isnan(x), tab.pad, pick);
  return std::get<0>(at::_embedding_bag_forward_only(tab.signs, pick.view({-1}), starts.narrow(0, 0, rows), false,
                                                     /*mode=sum*/ 0, false, x.view({-1}), false, 2 * k));
}

uint64_t staged_padding_fingerprint(at::ScalarType dtype, int64_t n) {
  // The padding's canonical NaN as the fingerprint's words (integers: 0).
  uint32_t words[2] = {0, 0};
  int per = 1;
  switch (dtype) {
    case at::kDouble:
      per = 2;
      words[1] = 0x7ff80000u;
      break;
    case at::kFloat:
      words[0] = 0x7fc00000u;
      break;
    case at::kBFloat16:
      words[0] = 0x7fc0u;
      break;
    case at::kHalf:
      words[0] = 0x7e00u;
      break;
    default:
      return 0;
  }
  const int64_t padded = (n + kStagedRowWidth - 1) / kStagedRowWidth * kStagedRowWidth;
  uint64_t f = 0;
  for (int64_t w = n * per; w < padded * per; ++w) {
    const uint64_t key = (sig::block_key(static_cast<uint64_t>(w)) ^ sig::kLaneKeys.k[w & (sig::kBlockWords - 1)]) | 1u;
    f += key * words[w % per];
  }
  return f;
}

void signature_finish_row(const double* v, int k, sig::Signature& s) {
  s.f += static_cast<uint64_t>(v[0]) + (static_cast<uint64_t>(v[1]) << 16) + (static_cast<uint64_t>(v[2]) << 32);
  double y[sig::kMaxSketch];
  for (int j = 0; j < k; ++j) y[j] = v[kSignatureHead + j];
  sig::SketchState st(k);
  // A state whose row 0 holds y folds to y itself.
  for (int j = 0; j < k; ++j) st.acc[j] = y[j];
  sig::sketch_finish(st, s);
}

void put_signature(const SignatureValues& s, TensorRow& row) {
  row.has_fingerprint = s.has;
  row.fingerprint = s.fingerprint;
  row.sketch.clear();
  for (double v : s.sketch) row.sketch.push_back(v);
}

SignatureValues signature_of_row(const TensorRow& row) {
  SignatureValues s;
  s.has = row.has_fingerprint;
  s.fingerprint = row.fingerprint;
  s.sketch.assign(row.sketch.begin(), row.sketch.end());
  return s;
}

}  // namespace opdump
