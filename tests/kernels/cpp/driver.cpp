// specchat's kernels without torch: built once per instruction set (-DSPECCHAT_ISA_*), it checks
// what every variant must hold and prints one "PASS <check>" or "FAIL <check>" line per check.
//
//   driver OUT_DIR                       checks rows; writes OUT_DIR/ops.bin, matrices.bin, layer.bin
//   driver OUT_DIR REF_DIR NAME TOL      also compares them with another build's (NAME says whose):
//                                        operations and matrices bit for bit; the layer bit for
//                                        bit if TOL is 0, else within TOL of the reference's
//                                        largest magnitude
//
// Operations and matrix outputs use no libm (beyond exactly rounded fma, nearbyint, ldexp), so
// they must match any build's bits. The layer's rotary embedding
// calls std::sin and std::cos, which may round differently on another platform's C library; a
// build on the same platform gives the same bits. Every value comes from a seeded mt19937's raw
// output, which the C++ standard fixes (its distributions it does not).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/decoder.h"

namespace {

// One thread: the exactness checked here does not depend on how work is split.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t, const Fn& fn) {
  if (begin < end) fn(begin, end);
}

#if defined(__aarch64__)
constexpr const char* MACHINE = "aarch64";
#elif defined(__x86_64__)
constexpr const char* MACHINE = "x86-64";
#else
constexpr const char* MACHINE = "other";
#endif

int failures = 0;

void report(bool ok, const std::string& check) {
  std::printf("%s %s %s: %s\n", ok ? "PASS" : "FAIL", MACHINE, NAME, check.c_str());
  failures += ok ? 0 : 1;
}

struct Rng {
  std::mt19937 engine;
  explicit Rng(uint32_t seed) : engine(seed) {}
  uint32_t below(uint32_t n) { return engine() % n; }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(engine() >> 8) * 0x1p-24f; }
  // A positive fp16 value in [2^(low-15), 2^(high-14)), as bits.
  uint16_t half(int low, int high) {
    return static_cast<uint16_t>((low + below(high - low + 1)) << 10 | below(1024));
  }
};

// A matrix's packed arrays, random, and the core's view of them.
struct Packed {
  std::vector<uint8_t> q, sc, mn, qh;
  std::vector<uint16_t> d, dm;
  std::vector<float> bias;
  Matrix view;
};

// Float weights (kinds 16 and 32): [N/16][16][K] halves or floats, random.
Packed random_float_matrix(int kind, int64_t N, int64_t K, Rng& rng, bool bias) {
  const int64_t blocks = (N + 15) / 16, count = blocks * 16 * K;
  Packed p;
  p.q.resize(count * (kind == 16 ? 2 : 4));
  for (int64_t i = 0; i < count; ++i) {
    if (kind == 16) {
      const uint16_t h = static_cast<uint16_t>(rng.half(12, 16) | (rng.below(2) << 15));
      std::memcpy(p.q.data() + 2 * i, &h, 2);
    } else {
      const float f = rng.uniform(-1.f, 1.f);
      std::memcpy(p.q.data() + 4 * i, &f, 4);
    }
  }
  if (bias) {
    p.bias.resize(blocks * 16);
    for (auto& b : p.bias) b = rng.uniform(-1.f, 1.f);
  }
  p.view = Matrix{static_cast<Kind>(kind), p.q.data(), nullptr, nullptr, nullptr, nullptr, nullptr, K, 0, N, K, blocks,
                  bias ? p.bias.data() : nullptr};
  return p;
}

Packed random_matrix(int kind, int64_t N, int64_t K, int64_t S, Rng& rng, int d_low, int d_high, bool bias) {
  if (kind == 16 || kind == 32) return random_float_matrix(kind, N, K, rng, bias);
  const int64_t blocks = (N + 15) / 16, group = kind == 8 ? 16 : 32;
  Packed p;
  auto bytes = [&](int64_t n, uint32_t below) {
    std::vector<uint8_t> out(n);
    for (auto& b : out) b = static_cast<uint8_t>(rng.below(below));
    return out;
  };
  auto halves = [&](int64_t n) {
    std::vector<uint16_t> out(n);
    for (auto& h : out) h = rng.half(d_low, d_high);
    return out;
  };
  p.q = bytes(blocks * (K / group) * 256, 256);
  const bool nibbles = kind == 4 || kind == 5;
  if (nibbles) {
    p.sc = bytes(blocks * (K / 32) * 16, 64);
    p.mn = bytes(blocks * (K / 32) * 16, 64);
    p.dm = halves(blocks * (K / S) * 16);
  } else {
    p.sc = bytes(blocks * (K / 16) * 16, 256);  // any int8
  }
  if (kind == 5) p.qh = bytes(blocks * (K / 32) * 64, 256);
  if (kind == 6) p.qh = bytes(blocks * (K / 32) * 128, 256);
  p.d = halves(blocks * (K / S) * 16);
  if (bias) {
    p.bias.resize(blocks * 16);
    for (auto& b : p.bias) b = rng.uniform(-1.f, 1.f);
  }
  p.view = Matrix{static_cast<Kind>(kind), p.q.data(), p.sc.data(), nibbles ? p.mn.data() : nullptr, p.d.data(),
                  nibbles ? p.dm.data() : nullptr, kind == 5 || kind == 6 ? p.qh.data() : nullptr,
                  S, kind == 8 ? 128 : kind == 6 ? 32 : 0, N, K, blocks, bias ? p.bias.data() : nullptr};
  return p;
}

std::vector<float> pass(const Matrix& m, const float* x, int64_t M) {
  std::vector<float> y(M * m.blocks * 16);
  run_group({&m}, x, M, {m.blocks}, {y.data()});
  return y;
}

// Rows of very different scales, one of inputs that all quantize to ±127, one of zeros.
std::vector<float> inputs(int64_t M, int64_t K, Rng& rng) {
  std::vector<float> x(M * K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float scale = 0.01f * static_cast<float>(1 << (m % 12));
      x[m * K + k] = m == 0 ? (k % 3 == 0 ? -2.f : 2.f) : m == 1 ? 0.f : scale * rng.uniform(-1.f, 1.f);
    }
  return x;
}

// Every row of a pass 1 to 8 rows wide equals that row's one-row pass; returns the one-row outputs.
std::vector<float> check_rows(const char* name, int kind, Rng& rng) {
  const int64_t M = 12, N = 40, K = 512;
  const Packed p = random_matrix(kind, N, K, 256, rng, 3, 8, true);
  const std::vector<float> x = inputs(M, K, rng);
  const int64_t width = p.view.blocks * 16;
  std::vector<float> alone;
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<float> y = pass(p.view, x.data() + m * K, 1);
    alone.insert(alone.end(), y.begin(), y.end());
  }
  bool same = true;
  for (int64_t rows = 1; rows <= 8; ++rows)
    for (int64_t start = 0; start + rows <= M; start += 3) {
      const std::vector<float> y = pass(p.view, x.data() + start * K, rows);
      same = same && std::memcmp(y.data(), alone.data() + start * width, y.size() * sizeof(float)) == 0;
    }
  report(same, std::string(name) + " rows of passes 1-8 wide equal one-row passes bit for bit");
  return alone;
}

// A tiny decoder of one layer (hidden 64, 4 heads, 2 K/V heads of 16, MLP 128, vocab 64): three
// positions one at a time, then four in one pass; returns the four positions' logits.
std::vector<float> check_layer(Rng& rng) {
  const int64_t hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, inter = 128, vocab = 64, S = 64;
  const int64_t capacity = 8, past = 3, M = 4;
  Packed embed = random_matrix(8, vocab, hidden, S, rng, 1, 3, false);
  Packed head = random_matrix(6, vocab, hidden, S, rng, 2, 4, false);
  Packed q = random_matrix(4, heads * head_dim, hidden, S, rng, 3, 5, true);  // Qwen2's q/k/v biases
  Packed k = random_matrix(4, kv_heads * head_dim, hidden, S, rng, 3, 5, true);
  Packed v = random_matrix(16, kv_heads * head_dim, hidden, S, rng, 3, 5, true);  // an F16 file's
  Packed o = random_matrix(6, hidden, heads * head_dim, S, rng, 2, 4, false);
  Packed gate = random_matrix(4, inter, hidden, S, rng, 3, 5, false);
  Packed up = random_matrix(5, inter, hidden, S, rng, 3, 5, false);
  Packed down = random_matrix(8, hidden, inter, S, rng, 1, 3, false);
  std::vector<float> attn_norm(hidden), ffn_norm(hidden), norm(hidden), inv_freq(head_dim / 2);
  for (auto* w : {&attn_norm, &ffn_norm, &norm})
    for (auto& x : *w) x = rng.uniform(0.5f, 1.5f);
  for (int64_t i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::ldexp(1.f, -static_cast<int>(i));  // no libm
  const Decoder decoder{{{attn_norm.data(), ffn_norm.data(), &q.view, &k.view, &v.view, &o.view, &gate.view,
                          &up.view, &down.view}},
                        &embed.view, &head.view, norm.data(), inv_freq.data(), heads, kv_heads, head_dim, hidden,
                        1e-6, 1.0};
  const int64_t ids[past + M] = {1, 17, 42, 5, 63, 0, 29};
  const int64_t width = decoder.logit_blocks(0) * 16;
  auto run = [&](int64_t positions) {  // the last M positions' logits, in passes of `positions` (1 or M)
    std::vector<float> keys(kv_heads * capacity * head_dim), values(keys.size()), logits(M * width);
    float* K = keys.data();
    float* V = values.data();
    for (int64_t at = 0; at < past; ++at) {
      std::vector<float> ignored(width);
      decoder.forward(ids + at, 1, &K, &V, capacity, at, 1, 0, ignored.data());
    }
    for (int64_t at = past; at < past + M; at += positions)
      decoder.forward(ids + at, positions, &K, &V, capacity, at, positions, 0, logits.data() + (at - past) * width);
    return logits;
  };
  const std::vector<float> one_by_one = run(1), together = run(M);
  report(one_by_one.size() == together.size() &&
             std::memcmp(one_by_one.data(), together.data(), together.size() * sizeof(float)) == 0,
         "a four-position pass of the layer equals one-position passes bit for bit");
  return together;
}

// The integer phase at its extremes, through the dot units a pass of R rows uses (one row at a
// time, or two on i8mm): the largest weight of each kind against inputs of -128 and 127 (the
// widest sums AVX2's 16-bit pairs must hold, a whole group of them where a part at a time leaves
// room), then the factor sums and the offset. Each int32 is returned as two 16-bit halves, which
// floats hold exactly.
template <int R>
std::vector<int32_t> edge_sums() {
  using D = Dot<R>;
  QuantRows x{std::vector<int8_t>(R * 64), {}, {}, {}, 64, 64};
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 64; ++i) x.q[r * 64 + i] = static_cast<int8_t>(r == 0 ? -128 : r == 1 ? 127 : (i % 3 ? -128 : 127));
  if (ReadsInterleaved<D>::value) interleave_rows(x, R);  // as quantize_rows does
  uint8_t top[64], mixed[64], sc[16];
  int8_t ssc[16];
  int16_t sums[4] = {-4096, 4064, -32768, 32767};
  for (int i = 0; i < 64; ++i) top[i] = 255, mixed[i] = static_cast<uint8_t>(i * 37 + 11);
  for (int c = 0; c < 16; ++c) sc[c] = static_cast<uint8_t>(c == 0 ? 255 : 63 - c), ssc[c] = static_cast<int8_t>(c == 0 ? -128 : 127 - 9 * c);
  auto group = [&](auto maxw, const uint8_t* w, int64_t at, const typename D::Scale& scale, auto& acc, const auto& units) {
    constexpr int MAXW = decltype(maxw)::value;
    const uint8_t mask = MAXW == 255 ? 0xFF : static_cast<uint8_t>(MAXW);
    const Bytes a = b_bits<0>(b_load(w), mask), b = b_bits<0>(b_load(w == top ? top : mixed), mask);
    const typename D::Octet octets[4] = {D::template octet<MAXW>(a, b), D::template octet<MAXW>(b, a),
                                         D::template octet<MAXW>(a, a), D::template octet<MAXW>(b, b)};
    for_outer_parts<D, R>([&](auto outer) {  // as the kernels go through the parts
      add_group<D, MAXW, decltype(outer)::value>(acc, octets, units.row, at, scale);
    });
  };
  const Units<D, R> units(x, 0);
  typename D::Acc acc[Units<D, R>::N];
  for (auto& a : acc) a = D::acc_zero();
  group(std::integral_constant<int, 15>{}, top, 0, D::scale_u8(sc), acc, units);
  group(std::integral_constant<int, 31>{}, mixed, 32, D::scale_i8(ssc), acc, units);
  group(std::integral_constant<int, 63>{}, top, 0, D::scale_i8(ssc), acc, units);
  group(std::integral_constant<int, 255>{}, top, 32, D::scale_i8(ssc), acc, units);
  group(std::integral_constant<int, 255>{}, mixed, 0, D::scale_u8(sc), acc, units);
  std::vector<int32_t> out;
  for (int r = 0; r < R; ++r) {
    const I32x16 a = D::row(acc[r / D::ROWS], r % D::ROWS);
    const I32x16 b = p_dot(p_dot(i_zero(), p_u8(sc, top), sums), p_i8(ssc, nullptr), sums + 2);
    for (const I32x16& v : {a, b, i_sub_mul(a, b, 128), i_sub_mul(b, a, -7)}) {
      int32_t lanes[16];
      std::memcpy(lanes, &v, sizeof lanes);  // every instruction set's I32x16 is 16 int32 lanes in order
      for (int32_t lane : lanes) out.push_back(lane >> 16), out.push_back(lane & 0xFFFF);
    }
  }
  return out;
}

// Each vector operation on the edge values where instruction sets differ unless told otherwise:
// NaN, signed zeros, infinities, values past int32's range, ties, subnormal results, the widest
// integer products. NaNs are written as one pattern: which NaN an operation returns is not part
// of the contract (only that it is NaN). f_peak's lanes hold no NaN, as its callers' do not.
std::vector<float> edge_ops() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float a[16] = {nan, 0.f, -0.f, 0.f, inf, -inf, 3e9f, -3e9f, 2.5f, -2.5f, 0.5f, 1e-40f, -1.5f, 127.5f, 89.f, -100.f};
  const float b[16] = {1.f, -0.f, 0.f, nan, 1.f, -inf, -3e9f, 3e9f, -2.5f, 3.5f, -0.5f, -1e-40f, 1.5f, -127.5f, -88.f, 1e30f};
  const float c[16] = {1.f, 2.f, -0.f, 0.f, -inf, 3.f, 1e-30f, -1e-30f, 7.f, 6.25f, 0.25f, 0.f, nan, 1.f, 2.f, 3.f};
  const float scales[16] = {0.75f, 1.f, 1.5f, 0.7f, 1.99f, 1.f, 0.5f, 1.25f, 0.9f, 1.1f, 0.75f, 1.f, 1.3f, 1.7f, 0.6f, 1.f};
  const float powers[16] = {-126.f, -126.f, -125.f, -127.f, 127.f, 128.f, 0.f, -1.f, 1.f, -64.f, 64.f, -100.f, 100.f, -3.f, 3.f, -126.f};
  const float peaks[16] = {0.f, 1.f, 3.f, 2.f, 0.f, 7.f, 7.f, 1e-40f, 5.f, 6.f, 0.5f, 7.f, 2.f, 1.f, 0.f, 4.f};
  const uint16_t halves[16] = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x0001, 0x8001, 0x03FF, 0x3C00,
                               0x7BFF, 0x8000, 0x0000, 0x3555, 0xC001, 0x0400, 0x83FF, 0x5A5A};
  const int8_t small[16] = {-128, 127, -1, 0, 1, 2, -2, 100, -100, 63, -63, 64, -64, 5, -5, 7};
  const uint8_t large[16] = {0, 255, 128, 127, 1, 254, 200, 17, 3, 90, 160, 33, 250, 64, 65, 129};
  const int8_t x4[4] = {-128, 127, -128, 127};
  const F32x16 va = f_load(a), vb = f_load(b), vc = f_load(c);
  std::vector<float> out;
  auto put = [&](F32x16 v) {
    float lanes[16];
    f_store(lanes, v);
    out.insert(out.end(), lanes, lanes + 16);
  };
  for (const F32x16& v : {f_min(va, vb), f_min(vb, va), f_max(va, vb), f_max(vb, va), f_abs(va), f_abs(vb), f_round(va),
                       f_round(f_mul(va, f_set1(0.5f))), f_add(va, vb), f_sub(va, vb), f_mul(va, vb), f_div(va, vb),
                       f_div(vc, vb), f_fmadd(va, vb, vc), f_fnmadd(va, vb, vc), f_fmadd(vb, vc, va),
                       f_scale2(f_load(scales), f_load(powers)), exp16(va), exp16(vb), exp16(vc), f_half(halves),
                       f_u8(large), f_i8(small)})
    put(v);
  I32x16 ints;
  int32_t wide[16] = {16777217, INT32_MIN, INT32_MAX, -16777217, 0, 1, -1, 33554435};
  std::memcpy(&ints, wide, sizeof wide);  // every instruction set's I32x16 is 16 int32 lanes in order
  put(f_from_i(ints));
  for (const F32x16& scaled : {va, vb, vc, f_mul(va, f_set1(100.f))}) {
    int8_t q[16];
    const int32_t sum = quantize16(scaled, q);
    for (int8_t v : q) out.push_back(v);
    out.push_back(static_cast<float>(sum));
  }
  out.push_back(f_sum(va));
  out.push_back(f_sum(vc));
  out.push_back(f_sum(f_load(scales)));
  out.push_back(f_peak(f_load(peaks)));
  for (int32_t v : edge_sums<1>()) out.push_back(static_cast<float>(v));
  for (int32_t v : edge_sums<2>()) out.push_back(static_cast<float>(v));
  for (int32_t v : edge_sums<3>()) out.push_back(static_cast<float>(v));
  for (float& v : out)
    if (std::isnan(v)) v = nan;
  return out;
}

bool write(const std::string& path, const std::vector<float>& values) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(values.data(), sizeof(float), values.size(), f) == values.size();
  return std::fclose(f) == 0 && ok;
}

std::vector<float> read(const std::string& path) {
  std::vector<float> values;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return values;
  float x;
  while (std::fread(&x, sizeof x, 1, f) == 1) values.push_back(x);
  std::fclose(f);
  return values;
}

void compare(const std::string& what, const std::vector<float>& got, const std::string& ref_path,
             const std::string& ref_name, double tolerance) {
  const std::vector<float> ref = read(ref_path);
  if (ref.size() != got.size() || ref.empty()) {
    report(false, what + " equal " + ref_name + "'s (no comparable output in " + ref_path + ")");
    return;
  }
  double peak = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    peak = std::max(peak, std::fabs(static_cast<double>(ref[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  const bool bits = std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)) == 0;
  if (tolerance == 0) {
    report(bits, what + " equal " + ref_name + "'s bit for bit");
  } else {
    char line[200];
    std::snprintf(line, sizeof line, " within %g of %s's peak %.3g (largest difference %.3g%s)", tolerance,
                  ref_name.c_str(), peak, worst, bits ? ", bit for bit" : "");
    report(worst <= tolerance * peak, what + line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5) {
    std::fprintf(stderr, "usage: %s OUT_DIR [REF_DIR NAME TOLERANCE]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  Rng rng(2026);
  std::vector<float> matrices;
  for (const auto& [name, kind] : {std::pair<const char*, int>{"q4", 4}, {"q5", 5}, {"q6", 6}, {"q8", 8},
                                   {"f16", 16}, {"f32", 32}}) {
    const std::vector<float> alone = check_rows(name, kind, rng);
    matrices.insert(matrices.end(), alone.begin(), alone.end());
  }
  const std::vector<float> layer = check_layer(rng), ops = edge_ops();
  if (!write(out + "/matrices.bin", matrices) || !write(out + "/layer.bin", layer) || !write(out + "/ops.bin", ops)) {
    report(false, "writing the outputs to " + out);
    return 1;
  }
  if (argc == 5) {
    const std::string ref = argv[2], name = argv[3];
    compare("the vector operations on edge values", ops, ref + "/ops.bin", name, 0);
    compare("q4, q5, q6, q8, f16 and f32 outputs", matrices, ref + "/matrices.bin", name, 0);
    compare("the layer's logits", layer, ref + "/layer.bin", name, std::atof(argv[4]));
  }
  return failures == 0 ? 0 : 1;
}
