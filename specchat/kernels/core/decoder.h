// The decoder on packed matrices, free of torch: RMSNorm, rotary attention with grouped K/V heads,
// a gated MLP; with the branches the families of specchat/models/architectures.py add to a Llama
// layer (q/k norms, norms on each block's output, GeGLU, an embedding scale, windowed layers with
// their own rotary frequencies). Every per-row computation depends on its own row only, in a fixed
// order, so a pass over L new positions produces bit for bit what L one-position passes produce.
// qgemm.cpp binds it to torch; the test driver runs it on plain arrays.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/kernels.h"

namespace {

// The vector helpers of the norms, the attention and the activations below.

// exp(x) for 16 floats: 2^(x·log2 e), with a degree-6 polynomial for the fraction (about 2 ulp).
inline F32x16 exp16(F32x16 x) {
  x = f_max(f_min(x, f_set1(88.3762626647949f)), f_set1(-87.3365478515625f));
  const F32x16 t = f_mul(x, f_set1(1.44269504088896341f));
  const F32x16 n = f_round(t);
  const F32x16 f = f_sub(t, n);  // in [-0.5, 0.5]
  F32x16 p = f_set1(1.535336188319500e-4f);
  p = f_fmadd(p, f, f_set1(1.339887440266574e-3f));
  p = f_fmadd(p, f, f_set1(9.618437357674640e-3f));
  p = f_fmadd(p, f, f_set1(5.550332471162809e-2f));
  p = f_fmadd(p, f, f_set1(2.402264791363012e-1f));
  p = f_fmadd(p, f, f_set1(6.931472028550421e-1f));
  p = f_fmadd(p, f, f_set1(1.0f));
  return f_scale2(p, n);
}

// Σ a[i]·b[i] over n (a multiple of 16) in a fixed order.
inline float dot(const float* a, const float* b, int64_t n) {
  F32x16 acc = f_zero();
  for (int64_t i = 0; i < n; i += 16) acc = f_fmadd(f_load(a + i), f_load(b + i), acc);
  return f_sum(acc);
}

// y += w·x over n (a multiple of 16).
inline void axpy(float w, const float* x, float* y, int64_t n) {
  const F32x16 vw = f_set1(w);
  for (int64_t i = 0; i < n; i += 16) f_store(y + i, f_fmadd(vw, f_load(x + i), f_load(y + i)));
}

// A size the decoder was handed that it cannot compute with. Thrown before a pass touches any
// buffer, so no caller (a hostile model file's numbers included) can make it read or write past
// one; the torch binding turns it into a Python ValueError.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("the decoder was handed inconsistent sizes: " + what);
}

inline std::string str(int64_t n) { return std::to_string(n); }

// A matrix's own sizes: N rows in whole channel blocks of 16, K inputs in whole super-blocks of S.
inline void check_matrix(const Matrix* m, const std::string& name) {
  require(m != nullptr, name + " is missing");
  require(is_kind(code_of(m->kind)), name + " has kind " + str(code_of(m->kind)));
  require(m->N >= 1 && m->blocks >= 1 && (m->N + 15) / 16 == m->blocks,
          name + " has " + str(m->N) + " rows in " + str(m->blocks) + " blocks of 16");
  require(m->K >= 16 && m->K % 16 == 0, name + " is " + str(m->K) + " inputs wide (a multiple of 16 is needed)");
  require(m->S >= 16 && m->K % m->S == 0, name + " has super-blocks of " + str(m->S) + " over " + str(m->K) + " inputs");
  require(m->q != nullptr && (m->is_float() || (m->sc != nullptr && m->d != nullptr)), name + " lacks its arrays");
}

// `m` reads `inputs` values and writes `outputs` rows.
inline void check_shape(const Matrix* m, const std::string& name, int64_t inputs, int64_t outputs) {
  check_matrix(m, name);
  require(m->K == inputs, name + " reads " + str(m->K) + " inputs where " + str(inputs) + " are given");
  require(m->N == outputs, name + " has " + str(m->N) + " rows where " + str(outputs) + " are needed");
}

struct LayerWeights {
  const float* attn_norm;
  const float* ffn_norm;
  const Matrix *q, *k, *v, *o, *gate, *up, *down;  // q, k, v share K; so do gate and up
  const float* q_norm = nullptr;          // [head_dim]: each q head normalized before the rotation
  const float* k_norm = nullptr;          // [head_dim]: each k head
  const float* post_attn_norm = nullptr;  // [hidden]: the attention's output, before the residual sum
  const float* post_ffn_norm = nullptr;   // [hidden]: the MLP's output, likewise
  int64_t window = 0;                     // attends to the latest `window` positions (0: all of them)
  bool local_rope = false;                // rotates with the decoder's local frequencies
};

struct Decoder {
  std::vector<LayerWeights> layers;
  const Matrix* embed;
  const Matrix* head;
  const float* norm;      // [hidden]
  const float* inv_freq;  // [head_dim / 2]
  int64_t heads, kv_heads, head_dim, hidden;  // head_dim and hidden multiples of 16
  double eps, rope_scale;
  const float* inv_freq_local = nullptr;  // [head_dim / 2]: the local layers' frequencies
  double rope_scale_local = 1.0;
  float embed_scale = 1.f;  // embeddings are multiplied by it (Gemma: √hidden)
  float attn_scale = 0.f;   // attention logits are multiplied by it (0: 1/√head_dim)
  bool gelu = false;        // the MLP's gate goes through GELU (tanh form), not SiLU

  // Every size forward() computes with, checked against the matrices and the others (cheap: a
  // few comparisons per layer); throws std::invalid_argument naming the first that disagrees.
  void validate() const {
    require(heads >= 1 && kv_heads >= 1, str(heads) + " heads and " + str(kv_heads) + " key/value heads");
    require(heads % kv_heads == 0, str(heads) + " heads cannot share " + str(kv_heads) + " key/value heads evenly");
    require(head_dim >= 16 && head_dim % 16 == 0, "heads " + str(head_dim) + " wide (a multiple of 16 is needed)");
    require(hidden >= 16 && hidden % 16 == 0, "a hidden width of " + str(hidden) + " (a multiple of 16 is needed)");
    require(norm != nullptr && inv_freq != nullptr, "the final norm or the rotary frequencies are missing");
    require(std::isfinite(eps) && eps >= 0, "a norm epsilon of " + std::to_string(eps));
    require(std::isfinite(rope_scale) && std::isfinite(rope_scale_local), "a rotary scale that is not finite");
    check_matrix(embed, "the embedding");
    require(embed->K == hidden, "the embedding is " + str(embed->K) + " wide, the hidden width " + str(hidden));
    check_matrix(head, "the output head");
    require(head->K == hidden, "the output head reads " + str(head->K) + " inputs, the hidden width is " + str(hidden));
    require(!layers.empty(), "no layers");
    const int64_t qd = heads * head_dim, kvd = kv_heads * head_dim;
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerWeights& L = layers[i];
      const std::string at = "layer " + std::to_string(i) + "'s ";
      require(L.attn_norm != nullptr && L.ffn_norm != nullptr, at + "norms are missing");
      check_shape(L.q, at + "q", hidden, qd);
      check_shape(L.k, at + "k", hidden, kvd);
      check_shape(L.v, at + "v", hidden, kvd);
      check_shape(L.o, at + "o", qd, hidden);
      check_matrix(L.gate, at + "gate");
      require(L.gate->N % 16 == 0, at + "MLP is " + str(L.gate->N) + " wide (a multiple of 16 is needed)");
      check_shape(L.gate, at + "gate", hidden, L.gate->N);
      check_shape(L.up, at + "up", hidden, L.gate->N);
      check_shape(L.down, at + "down", L.gate->N, hidden);
      require(L.window >= 0, at + "window is " + str(L.window));
    }
  }

  // validate(), and the pass's own arguments: every id a row of the embedding, the new positions
  // inside the K/V capacity, the logits asked for among the new rows.
  void check_pass(const int64_t* id, int64_t M, int64_t capacity, int64_t past, int64_t n_logits,
                  int64_t head_rows) const {
    validate();
    require(M >= 1 && id != nullptr, str(M) + " new ids");
    require(past >= 0 && capacity >= past + M,
            str(past) + " past and " + str(M) + " new positions in a K/V cache of " + str(capacity));
    require(n_logits >= 0 && n_logits <= M, str(n_logits) + " rows of logits from " + str(M) + " new positions");
    require(head_rows >= 0, str(head_rows) + " head rows");
    for (int64_t m = 0; m < M; ++m)
      require(id[m] >= 0 && id[m] < embed->N,
              "token id " + str(id[m]) + ", and the embedding has " + str(embed->N) + " rows");
  }

  // out = w · x/rms(x), row by row over `width` entries (a multiple of 16), rows ld apart.
  void rms_norm(const float* x, const float* w, float* out, int64_t M, int64_t width, int64_t ld) const {
    for (int64_t m = 0; m < M; ++m) {
      const float* r = x + m * ld;
      const float inv = 1.f / std::sqrt(dot(r, r, width) / static_cast<float>(width) + static_cast<float>(eps));
      const F32x16 vinv = f_set1(inv);
      for (int64_t i = 0; i < width; i += 16)
        f_store(out + m * ld + i, f_mul(f_load(w + i), f_mul(f_load(r + i), vinv)));
    }
  }

  void rms_norm(const float* x, const float* w, float* out, int64_t M) const { rms_norm(x, w, out, M, hidden, hidden); }

  // Each of `count` head vectors of every row normalized in place (q/k norms).
  void norm_heads(float* x, int64_t ld, int64_t count, const float* w, int64_t M) const {
    for (int64_t m = 0; m < M; ++m) rms_norm(x + m * ld, w, x + m * ld, count, head_dim, head_dim);
  }

  // cos and sin of every rotary frequency `f` at `pos` (computed once per position, shared by heads and layers).
  void rope_table(const float* f, double scale, int64_t pos, float* cos_out, float* sin_out) const {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const float angle = static_cast<float>(pos) * f[i];
      cos_out[i] = std::cos(angle) * static_cast<float>(scale);
      sin_out[i] = std::sin(angle) * static_cast<float>(scale);
    }
  }

  // Rotates one head vector in place (rotate-half convention).
  void rope(float* v, const float* c, const float* s) const {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }

  // o += Σ_p (w[p]·scale)·v_p for p in [p0, p1), accumulated in order onto o (zeroed by the caller
  // before p0 = 0). Head widths of 4 or 8 registers keep the sum in registers within the range (a
  // store and reload per position otherwise sets the pace); the multiply-adds are the same, in the
  // same order, whatever the ranges, so the result is the same as one range over all positions.
  void weigh_values(const float* w, float scale, const float* v, int64_t p0, int64_t p1, float* o) const {
    switch (head_dim) {
      case 64: weigh_in_registers<4>(w, scale, v, p0, p1, o); return;
      case 128: weigh_in_registers<8>(w, scale, v, p0, p1, o); return;
      default:
        for (int64_t p = p0; p < p1; ++p) axpy(w[p] * scale, v + p * head_dim, o, head_dim);
    }
  }

  template <int NV>
  static void weigh_in_registers(const float* w, float scale, const float* v, int64_t p0, int64_t p1, float* o) {
    F32x16 acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = f_load(o + j * 16);
    for (int64_t p = p0; p < p1; ++p) {
      const F32x16 vw = f_set1(w[p] * scale);
      for (int j = 0; j < NV; ++j) acc[j] = f_fmadd(vw, f_load(v + p * NV * 16 + j * 16), acc[j]);
    }
    for (int j = 0; j < NV; ++j) f_store(o + j * 16, acc[j]);
  }

  // scores[p] = exp(scores[p] - peak) for p < seen; returns their sum, over 16 lanes in a fixed
  // order. `scores` holds whole vectors; lanes past `seen` add nothing to the sum.
  static float exponentiate(float* scores, int64_t seen, float peak) {
    const F32x16 vpeak = f_set1(peak);
    F32x16 sums = f_zero();
    for (int64_t p = 0; p < seen; p += 16) {
      const int64_t lanes = std::min<int64_t>(16, seen - p);
      std::fill(scores + p + lanes, scores + p + 16, peak);  // any finite value: its lane is dropped
      f_store(scores + p, exp16(f_sub(f_load(scores + p), vpeak)));
      std::fill(scores + p + lanes, scores + p + 16, 0.f);
      sums = f_add(sums, f_load(scores + p));
    }
    return f_sum(sums);
  }

  // out[m, h*d:(h+1)*d] = softmax(q·Kᵀ·scale) V over the positions row m sees (0..past+m, or the
  // latest `window` of them). One task per (row, K/V head) takes every query head sharing that K/V
  // head: each key and value row is read from memory once for all of them (over a long context the
  // cache, not the weights, is most of a step's bytes). Each head's sums are the same operations in
  // the same order as for a head alone, so a row's result does not depend on the other rows.
  void attend(const float* q, int64_t q_ld, const float* keys, const float* values, int64_t capacity, int64_t past,
              int64_t M, int64_t window, float* out) const {
    const int64_t groups = heads / kv_heads;
    const float scale = attn_scale > 0.f ? attn_scale : 1.f / std::sqrt(static_cast<float>(head_dim));
    constexpr int64_t kValueBlock = 128;  // value rows weighed per pass over the heads (64 KB at head_dim 128)
    parallel_for(0, M * kv_heads, 1, [&](int64_t t0, int64_t t1) {
      const int64_t stride = (past + M + 15) / 16 * 16;  // whole vectors per head
      std::vector<float> scores(groups * stride), peaks(groups), inverse(groups);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t m = t / kv_heads, kvh = t % kv_heads;
        const int64_t first = window > 0 ? std::max<int64_t>(0, past + m + 1 - window) : 0;
        const int64_t seen = past + m + 1 - first;
        const float* kh = keys + (kvh * capacity + first) * head_dim;
        const float* vh = values + (kvh * capacity + first) * head_dim;
        const float* q0 = q + m * q_ld + kvh * groups * head_dim;
        std::fill(peaks.begin(), peaks.end(), -INFINITY);
        for (int64_t p = 0; p < seen; ++p) {
          for (int64_t g = 0; g < groups; ++g) {
            const float score = dot(q0 + g * head_dim, kh + p * head_dim, head_dim) * scale;
            scores[g * stride + p] = score;
            peaks[g] = std::max(peaks[g], score);
          }
        }
        float* o0 = out + m * heads * head_dim + kvh * groups * head_dim;
        for (int64_t g = 0; g < groups; ++g) {
          inverse[g] = 1.f / exponentiate(scores.data() + g * stride, seen, peaks[g]);
          std::fill(o0 + g * head_dim, o0 + (g + 1) * head_dim, 0.f);
        }
        for (int64_t p0 = 0; p0 < seen; p0 += kValueBlock) {
          const int64_t p1 = std::min(seen, p0 + kValueBlock);
          for (int64_t g = 0; g < groups; ++g)
            weigh_values(scores.data() + g * stride, inverse[g], vh, p0, p1, o0 + g * head_dim);
        }
      }
    });
  }

  // h[m, :hidden] += o[m, :hidden] (the residual stream; o's rows, ld apart, are padded to whole channel blocks).
  void add_rows(const float* o, int64_t ld, float* h, int64_t M) const {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < hidden; ++i) h[m * hidden + i] += o[m * ld + i];
  }

  // Channel blocks of logits forward() writes per row: the head's first `head_rows` (> 0) rows, or all.
  int64_t logit_blocks(int64_t head_rows) const {
    const int64_t rows = head_rows > 0 ? std::min(head_rows, head->N) : head->N;
    return (rows + 15) / 16;
  }

  // The logits after the new ids [M] into logits [n_logits, logit_blocks(head_rows) * 16] (the last
  // n_logits rows' logits; the first head rows only where head_rows > 0, the same values as a full
  // pass's). keys[l] and values[l]: layer l's [kv_heads, capacity, head_dim], holding `past`
  // positions, written for the new ones (past + M <= capacity).
  void forward(const int64_t* id, int64_t M, float* const* keys, float* const* values, int64_t capacity,
               int64_t past, int64_t n_logits, int64_t head_rows, float* logits) const {
    check_pass(id, M, capacity, past, n_logits, head_rows);
    const int64_t qd = heads * head_dim;
    // h: the residual stream of each new row; x: its normalized copy; attn: the heads' outputs.
    std::vector<float> h(M * hidden), x(M * hidden), attn(M * qd);
    // 1. Embed: each new id's row of the embedding (scaled, for Gemma).
    for (int64_t m = 0; m < M; ++m) dequantize_row(*embed, id[m], h.data() + m * hidden);
    if (embed_scale != 1.f) {
      const F32x16 scale = f_set1(embed_scale);
      for (int64_t i = 0; i < M * hidden; i += 16) f_store(h.data() + i, f_mul(f_load(h.data() + i), scale));
    }
    // 2. The rotary tables of the new positions (global, and the local layers' own frequencies).
    const int64_t half = head_dim / 2;
    std::vector<float> cos_global(M * half), sin_global(M * half), cos_local, sin_local;
    for (int64_t m = 0; m < M; ++m)
      rope_table(inv_freq, rope_scale, past + m, cos_global.data() + m * half, sin_global.data() + m * half);
    if (inv_freq_local != nullptr) {
      cos_local.resize(M * half);
      sin_local.resize(M * half);
      for (int64_t m = 0; m < M; ++m)
        rope_table(inv_freq_local, rope_scale_local, past + m, cos_local.data() + m * half, sin_local.data() + m * half);
    }
    // 3. Each layer: attention, then the MLP, each added to the residual stream.
    for (size_t li = 0; li < layers.size(); ++li) {
      const LayerWeights& L = layers[li];
      const bool local = L.local_rope && inv_freq_local != nullptr;
      const float* cos_table = local ? cos_local.data() : cos_global.data();
      const float* sin_table = local ? sin_local.data() : sin_global.data();
      // 3a. Attention's norm, then q, k and v in one pass over their weights.
      rms_norm(h.data(), L.attn_norm, x.data(), M);
      const std::vector<int64_t> qkv_blocks = group_blocks({L.q, L.k, L.v});
      const int64_t q_ld = qkv_blocks[0] * 16, k_ld = qkv_blocks[1] * 16, v_ld = qkv_blocks[2] * 16;
      std::vector<float> qs(M * q_ld), ks(M * k_ld), vs(M * v_ld);
      float* qp = qs.data();
      float* kp = ks.data();
      float* vp = vs.data();
      run_group({L.q, L.k, L.v}, x.data(), M, qkv_blocks, {qp, kp, vp});
      // 3b. Per-head q/k norms (Qwen3, Gemma 3).
      if (L.q_norm != nullptr) norm_heads(qp, q_ld, heads, L.q_norm, M);
      if (L.k_norm != nullptr) norm_heads(kp, k_ld, kv_heads, L.k_norm, M);
      // 3c. Rotate q and k by each row's position; k and v go into the cache at that position.
      float* K = keys[li];
      float* V = values[li];
      for (int64_t m = 0; m < M; ++m) {
        const int64_t pos = past + m;
        const float* c = cos_table + m * half;
        const float* sn = sin_table + m * half;
        for (int64_t hd = 0; hd < heads; ++hd) rope(qp + m * q_ld + hd * head_dim, c, sn);
        for (int64_t hd = 0; hd < kv_heads; ++hd) {
          float* kr = kp + m * k_ld + hd * head_dim;
          rope(kr, c, sn);
          std::copy(kr, kr + head_dim, K + (hd * capacity + pos) * head_dim);
          const float* vr = vp + m * v_ld + hd * head_dim;
          std::copy(vr, vr + head_dim, V + (hd * capacity + pos) * head_dim);
        }
      }
      // 3d. Each row attends to the cached positions it sees (all before it, or a window of them).
      attend(qp, q_ld, K, V, capacity, past, M, L.window, attn.data());
      // 3e. The output projection (normalized where the family says so) joins the residual stream.
      add_matrix(*L.o, attn.data(), h.data(), M, L.post_attn_norm);
      // 3f. The MLP's norm, then gate and up in one pass over their weights.
      rms_norm(h.data(), L.ffn_norm, x.data(), M);
      const std::vector<int64_t> gu_blocks = group_blocks({L.gate, L.up});
      const int64_t inter = L.gate->N, g_ld = gu_blocks[0] * 16, u_ld = gu_blocks[1] * 16;
      std::vector<float> gate(M * g_ld), up(M * u_ld), act(M * inter);
      run_group({L.gate, L.up}, x.data(), M, gu_blocks, {gate.data(), up.data()});
      // 3g. act = SiLU(gate) · up (GELU for Gemma's GeGLU).
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < inter; i += 16) {
          const F32x16 g = f_load(gate.data() + m * g_ld + i);
          const F32x16 u = f_load(up.data() + m * u_ld + i);
          f_store(act.data() + m * inter + i, f_mul(gelu ? gelu16(g) : silu16(g), u));
        }
      // 3h. The down projection (normalized where the family says so) joins the residual stream.
      add_matrix(*L.down, act.data(), h.data(), M, L.post_ffn_norm);
    }
    // 4. The final norm and the output head, for the last n_logits rows only.
    const int64_t first = M - n_logits;
    rms_norm(h.data() + first * hidden, norm, x.data(), n_logits);
    const std::vector<int64_t> blocks{logit_blocks(head_rows)};
    run_group({head}, x.data(), n_logits, blocks, {logits});
  }

  // h += in·Wᵀ (the residual stream through one matrix), the product normalized first by `post`
  // where the family has a norm on the block's output.
  void add_matrix(const Matrix& w, const float* in, float* h, int64_t M, const float* post = nullptr) const {
    const std::vector<int64_t> blocks = group_blocks({&w});
    const int64_t ld = blocks[0] * 16;
    std::vector<float> out(M * ld);
    run_group({&w}, in, M, blocks, {out.data()});
    if (post != nullptr) rms_norm(out.data(), post, out.data(), M, hidden, ld);
    add_rows(out.data(), ld, h, M);
  }

  static F32x16 silu16(F32x16 g) { return f_div(g, f_add(f_set1(1.f), exp16(f_sub(f_zero(), g)))); }

  // GELU, tanh form: g/2·(1 + tanh(√(2/π)·(g + 0.044715·g³))), with tanh(y) = 1 − 2/(exp(2y) + 1).
  static F32x16 gelu16(F32x16 g) {
    const F32x16 cube = f_mul(f_mul(g, g), g);
    const F32x16 y = f_mul(f_set1(0.7978845608028654f), f_fmadd(f_set1(0.044715f), cube, g));
    const F32x16 tanh = f_sub(f_set1(1.f), f_div(f_set1(2.f), f_add(exp16(f_add(y, y)), f_set1(1.f))));
    return f_mul(f_mul(f_set1(0.5f), g), f_add(f_set1(1.f), tanh));
  }
};

}  // namespace
