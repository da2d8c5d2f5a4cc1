// kiln.hpp: a header-only C++17 wrapper over the Kiln C ABI (kiln.h).
//
// Handles are move-only RAII objects; every failing call throws kiln::Error, which
// carries the status and the library's message. Nothing here has global state, so the
// header may be included in any number of translation units.
#ifndef KILN_HPP
#define KILN_HPP

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln.h"

namespace kiln {

/// A failed call: the status and the message of `kiln_last_error_message()`.
class Error : public std::runtime_error {
 public:
  Error(kiln_status status, const std::string &message)
      : std::runtime_error(std::string(kiln_status_string(status)) + ": " + message), status_(status) {}
  kiln_status status() const noexcept { return status_; }

 private:
  kiln_status status_;
};

/// Throws unless `s` is KILN_STATUS_OK.
inline void check(kiln_status s) {
  if (s != KILN_STATUS_OK) throw Error(s, kiln_last_error_message());
}

/// A read-only view of `size` contiguous `T`s (C++17 has no std::span).
template <class T>
class Span {
 public:
  Span() = default;
  Span(const T *data, std::size_t size) : data_(data), size_(size) {}
  const T *data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const T &operator[](std::size_t i) const { return data_[i]; }
  const T *begin() const noexcept { return data_; }
  const T *end() const noexcept { return data_ + size_; }
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

 private:
  const T *data_ = nullptr;
  std::size_t size_ = 0;
};

/// The kiln_dtype of a C++ element type.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr kiln_dtype value = KILN_DTYPE_F32; };
template <> struct dtype_of<double> { static constexpr kiln_dtype value = KILN_DTYPE_F64; };
template <> struct dtype_of<std::int8_t> { static constexpr kiln_dtype value = KILN_DTYPE_I8; };
template <> struct dtype_of<std::uint8_t> { static constexpr kiln_dtype value = KILN_DTYPE_U8; };
template <> struct dtype_of<std::int32_t> { static constexpr kiln_dtype value = KILN_DTYPE_I32; };
template <> struct dtype_of<std::int64_t> { static constexpr kiln_dtype value = KILN_DTYPE_I64; };
template <> struct dtype_of<bool> { static constexpr kiln_dtype value = KILN_DTYPE_BOOL; };
template <> struct dtype_of<std::int16_t> { static constexpr kiln_dtype value = KILN_DTYPE_I16; };
template <> struct dtype_of<std::uint16_t> { static constexpr kiln_dtype value = KILN_DTYPE_U16; };
template <> struct dtype_of<std::uint32_t> { static constexpr kiln_dtype value = KILN_DTYPE_U32; };
template <> struct dtype_of<std::uint64_t> { static constexpr kiln_dtype value = KILN_DTYPE_U64; };

/// Omits an optional operand of `Graph::add_op`.
inline constexpr kiln_value none{KILN_VALUE_NONE_NODE, 0};

/// A dense tensor that owns its memory (or, from `wrap`, borrows the caller's).
class Tensor {
 public:
  /// Zeros of `dtype` and `dims`.
  static Tensor zeros(kiln_dtype dtype, const std::vector<std::int64_t> &dims) {
    kiln_tensor *t = nullptr;
    check(kiln_tensor_new(dtype, dims.data(), dims.size(), &t));
    return Tensor(t);
  }

  /// A tensor of `dims` holding a copy of `values` (row-major).
  template <class T>
  static Tensor from(const std::vector<std::int64_t> &dims, const std::vector<T> &values) {
    Tensor t = zeros(dtype_of<T>::value, dims);
    if (values.size() * sizeof(T) != t.nbytes())
      throw Error(KILN_STATUS_INVALID_ARGUMENT, std::to_string(values.size()) + " values do not fill the dims");
    T *d = t.data<T>();
    for (std::size_t i = 0; i < values.size(); i++) d[i] = values[i];
    return t;
  }

  /// A tensor over caller memory, no copy: `data` must outlive the tensor.
  template <class T>
  static Tensor wrap(const std::vector<std::int64_t> &dims, T *data, std::size_t count) {
    kiln_tensor *t = nullptr;
    check(kiln_tensor_wrap(dtype_of<T>::value, dims.data(), dims.size(), data, count * sizeof(T), &t));
    return Tensor(t);
  }

  /// Takes ownership of a handle from the C ABI.
  explicit Tensor(kiln_tensor *handle) noexcept : h_(handle) {}
  Tensor(Tensor &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Tensor &operator=(Tensor &&o) noexcept {
    if (this != &o) {
      kiln_tensor_free(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Tensor(const Tensor &) = delete;
  Tensor &operator=(const Tensor &) = delete;
  ~Tensor() { kiln_tensor_free(h_); }

  kiln_tensor *get() const noexcept { return h_; }
  kiln_dtype dtype() const noexcept { return kiln_tensor_dtype(h_); }
  std::size_t nbytes() const noexcept { return kiln_tensor_nbytes(h_); }
  Span<std::int64_t> dims() const noexcept { return Span<std::int64_t>(kiln_tensor_dims(h_), kiln_tensor_rank(h_)); }
  std::size_t size() const noexcept {
    std::size_t n = 1;
    for (auto d : dims()) n *= static_cast<std::size_t>(d);
    return n;
  }

  /// The elements as `T`; throws if `T` is not the tensor's dtype.
  template <class T>
  T *data() {
    if (dtype_of<T>::value != dtype()) throw Error(KILN_STATUS_INVALID_ARGUMENT, "data<T>(): T is not the tensor's dtype");
    return static_cast<T *>(kiln_tensor_data(h_));
  }
  template <class T>
  Span<T> values() {
    return Span<T>(data<T>(), size());
  }

 private:
  kiln_tensor *h_ = nullptr;
};

/// An op attribute: a name and one value of the kinds the C ABI knows.
class Attr {
 public:
  Attr(std::string name, std::int64_t v) : name_(std::move(name)), kind_(KILN_ATTR_INT), i_(v) {}
  Attr(std::string name, int v) : Attr(std::move(name), static_cast<std::int64_t>(v)) {}
  Attr(std::string name, double v) : name_(std::move(name)), kind_(KILN_ATTR_FLOAT), f_(v) {}
  Attr(std::string name, std::string v) : name_(std::move(name)), kind_(KILN_ATTR_STRING), s_(std::move(v)) {}
  Attr(std::string name, const char *v) : Attr(std::move(name), std::string(v)) {}
  Attr(std::string name, std::vector<std::int64_t> v) : name_(std::move(name)), kind_(KILN_ATTR_INTS), ints_(std::move(v)) {}
  Attr(std::string name, std::vector<double> v) : name_(std::move(name)), kind_(KILN_ATTR_FLOATS), floats_(std::move(v)) {}
  Attr(std::string name, std::vector<std::string> v) : name_(std::move(name)), kind_(KILN_ATTR_STRINGS), strings_(std::move(v)) {}

  /// The C view; valid while this Attr lives and is not modified.
  kiln_attr to_c(std::vector<const char *> &string_ptrs) const {
    kiln_attr a{};
    a.name = name_.c_str();
    a.kind = kind_;
    a.i = i_;
    a.f = f_;
    a.s = s_.c_str();
    a.ints = ints_.data();
    a.floats = floats_.data();
    switch (kind_) {
      case KILN_ATTR_INTS: a.len = ints_.size(); break;
      case KILN_ATTR_FLOATS: a.len = floats_.size(); break;
      case KILN_ATTR_STRINGS:
        string_ptrs.clear();
        for (const auto &s : strings_) string_ptrs.push_back(s.c_str());
        a.strings = string_ptrs.data();
        a.len = string_ptrs.size();
        break;
      default: break;
    }
    return a;
  }

 private:
  std::string name_;
  kiln_attr_kind kind_;
  std::int64_t i_ = 0;
  double f_ = 0.0;
  std::string s_;
  std::vector<std::int64_t> ints_;
  std::vector<double> floats_;
  std::vector<std::string> strings_;
};

/// An optimizer's settings (see kiln_optimizer_new / kiln_optimizer_set); added to a
/// graph with Graph::add_optimizer.
class Optimizer {
 public:
  /// "sgd", "adam" or "adamw".
  explicit Optimizer(const std::string &kind) { check(kiln_optimizer_new(kind.c_str(), &h_)); }
  Optimizer(Optimizer &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Optimizer &operator=(Optimizer &&o) noexcept {
    if (this != &o) {
      kiln_optimizer_free(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;
  ~Optimizer() { kiln_optimizer_free(h_); }

  /// set("momentum", 0.9), set("weight_decay", 1e-4), set("clip_norm", 1.0), ...
  Optimizer &set(const std::string &name, double value) {
    check(kiln_optimizer_set(h_, name.c_str(), value));
    return *this;
  }
  const kiln_optimizer *get() const { return h_; }

 private:
  kiln_optimizer *h_ = nullptr;
};

/// A graph under construction. Single-writer.
class Graph {
 public:
  Graph() { check(kiln_graph_new(&h_)); }
  /// Parses `.kir` text.
  static Graph parse(const std::string &text) {
    kiln_graph *g = nullptr;
    check(kiln_graph_parse(text.c_str(), &g));
    return Graph(g);
  }
  /// Imports an ONNX model (nodes of a registered op's domain become that op).
  static Graph import_onnx(const std::string &path) {
    kiln_graph *g = nullptr;
    check(kiln_graph_import_onnx(path.c_str(), &g));
    return Graph(g);
  }
  /// A non-owning Graph over `h` (a gradient callback's graph): never frees it.
  static Graph borrow(kiln_graph *h) noexcept {
    Graph g(h);
    g.owned_ = false;
    return g;
  }
  Graph(Graph &&o) noexcept : h_(std::exchange(o.h_, nullptr)), owned_(o.owned_) {}
  Graph &operator=(Graph &&o) noexcept {
    if (this != &o) {
      if (owned_) kiln_graph_free(h_);
      h_ = std::exchange(o.h_, nullptr);
      owned_ = o.owned_;
    }
    return *this;
  }
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;
  ~Graph() {
    if (owned_) kiln_graph_free(h_);
  }

  kiln_graph *get() const noexcept { return h_; }

  /// The value of input (parameter) `i`, in run order.
  kiln_value input_value(std::size_t i) const {
    kiln_value v{};
    check(kiln_graph_input_value(h_, i, &v));
    return v;
  }
  /// The value behind output `i`.
  kiln_value output_value(std::size_t i) const {
    kiln_value v{};
    check(kiln_graph_output_value(h_, i, &v));
    return v;
  }

  /// A graph input; -1 dims are symbolic, named axes share their symbol.
  kiln_value add_parameter(const std::string &name, kiln_dtype dtype, const std::vector<std::int64_t> &dims,
                           const std::vector<std::string> &axis_names = {}) {
    std::vector<const char *> names;
    for (const auto &n : axis_names) names.push_back(n.empty() ? nullptr : n.c_str());
    if (!names.empty() && names.size() != dims.size())
      throw Error(KILN_STATUS_INVALID_ARGUMENT, "axis_names must name every axis (\"\" for none)");
    kiln_value v{};
    check(kiln_graph_add_parameter(h_, name.c_str(), dtype, dims.data(), names.empty() ? nullptr : names.data(),
                                   dims.size(), &v));
    return v;
  }

  template <class T>
  kiln_value add_constant(const std::string &name, const std::vector<std::int64_t> &dims, const std::vector<T> &values) {
    kiln_value v{};
    check(kiln_graph_add_constant(h_, name.c_str(), dtype_of<T>::value, dims.data(), dims.size(), values.data(),
                                  values.size() * sizeof(T), &v));
    return v;
  }

  template <class T>
  kiln_value add_variable(const std::string &name, const std::vector<std::int64_t> &dims, const std::vector<T> &initial) {
    kiln_value v{};
    check(kiln_graph_add_variable(h_, name.c_str(), dtype_of<T>::value, dims.data(), dims.size(), initial.data(),
                                  initial.size() * sizeof(T), &v));
    return v;
  }

  /// Applies `op`; returns all its outputs.
  std::vector<kiln_value> add_op(const std::string &op, const std::vector<kiln_value> &inputs,
                                 const std::vector<Attr> &attrs = {}) {
    std::vector<std::vector<const char *>> string_ptrs(attrs.size());
    std::vector<kiln_attr> c_attrs;
    for (std::size_t i = 0; i < attrs.size(); i++) c_attrs.push_back(attrs[i].to_c(string_ptrs[i]));
    std::vector<kiln_value> outs(4);
    std::size_t n = 0;
    kiln_status s = kiln_graph_add_op(h_, op.c_str(), inputs.data(), inputs.size(), c_attrs.data(), c_attrs.size(),
                                      outs.data(), outs.size(), &n);
    if (s == KILN_STATUS_BUFFER_TOO_SMALL) {
      outs.resize(n);
      s = kiln_graph_add_op(h_, op.c_str(), inputs.data(), inputs.size(), c_attrs.data(), c_attrs.size(),
                            outs.data(), outs.size(), &n);
    }
    check(s);
    outs.resize(n);
    return outs;
  }

  /// Applies `op` with graph attributes as well (`If`'s `then_branch`/`else_branch`,
  /// `Loop`'s and `Scan`'s `body`; see kiln_graph_add_op_with_graphs): each body is
  /// copied, so it stays the caller's. Returns all the op's outputs.
  std::vector<kiln_value> add_op_with_graphs(const std::string &op, const std::vector<kiln_value> &inputs,
                                             const std::vector<std::pair<std::string, const Graph *>> &graphs,
                                             const std::vector<Attr> &attrs = {}) {
    std::vector<std::vector<const char *>> string_ptrs(attrs.size());
    std::vector<kiln_attr> c_attrs;
    for (std::size_t i = 0; i < attrs.size(); i++) c_attrs.push_back(attrs[i].to_c(string_ptrs[i]));
    std::vector<kiln_graph_attr> c_graphs;
    for (const auto &g : graphs) c_graphs.push_back({g.first.c_str(), g.second ? g.second->h_ : nullptr});
    std::vector<kiln_value> outs(4);
    std::size_t n = 0;
    auto call = [&] {
      return kiln_graph_add_op_with_graphs(h_, op.c_str(), inputs.data(), inputs.size(), c_attrs.data(),
                                           c_attrs.size(), c_graphs.data(), c_graphs.size(), outs.data(),
                                           outs.size(), &n);
    };
    kiln_status s = call();
    if (s == KILN_STATUS_BUFFER_TOO_SMALL) {
      outs.resize(n);
      s = call();
    }
    check(s);
    outs.resize(n);
    return outs;
  }

  /// Applies a single-output op; returns its output.
  kiln_value op(const std::string &op, const std::vector<kiln_value> &inputs, const std::vector<Attr> &attrs = {}) {
    auto outs = add_op(op, inputs, attrs);
    if (outs.empty()) throw Error(KILN_STATUS_INVALID_ARGUMENT, op + " has no outputs");
    return outs[0];
  }

  void set_output(const std::string &name, kiln_value v) { check(kiln_graph_set_output(h_, name.c_str(), v)); }

  /// The gradients of the scalar `loss` with respect to each of `wrt` (parameters or
  /// variables), appended to the graph (see `kiln_graph_add_gradients`).
  std::vector<kiln_value> add_gradients(kiln_value loss, const std::vector<kiln_value> &wrt) {
    std::vector<kiln_value> grads(wrt.size());
    check(kiln_graph_add_gradients(h_, loss, wrt.data(), wrt.size(), grads.data()));
    return grads;
  }

  /// One step of `opt` on `vars` from `grads` with learning rate `lr` (see
  /// kiln_graph_add_optimizer).
  void add_optimizer(const Optimizer &opt, const std::vector<kiln_value> &vars,
                     const std::vector<kiln_value> &grads, kiln_value lr) {
    if (vars.size() != grads.size()) throw Error(KILN_STATUS_INVALID_ARGUMENT, "one gradient per variable");
    check(kiln_graph_add_optimizer(h_, opt.get(), vars.data(), grads.data(), vars.size(), lr));
  }

  /// Training-mode dropout of `x`: a fresh mask every run, reproducible from `seed`
  /// (see kiln_graph_add_dropout). The mask is output 1 of the returned value's node.
  kiln_value add_dropout(kiln_value x, double ratio, std::int64_t seed) {
    kiln_value y;
    check(kiln_graph_add_dropout(h_, x, ratio, seed, &y));
    return y;
  }

  /// Training-mode batch normalization of `x` [N, C, d...] that updates the running
  /// statistics variables every run (see kiln_graph_add_batch_norm_training).
  kiln_value add_batch_norm_training(kiln_value x, kiln_value scale, kiln_value bias, kiln_value running_mean,
                                     kiln_value running_var, double momentum = 0.9, double epsilon = 1e-5) {
    kiln_value y;
    check(kiln_graph_add_batch_norm_training(h_, x, scale, bias, running_mean, running_var, momentum, epsilon, &y));
    return y;
  }

  void add_control_dependency(std::uint32_t node, std::uint32_t after) {
    check(kiln_graph_add_control_dependency(h_, node, after));
  }

  std::string to_text() const {
    char *s = nullptr;
    check(kiln_graph_to_text(h_, &s));
    std::string out(s);
    kiln_string_free(s);
    return out;
  }

 private:
  explicit Graph(kiln_graph *h) noexcept : h_(h) {}
  kiln_graph *h_ = nullptr;
  bool owned_ = true;
};

/// How to compile.
class CompileOptions {
 public:
  CompileOptions() { check(kiln_compile_options_new(&h_)); }
  CompileOptions(CompileOptions &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CompileOptions &operator=(CompileOptions &&o) noexcept {
    if (this != &o) {
      kiln_compile_options_free(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  CompileOptions(const CompileOptions &) = delete;
  CompileOptions &operator=(const CompileOptions &) = delete;
  ~CompileOptions() { kiln_compile_options_free(h_); }

  /// "cpu", "interp" or "cuda:N".
  CompileOptions &backend(const std::string &device) {
    check(kiln_compile_options_set_backend(h_, device.c_str()));
    return *this;
  }
  CompileOptions &threads(std::uint32_t n) {
    check(kiln_compile_options_set_threads(h_, n));
    return *this;
  }
  /// A pass-pipeline option: option("passes", "cse,dce"), option("dump-ir", "after-all").
  CompileOptions &option(const std::string &name, const std::string &value) {
    check(kiln_compile_options_set_option(h_, name.c_str(), value.c_str()));
    return *this;
  }
  const kiln_compile_options *get() const noexcept { return h_; }

 private:
  kiln_compile_options *h_ = nullptr;
};

/// A graph input or output, or a variable, as an executable describes it.
struct IoInfo {
  std::string name;
  kiln_dtype dtype;
  std::vector<std::int64_t> dims;  // -1 where symbolic
};

/// A compiled graph; `run` may be called from many threads at once.
class Executable {
 public:
  static Executable compile(const Graph &g, const CompileOptions *options = nullptr) {
    kiln_executable *e = nullptr;
    check(kiln_compile(g.get(), options ? options->get() : nullptr, &e));
    return Executable(e);
  }
  Executable(Executable &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Executable &operator=(Executable &&o) noexcept {
    if (this != &o) {
      kiln_executable_free(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Executable(const Executable &) = delete;
  Executable &operator=(const Executable &) = delete;
  ~Executable() { kiln_executable_free(h_); }

  std::size_t input_count() const noexcept { return kiln_executable_input_count(h_); }
  std::size_t output_count() const noexcept { return kiln_executable_output_count(h_); }
  IoInfo input(std::size_t i) const { return info(i, true); }
  IoInfo output(std::size_t i) const { return info(i, false); }

  /// Runs on `inputs` (in parameter order); returns the outputs.
  std::vector<Tensor> run(const std::vector<const Tensor *> &inputs) const {
    std::vector<const kiln_tensor *> ins;
    for (const Tensor *t : inputs) ins.push_back(t ? t->get() : nullptr);
    std::vector<kiln_tensor *> outs(output_count(), nullptr);
    check(kiln_executable_run(h_, ins.data(), ins.size(), outs.data(), outs.size()));
    std::vector<Tensor> result;
    for (kiln_tensor *t : outs) result.emplace_back(t);
    return result;
  }
  std::vector<Tensor> run(std::initializer_list<const Tensor *> inputs) const {
    return run(std::vector<const Tensor *>(inputs));
  }

  /// The variables the executable owns (its training state), in graph order.
  std::vector<IoInfo> variables() const {
    std::vector<IoInfo> out;
    const std::size_t n = kiln_executable_variable_count(h_);
    for (std::size_t i = 0; i < n; i++) {
      const char *name = nullptr;
      kiln_dtype dtype = KILN_DTYPE_INVALID;
      const std::int64_t *dims = nullptr;
      std::size_t rank = 0;
      check(kiln_executable_variable_info(h_, i, &name, &dtype, &dims, &rank));
      out.push_back(IoInfo{name, dtype, std::vector<std::int64_t>(dims, dims + rank)});
    }
    return out;
  }

  /// A copy of variable `name`'s current value (waits for a step that assigns to end).
  Tensor read_variable(const std::string &name) const {
    kiln_tensor *t = nullptr;
    check(kiln_executable_read_variable(h_, name.c_str(), &t));
    return Tensor(t);
  }

  /// Replaces variable `name`'s value (same dtype and dims) with a copy of `value`.
  void write_variable(const std::string &name, const Tensor &value) const {
    check(kiln_executable_write_variable(h_, name.c_str(), value.get()));
  }

  /// Saves every variable to `path`, atomically (see kiln_executable_save_checkpoint).
  void save_checkpoint(const std::string &path) const {
    check(kiln_executable_save_checkpoint(h_, path.c_str()));
  }

  /// Loads a checkpoint of the same graph; on any error nothing changes (see
  /// kiln_executable_load_checkpoint).
  void load_checkpoint(const std::string &path) const {
    check(kiln_executable_load_checkpoint(h_, path.c_str()));
  }

 private:
  explicit Executable(kiln_executable *h) noexcept : h_(h) {}
  IoInfo info(std::size_t i, bool input) const {
    const char *name = nullptr;
    kiln_dtype dtype = KILN_DTYPE_INVALID;
    const std::int64_t *dims = nullptr;
    std::size_t rank = 0;
    check(input ? kiln_executable_input_info(h_, i, &name, &dtype, &dims, &rank)
                : kiln_executable_output_info(h_, i, &name, &dtype, &dims, &rank));
    return IoInfo{name, dtype, std::vector<std::int64_t>(dims, dims + rank)};
  }
  kiln_executable *h_ = nullptr;
};

// ---- external ops ----------------------------------------------------------------

/// A node's attributes, as the contexts below lend them.
class Attrs {
 public:
  explicit Attrs(const kiln_attrs *a) noexcept : a_(a) {}
  double get_float(const std::string &name, double default_value) const {
    double v = 0;
    check(kiln_attrs_get_float(a_, name.c_str(), default_value, &v));
    return v;
  }
  std::int64_t get_int(const std::string &name, std::int64_t default_value) const {
    std::int64_t v = 0;
    check(kiln_attrs_get_int(a_, name.c_str(), default_value, &v));
    return v;
  }
  /// Empty if the node has no such attribute.
  Span<std::int64_t> get_ints(const std::string &name) const {
    const std::int64_t *p = nullptr;
    std::size_t n = 0;
    check(kiln_attrs_get_ints(a_, name.c_str(), &p, &n));
    return Span<std::int64_t>(p, n);
  }
  Span<double> get_floats(const std::string &name) const {
    const double *p = nullptr;
    std::size_t n = 0;
    check(kiln_attrs_get_floats(a_, name.c_str(), &p, &n));
    return Span<double>(p, n);
  }

 private:
  const kiln_attrs *a_;
};

/// What an op's `infer` member sees (see kiln_infer_context_*).
class InferContext {
 public:
  explicit InferContext(kiln_infer_context *c) noexcept : c_(c) {}
  std::size_t num_inputs() const noexcept { return kiln_infer_context_num_inputs(c_); }
  /// KILN_DTYPE_INVALID for an omitted optional input.
  kiln_dtype input_dtype(std::size_t i) const {
    kiln_dtype d = KILN_DTYPE_INVALID;
    std::size_t r = 0;
    check(kiln_infer_context_input(c_, i, &d, &r));
    return d;
  }
  std::size_t input_rank(std::size_t i) const {
    kiln_dtype d = KILN_DTYPE_INVALID;
    std::size_t r = 0;
    check(kiln_infer_context_input(c_, i, &d, &r));
    return r;
  }
  /// A fixed size, or -1 for a symbolic dim (then `symbol`, if given, gets its name).
  std::int64_t input_dim(std::size_t i, std::size_t axis, const char **symbol = nullptr) const {
    std::int64_t size = 0;
    const char *sym = nullptr;
    check(kiln_infer_context_input_dim(c_, i, axis, &size, &sym));
    if (symbol) *symbol = sym;
    return size;
  }
  Attrs attrs() const noexcept { return Attrs(kiln_infer_context_attrs(c_)); }
  void set_output_like(std::size_t output, std::size_t input) {
    check(kiln_infer_context_set_output_like(c_, output, input));
  }
  /// dims[k] == -1 with symbols[k] (or a fresh symbol when absent or null).
  void set_output(std::size_t output, kiln_dtype dtype, const std::vector<std::int64_t> &dims,
                  const std::vector<const char *> &symbols = {}) {
    if (!symbols.empty() && symbols.size() != dims.size())
      throw Error(KILN_STATUS_INVALID_ARGUMENT, "one symbol (or nullptr) per dim");
    check(kiln_infer_context_set_output(c_, output, dtype, dims.data(), symbols.empty() ? nullptr : symbols.data(),
                                        dims.size()));
  }
  kiln_infer_context *get() const noexcept { return c_; }

 private:
  kiln_infer_context *c_;
};

/// What an op's `compute` member sees (see kiln_kernel_context_*).
class KernelContext {
 public:
  explicit KernelContext(kiln_kernel_context *c) noexcept : c_(c) {}
  std::size_t num_inputs() const noexcept { return kiln_kernel_context_num_inputs(c_); }
  std::size_t num_outputs() const noexcept { return kiln_kernel_context_num_outputs(c_); }
  kiln_tensor_view input(std::size_t i) const {
    kiln_tensor_view v{};
    check(kiln_kernel_context_input(c_, i, &v));
    return v;
  }
  /// Output `i`'s buffer for the dims the kernel computes (checked against inference).
  kiln_tensor_view output(std::size_t i, const std::int64_t *dims, std::size_t rank) {
    kiln_tensor_view v{};
    check(kiln_kernel_context_output(c_, i, dims, rank, &v));
    return v;
  }
  kiln_tensor_view output(std::size_t i, const std::vector<std::int64_t> &dims) {
    return output(i, dims.data(), dims.size());
  }
  /// Scratch memory valid until `compute` returns.
  void *scratch(std::size_t bytes) {
    void *p = nullptr;
    check(kiln_kernel_context_scratch(c_, bytes, &p));
    return p;
  }
  Attrs attrs() const noexcept { return Attrs(kiln_kernel_context_attrs(c_)); }
  kiln_kernel_context *get() const noexcept { return c_; }

 private:
  kiln_kernel_context *c_;
};

/// What an op's `gradient` member sees (see kiln_gradient_context_*).
class GradientContext {
 public:
  explicit GradientContext(kiln_gradient_context *c) noexcept : c_(c) {}
  std::size_t num_inputs() const noexcept { return kiln_gradient_context_num_inputs(c_); }
  std::size_t num_outputs() const noexcept { return kiln_gradient_context_num_outputs(c_); }
  kiln_value input(std::size_t i) const { return get_value(kiln_gradient_context_input, i); }
  kiln_value output(std::size_t i) const { return get_value(kiln_gradient_context_output, i); }
  /// `node == KILN_VALUE_NONE_NODE` when the loss does not use output `i`.
  kiln_value output_grad(std::size_t i) const { return get_value(kiln_gradient_context_output_grad, i); }
  void set_input_grad(std::size_t i, kiln_value grad) { check(kiln_gradient_context_set_input_grad(c_, i, grad)); }
  Attrs attrs() const noexcept { return Attrs(kiln_gradient_context_attrs(c_)); }

 private:
  template <class F>
  kiln_value get_value(F f, std::size_t i) const {
    kiln_value v{};
    check(f(c_, i, &v));
    return v;
  }
  kiln_gradient_context *c_;
};

/// The shape of an op's signature and its flags (see kiln_custom_op).
struct OpSignature {
  std::uint32_t min_inputs = 1;
  std::uint32_t max_inputs = 1;  // KILN_CUSTOM_OP_VARIADIC for any number
  std::uint32_t num_outputs = 1;
  std::uint32_t flags = 0;       // KILN_CUSTOM_OP_PURE | KILN_CUSTOM_OP_MAY_RUN_IN_PLACE
};

namespace detail {
template <class T, class = void>
struct has_gradient : std::false_type {};
template <class T>
struct has_gradient<T, std::void_t<decltype(std::declval<T &>().gradient(std::declval<GradientContext &>(),
                                                                         std::declval<Graph &>()))>>
    : std::true_type {};

/// Runs `body`; an exception becomes `status` with its message (exceptions must not
/// unwind into Kiln).
template <class SetError, class Body>
kiln_status trampoline(SetError set_error, kiln_status status, Body body) noexcept {
  try {
    body();
    return KILN_STATUS_OK;
  } catch (const Error &e) {
    set_error(e.what());
    return e.status();
  } catch (const std::exception &e) {
    set_error(e.what());
    return status;
  } catch (...) {
    set_error("an unknown C++ exception");
    return status;
  }
}

template <class Op>
kiln_status infer(kiln_infer_context *c, void *user_data) {
  return trampoline([c](const char *m) { kiln_infer_context_set_error(c, m); }, KILN_STATUS_INVALID_GRAPH, [&] {
    InferContext ctx(c);
    static_cast<Op *>(user_data)->infer(ctx);
  });
}

template <class Op>
kiln_status compute(kiln_kernel_context *c, void *user_data) {
  return trampoline([c](const char *m) { kiln_kernel_context_set_error(c, m); }, KILN_STATUS_RUN_FAILED, [&] {
    KernelContext ctx(c);
    static_cast<Op *>(user_data)->compute(ctx);
  });
}

template <class Op>
kiln_status gradient(kiln_gradient_context *c, kiln_graph *g, void *user_data) {
  return trampoline([c](const char *m) { kiln_gradient_context_set_error(c, m); }, KILN_STATUS_INVALID_GRAPH, [&] {
    GradientContext ctx(c);
    Graph graph = Graph::borrow(g);
    static_cast<Op *>(user_data)->gradient(ctx, graph);
  });
}

template <class Op>
void destroy(void *user_data) {
  delete static_cast<Op *>(user_data);
}
}  // namespace detail

/// Registers `op`, an object of a class with members
///   void infer(kiln::InferContext &);      // sets every output's type
///   void compute(kiln::KernelContext &);   // the CPU kernel
/// and optionally
///   void gradient(kiln::GradientContext &, kiln::Graph &);  // builds the backward pass
/// as the external op `domain::name`. The object is moved to the heap and deleted when
/// the registration is dropped (after kiln::unregister_op, once no executable uses it).
/// Members report failure by throwing (kiln::Error keeps its status); the message reaches
/// the caller of the Kiln function that called them. They may run on several threads at
/// once.
template <class Op>
void register_op(const std::string &domain, const std::string &name, const OpSignature &sig, Op op) {
  Op *heap = new Op(std::move(op));
  kiln_custom_op def{};
  def.struct_size = sizeof def;
  def.version = KILN_CUSTOM_OP_VERSION;
  def.domain = domain.c_str();
  def.name = name.c_str();
  def.min_inputs = sig.min_inputs;
  def.max_inputs = sig.max_inputs;
  def.num_outputs = sig.num_outputs;
  def.flags = sig.flags;
  def.infer = &detail::infer<Op>;
  def.compute = &detail::compute<Op>;
  if constexpr (detail::has_gradient<Op>::value) def.gradient = &detail::gradient<Op>;
  def.user_data = heap;
  def.destroy = &detail::destroy<Op>;
  kiln_status s = kiln_register_op(&def);
  if (s != KILN_STATUS_OK) {
    delete heap;  // a refused registration never calls destroy
    check(s);
  }
}

/// Unregisters `domain::name` (graphs and executables using it keep working).
inline void unregister_op(const std::string &domain, const std::string &name) {
  check(kiln_unregister_op(domain.c_str(), name.c_str()));
}

}  // namespace kiln

#endif  // KILN_HPP
