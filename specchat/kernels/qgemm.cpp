// Block-quantized linear layers for the CPU, and the decoder that runs on them.
//
// Weights keep the GGUF file's own quantization (llama.cpp's K-quant and 32-weight blocks, F16 and
// F32, repacked), so the target computes with exactly the weights llama.cpp reads. Activations
// are quantized to int8 per row and per block of S inputs; each super-block's dot products, group
// scales included, are summed exactly in int32 and scaled in floats in a fixed order
// (core/blocks.h). Each output row depends only on its own input row, through the same float
// operations whatever the number of rows, so a verify pass over several positions reproduces
// single-token passes bit for bit, and speculative decoding stays exact.
//
// This file is only the torch binding: the kernels and the decoder live in core/, which needs no
// torch (a plain C++ test driver builds it for other CPUs too), and compute with the vector
// operations of one header of isa/, chosen by the SPECCHAT_ISA_* define the library is built with
// (one library per set): isa/scalar.h is plain C++ and says what each operation means lane by
// lane; isa/avx512.h, avxvnni.h, avx2.h, neon.h and i8mm.h do the same operations per lane (and
// form the exact integer sums each its own way), so every variant gives the same bits, and a
// packed model is read the same way by all of them. Built with
// -ffp-contract=off, so the compiler fuses no multiply and add that the code does not fuse itself.
//
// The packed layout (which arrays each kind of matrix holds, and how their bytes are ordered) is
// core/layout.h's table; QMat below checks every array's size against it.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/decoder.h"
#include "core/repack.h"

namespace {

// The core's threads are ATen's (OpenMP where torch was built with it).
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
  at::parallel_for(begin, end, grain, fn);
}

const uint16_t* halves(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>()); }

// One quantized weight matrix [N, K] (N padded to a multiple of 16 in the tensors), holding the
// tensors its core view points into.
struct QMat {
  int64_t kind;  // a Kind's code (core/layout.h), as Python passes it
  torch::Tensor q, sc, mn, d, dm, qh;
  int64_t S, offset, N, K;
  torch::Tensor bias;  // [N16] or undefined
  Matrix view;

  QMat(int64_t kind, torch::Tensor q, torch::Tensor sc, c10::optional<torch::Tensor> mn, torch::Tensor d,
       c10::optional<torch::Tensor> dm, int64_t S, int64_t offset, int64_t N, c10::optional<torch::Tensor> bias,
       c10::optional<torch::Tensor> qh)
      : kind(kind), q(q.contiguous()), sc(sc.contiguous()), d(d.contiguous()), S(S), offset(offset), N(N) {
    TORCH_CHECK(is_kind(kind), "kind must be 4, 5, 6, 8, 16 or 32 (core/layout.h's Kind)");
    const Kind k = static_cast<Kind>(kind);
    if (is_float_kind(k)) {
      init_float(k, bias);
      return;
    }
    // Every array's size, from the packed layout (core/layout.h): the kernels index them by N and
    // K alone, so an array of another size (a damaged or hand-made packed copy) must stop here.
    TORCH_CHECK(this->q.dim() == 4 && this->q.size(2) == 4 && this->q.size(3) == 64 &&
                    this->q.scalar_type() == torch::kUInt8,
                "quantized weights must be uint8 [N/16, groups, 4, 64]");
    const int64_t blocks = this->q.size(0);
    K = this->q.size(1) * q_group(k);
    check_rows(blocks);
    TORCH_CHECK(K > 0 && S > 0 && K % S == 0 && S % q_group(k) == 0, "bad super-block size");
    const bool nibbles = has_mins(k);  // q4, and q5: q4 with a fifth bit
    check_array(this->sc, nibbles ? torch::kUInt8 : torch::kInt8, blocks * (K / scale_group(k)) * 16, "sc");
    check_array(this->d, torch::kHalf, blocks * (K / S) * 16, "d");
    const bool high_bits = qh_bytes_per_group(k) > 0;  // q5, q6
    if (high_bits) {
      TORCH_CHECK(qh.has_value(), "q5 and q6 need their qh array");
      this->qh = qh->contiguous();
      check_array(this->qh, torch::kUInt8, blocks * (K / 32) * qh_bytes_per_group(k), "qh");
    }
    if (nibbles) {
      TORCH_CHECK(mn.has_value() && dm.has_value(), "q4 and q5 need mins");
      this->mn = mn->contiguous();
      this->dm = dm->contiguous();
      check_array(this->mn, torch::kUInt8, blocks * (K / 32) * 16, "mn");
      check_array(this->dm, torch::kHalf, blocks * (K / S) * 16, "dm");
    }
    keep_bias(bias, blocks);
    view = Matrix{k,
                  this->q.data_ptr<uint8_t>(),
                  nibbles ? this->sc.data_ptr<uint8_t>() : reinterpret_cast<const uint8_t*>(this->sc.data_ptr<int8_t>()),
                  nibbles ? this->mn.data_ptr<uint8_t>() : nullptr,
                  halves(this->d),
                  nibbles ? halves(this->dm) : nullptr,
                  high_bits ? this->qh.data_ptr<uint8_t>() : nullptr,
                  S, offset, N, K, this->q.size(0),
                  this->bias.defined() ? this->bias.data_ptr<float>() : nullptr};
  }

  // Float weights [N/16][16][K]: no scales, and the group's input is read unquantized.
  void init_float(Kind k, const c10::optional<torch::Tensor>& given_bias) {
    TORCH_CHECK(q.dim() == 3 && q.size(1) == 16, "float weights must be [N/16, 16, K]");
    TORCH_CHECK(q.scalar_type() == (k == Kind::f16 ? torch::kHalf : torch::kFloat32), "float weights of the wrong dtype");
    K = q.size(2);
    TORCH_CHECK(K > 0 && K % 16 == 0, "float weights need K a multiple of 16");
    check_rows(q.size(0));
    keep_bias(given_bias, q.size(0));
    S = K;
    view = Matrix{k, static_cast<const uint8_t*>(q.data_ptr()), nullptr, nullptr, nullptr,
                  nullptr, nullptr, S, 0, N, K, q.size(0),
                  bias.defined() ? bias.data_ptr<float>() : nullptr};
  }

  // N rows in `blocks` channel blocks of 16, the last one padded.
  void check_rows(int64_t blocks) const {
    TORCH_CHECK(blocks >= 1 && N >= 1 && (N + 15) / 16 == blocks, N, " rows cannot fill ", blocks,
                " channel blocks of 16");
  }

  static void check_array(const torch::Tensor& t, torch::ScalarType type, int64_t numel, const char* name) {
    TORCH_CHECK(t.scalar_type() == type && t.numel() == numel, "the ", name, " array holds ", t.numel(), " ",
                t.scalar_type(), " values where ", numel, " ", type, " are needed");
  }

  // The bias, padded to whole channel blocks (float32), or none.
  void keep_bias(const c10::optional<torch::Tensor>& given, int64_t blocks) {
    if (!given.has_value()) return;
    bias = given->to(torch::kFloat32).contiguous();
    TORCH_CHECK(bias.numel() == blocks * 16, "a bias of ", bias.numel(), " values for ", blocks * 16, " padded rows");
  }
};

// Several matrices reading the same input (q/k/v, gate/up), in one parallel region; each writes
// its own output [M, N16] (the first `max_blocks` channel blocks only, where > 0).
std::vector<torch::Tensor> run_group(const std::vector<const QMat*>& mats, const float* x, int64_t M,
                                     int64_t max_blocks = 0) {
  std::vector<const Matrix*> views;
  for (const QMat* m : mats) {
    TORCH_CHECK(m->K == mats[0]->K, "matrices of a group must share their input width");
    views.push_back(&m->view);
  }
  const std::vector<int64_t> blocks = group_blocks(views, max_blocks);
  std::vector<torch::Tensor> outs;
  std::vector<float*> out_ptrs;
  for (int64_t b : blocks) {
    outs.push_back(torch::empty({M, b * 16}, torch::kFloat32));
    out_ptrs.push_back(outs.back().data_ptr<float>());
  }
  run_group(views, x, M, blocks, out_ptrs);
  return outs;
}

torch::Tensor qmat_forward(const QMat& m, const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == m.K, "expected input [M, ", m.K, "]");
  const torch::Tensor x = x_in.to(torch::kFloat32).contiguous();
  return run_group({&m}, x.data_ptr<float>(), x.size(0))[0];
}

// ---------------------------------------------------------------------------------- the model
// The tensors of a decoder, and the core decoder that reads them (core/decoder.h).
struct Layer {
  torch::Tensor attn_norm, ffn_norm;
  std::shared_ptr<QMat> q, k, v, o, gate, up, down;
  torch::Tensor q_norm, k_norm, post_attn_norm, post_ffn_norm;  // undefined where the family has none
};

// A float32 copy that lives as long as the model, or nullptr for a norm the family does not have.
const float* keep(c10::optional<torch::Tensor> given, torch::Tensor& slot, int64_t width) {
  if (!given.has_value()) return nullptr;
  slot = given->to(torch::kFloat32).contiguous();
  TORCH_CHECK(slot.numel() == width, "a norm of ", slot.numel(), " weights where ", width, " are needed");
  return slot.data_ptr<float>();
}

struct Model {
  std::vector<Layer> layers;
  std::shared_ptr<QMat> embed, head;
  torch::Tensor norm, inv_freq, inv_freq_local;
  Decoder decoder;

  Model(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, torch::Tensor inv_freq, double rope_scale,
        std::shared_ptr<QMat> embed, std::shared_ptr<QMat> head, torch::Tensor norm)
      : embed(embed), head(head), norm(norm.to(torch::kFloat32).contiguous()),
        inv_freq(inv_freq.to(torch::kFloat32).contiguous()) {
    TORCH_CHECK(head_dim % 16 == 0 && embed->K % 16 == 0, "head and hidden widths must be multiples of 16");
    TORCH_CHECK(head_dim > 0 && this->inv_freq.numel() == head_dim / 2, this->inv_freq.numel(),
                " rotary frequencies for heads ", head_dim, " wide");
    TORCH_CHECK(this->norm.numel() == embed->K, "a final norm of ", this->norm.numel(), " weights for a hidden width of ",
                embed->K);
    decoder = Decoder{{}, &embed->view, &head->view, this->norm.data_ptr<float>(), this->inv_freq.data_ptr<float>(),
                      heads, kv_heads, head_dim, embed->K, eps, rope_scale};
  }

  // Whether the decoder can run: every size checked (core/decoder.h); throws (a ValueError) if not.
  void validate() const { decoder.validate(); }

  void add_layer(torch::Tensor attn_norm, torch::Tensor ffn_norm, std::shared_ptr<QMat> q, std::shared_ptr<QMat> k,
                 std::shared_ptr<QMat> v, std::shared_ptr<QMat> o, std::shared_ptr<QMat> gate,
                 std::shared_ptr<QMat> up, std::shared_ptr<QMat> down) {
    TORCH_CHECK(k->K == q->K && v->K == q->K && up->K == gate->K, "matrices of a group must share their input width");
    TORCH_CHECK(gate->N % 16 == 0, "the MLP width must be a multiple of 16");
    TORCH_CHECK(attn_norm.numel() == decoder.hidden && ffn_norm.numel() == decoder.hidden, "norms of ",
                attn_norm.numel(), " and ", ffn_norm.numel(), " weights where ", decoder.hidden, " are needed");
    layers.push_back(Layer{attn_norm.to(torch::kFloat32).contiguous(), ffn_norm.to(torch::kFloat32).contiguous(),
                           q, k, v, o, gate, up, down});
    const Layer& L = layers.back();
    decoder.layers.push_back(LayerWeights{L.attn_norm.data_ptr<float>(), L.ffn_norm.data_ptr<float>(), &q->view,
                                          &k->view, &v->view, &o->view, &gate->view, &up->view, &down->view});
  }

  // What a family computes beyond a Llama decoder (specchat.kernels.native.DecoderOptions).
  void set_options(double embed_scale, double attn_scale, bool gelu, c10::optional<torch::Tensor> inv_freq_local,
                   double rope_scale_local) {
    decoder.embed_scale = static_cast<float>(embed_scale);
    decoder.attn_scale = static_cast<float>(attn_scale);
    decoder.gelu = gelu;
    decoder.inv_freq_local = keep(inv_freq_local, this->inv_freq_local, decoder.head_dim / 2);
    decoder.rope_scale_local = rope_scale_local;
  }

  // Layer `index`'s extra norms, window and rotary choice (families beyond a Llama layer).
  void set_layer_extras(int64_t index, c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm,
                        c10::optional<torch::Tensor> post_attn_norm, c10::optional<torch::Tensor> post_ffn_norm,
                        int64_t window, bool local_rope) {
    TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(layers.size()), "no layer ", index);
    TORCH_CHECK(window >= 0, "a window of ", window, " positions");
    Layer& L = layers[index];
    LayerWeights& W = decoder.layers[index];
    W.q_norm = keep(q_norm, L.q_norm, decoder.head_dim);
    W.k_norm = keep(k_norm, L.k_norm, decoder.head_dim);
    W.post_attn_norm = keep(post_attn_norm, L.post_attn_norm, decoder.hidden);
    W.post_ffn_norm = keep(post_ffn_norm, L.post_ffn_norm, decoder.hidden);
    W.window = window;
    W.local_rope = local_rope;
  }

  // Logits [n_logits, vocab] after the new `ids`; keys/values: per layer [kv_heads, capacity, head_dim],
  // holding `past` positions, written for the new ones. `head_rows` (> 0) computes the logits of
  // the first ids only ([n_logits, head_rows]; the same values as those columns of a full pass).
  torch::Tensor forward(const torch::Tensor& ids_in, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, int64_t past, int64_t n_logits,
                        int64_t head_rows) const {
    const torch::Tensor ids = ids_in.to(torch::kInt64).contiguous();
    TORCH_CHECK(ids.dim() == 1 && ids.size(0) >= 1, "expected a non-empty 1-D tensor of ids");
    const int64_t M = ids.size(0);
    decoder.validate();  // layers.size() >= 1 from here
    TORCH_CHECK(keys.size() == layers.size() && values.size() == layers.size(), "one K/V per layer");
    const int64_t capacity = keys[0].size(1);
    TORCH_CHECK(past >= 0 && past + M <= capacity, "the K/V cache is too small");
    std::vector<float*> key_ptrs, value_ptrs;
    for (size_t li = 0; li < layers.size(); ++li) {
      for (const torch::Tensor* t : {&keys[li], &values[li]})
        TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous() && t->dim() == 3 &&
                        t->size(0) == decoder.kv_heads && t->size(1) == capacity && t->size(2) == decoder.head_dim,
                    "layer ", li, "'s K/V must be contiguous float32 [", decoder.kv_heads, ", ", capacity, ", ",
                    decoder.head_dim, "]");
      key_ptrs.push_back(keys[li].data_ptr<float>());
      value_ptrs.push_back(values[li].data_ptr<float>());
    }
    const int64_t rows = head_rows > 0 ? std::min(head_rows, head->N) : head->N;
    torch::Tensor logits = torch::empty({n_logits, decoder.logit_blocks(head_rows) * 16}, torch::kFloat32);
    decoder.forward(ids.data_ptr<int64_t>(), M, key_ptrs.data(), value_ptrs.data(), capacity, past, n_logits,
                    head_rows, logits.data_ptr<float>());
    return logits.narrow(1, 0, rows);
  }
};

// A GGUF tensor's rows laid out for the kernels (core/repack.h): [(array name, tensor)] in the
// order formats.pack() gives them. `raw`: the tensor's bytes (the memory-mapped file: read only).
std::vector<std::pair<std::string, torch::Tensor>> repack_gguf(const py::buffer& raw, const std::string& type,
                                                               int64_t n, int64_t k,
                                                               c10::optional<torch::Tensor> order) {
  const repack::Format f = repack::format_of(type);
  const py::buffer_info info = raw.request();
  const int64_t size = info.size * info.itemsize, row_bytes = k / f.block_weights * f.block_bytes;
  const int64_t* rows = nullptr;
  if (order) {
    TORCH_CHECK(order->dtype() == torch::kInt64 && order->is_contiguous() && order->numel() == n, "order: ", n, " int64 rows");
    rows = order->data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) TORCH_CHECK(rows[i] >= 0 && (rows[i] + 1) * row_bytes <= size, "row ", rows[i], " is past the tensor");
  } else {
    TORCH_CHECK(n * row_bytes <= size, type, ": ", n, " rows of ", k, " need ", n * row_bytes, " bytes, given ", size);
  }
  const int64_t B = (n + 15) / 16, g32 = k / 32, g16 = k / 16, supers = k / f.block_weights;
  const auto u8 = torch::kUInt8, i8 = torch::kInt8, f16 = torch::kFloat16;
  std::vector<std::pair<std::string, torch::Tensor>> arrays;
  repack::Out out;
  auto add = [&](const char* name, torch::Tensor t) -> torch::Tensor {
    arrays.emplace_back(name, t);
    return t;
  };
  const Kind kind = f.kind;
  if (is_float_kind(kind)) {
    out.q = static_cast<uint8_t*>(add("q", torch::empty({B, 16, k}, kind == Kind::f16 ? f16 : torch::kFloat32)).data_ptr());
  } else {
    const bool mins = has_mins(kind);
    out.sc = static_cast<uint8_t*>(add("sc", torch::empty({B, mins ? g32 : g16, 16}, mins ? u8 : i8)).data_ptr());
    out.d = static_cast<uint16_t*>(add("d", torch::empty({B, supers, 16}, f16)).data_ptr());
    out.q = static_cast<uint8_t*>(add("q", torch::empty({B, kind == Kind::q8 ? g16 : g32, 4, 64}, u8)).data_ptr());
    if (kind == Kind::q6) out.qh = static_cast<uint8_t*>(add("qh", torch::empty({B, g32, 2, 64}, u8)).data_ptr());
    if (kind == Kind::q5) out.qh = static_cast<uint8_t*>(add("qh", torch::empty({B, g32, 64}, u8)).data_ptr());
    if (mins) {
      out.mn = static_cast<uint8_t*>(add("mn", torch::empty({B, g32, 16}, u8)).data_ptr());
      out.dm = static_cast<uint16_t*>(add("dm", torch::empty({B, supers, 16}, f16)).data_ptr());
    }
  }
  {
    py::gil_scoped_release released;
    repack::repack(f, static_cast<const uint8_t*>(info.ptr), n, k, rows, out);
  }
  return arrays;
}

}  // namespace

// Each variant is its own module, and several may be loaded in one process (tests compare them):
// everything above has internal linkage and the classes are module-local, so none sees another's.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("ISA") = NAME;  // the instruction set this library was built for
  m.def("repack_gguf", &repack_gguf, py::arg("raw"), py::arg("type"), py::arg("n"), py::arg("k"),
        py::arg("order") = py::none());
  py::dict kinds;  // each Kind's name and code (formats.py's KIND_CODES must agree)
  for (const KindName& k : KIND_NAMES) kinds[k.name] = code_of(k.kind);
  m.attr("KINDS") = kinds;
  py::class_<QMat, std::shared_ptr<QMat>>(m, "QMat", py::module_local())
      .def(py::init<int64_t, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, torch::Tensor,
                    c10::optional<torch::Tensor>, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>,
                    c10::optional<torch::Tensor>>(),
           py::arg("kind"), py::arg("q"), py::arg("sc"), py::arg("mn"), py::arg("d"), py::arg("dm"), py::arg("S"),
           py::arg("offset"), py::arg("N"), py::arg("bias"), py::arg("qh") = py::none())
      .def("forward", &qmat_forward)
      .def_readonly("N", &QMat::N)
      .def_readonly("K", &QMat::K);
  py::class_<Model>(m, "Model", py::module_local())
      .def(py::init<int64_t, int64_t, int64_t, double, torch::Tensor, double, std::shared_ptr<QMat>,
                    std::shared_ptr<QMat>, torch::Tensor>())
      .def("add_layer", &Model::add_layer)
      .def("validate", &Model::validate)
      .def("set_options", &Model::set_options, py::arg("embed_scale"), py::arg("attn_scale"), py::arg("gelu"),
           py::arg("inv_freq_local"), py::arg("rope_scale_local"))
      .def("set_layer_extras", &Model::set_layer_extras, py::arg("index"), py::arg("q_norm"), py::arg("k_norm"),
           py::arg("post_attn_norm"), py::arg("post_ffn_norm"), py::arg("window"), py::arg("local_rope"))
      .def("forward", &Model::forward, py::arg("ids"), py::arg("keys"), py::arg("values"), py::arg("past"),
           py::arg("n_logits"), py::arg("head_rows") = 0, py::call_guard<py::gil_scoped_release>());
}
