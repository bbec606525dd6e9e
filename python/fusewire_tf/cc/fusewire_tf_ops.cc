// fusewire's TensorFlow op library: parameter-server ops on ps::client and
// rendezvous send/recv on rendezvous::endpoint, plus a small C interface the
// Python package reaches through ctypes (configure the process, serve as a
// PS, shut the PS tasks down, name the transports).
//
// One translation unit on purpose: TensorFlow's headers cost most of the
// compile time, and every extra file pays it again.
//
// A process holds one runtime (made by fusewire_tf_configure): its task, the
// cluster, and either a ps::client (when a model is given; the rendezvous ops
// then share the client's endpoint) or a bare rendezvous endpoint. Ops look
// the runtime up on every call, so a graph built before configure() works.
//
// The transport is chosen by name when the runtime is made: the
// configuration's "transport": "auto" unless given, or any name
// fusewire::with_transport knows (transport/select.hpp: choose_transport
// says what "auto" picks, available_transports() what this build and
// machine can run; the lists live there only). The
// kernels are not templates: they call the abstract `runtime`, which
// runtime_on<Transport> implements over the transport with_transport hands
// it. So one library carries every transport its build has, and the choice
// costs a virtual call per operation. A PS (fusewire_tf_serve) chooses the
// same way; the tasks of a job must reach each other, which "auto" does when
// they share the cluster spec and TF_RDMA_ENABLED.
//
// Errors cross the C interface as an absl status code (the return value) and
// a message: a bad argument, such as a transport name this build or machine
// cannot run, is InvalidArgument and names what is allowed.
//
// Rendezvous wire format: a tensor under TensorFlow key K travels as two
// fusewire messages to the same peer: a header under K ("FWTF", version,
// dead flag, dtype, rank, dims, byte count) and, unless the tensor is dead or
// empty, its bytes under K + kDataSuffix. The receiver reads the header,
// allocates the output with TensorFlow's allocator and posts the data recv
// into that tensor, so the bytes land in TensorFlow's memory; the sender hands
// the input tensor's buffer to the endpoint without a copy (a reference to
// the tensor is held until the send completed). Per-(peer, key) FIFO order
// keeps the i-th header paired with the i-th payload.

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/ps/client.hpp>
#include <fusewire/ps/server.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/tf/rendezvous_key.hpp>
#include <fusewire/transport/select.hpp>
#include <fusewire/util/unique_function.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace fwtf {

namespace fw = fusewire;
namespace tfw = tensorflow;
using json = nlohmann::json;

// ---- statuses ---------------------------------------------------------------------

template <class... A>
absl::Status err_invalid(const A&... a) {
  return absl::InvalidArgumentError(absl::StrCat(a...));
}
template <class... A>
absl::Status err_unavailable(const A&... a) {
  return absl::UnavailableError(absl::StrCat(a...));
}
template <class... A>
absl::Status err_data_loss(const A&... a) {
  return absl::DataLossError(absl::StrCat(a...));
}
template <class... A>
absl::Status err_precondition(const A&... a) {
  return absl::FailedPreconditionError(absl::StrCat(a...));
}
template <class... A>
absl::Status err_internal(const A&... a) {
  return absl::InternalError(absl::StrCat(a...));
}

// The status of an exception from configuring, serving or a PS call: a bad
// argument or setting (std::invalid_argument, a malformed or incomplete
// JSON configuration, errc::invalid_argument or errc::invalid_config from
// fusewire) is InvalidArgument, another fusewire or system error (a port in
// use, a PS that does not answer) Unavailable, anything else Internal.
absl::Status status_of(const std::exception& e) {
  if (dynamic_cast<const std::invalid_argument*>(&e) != nullptr || dynamic_cast<const json::exception*>(&e) != nullptr)
    return err_invalid(e.what());
  if (const auto* s = dynamic_cast<const std::system_error*>(&e)) {
    if (s->code() == fw::errc::invalid_argument || s->code() == fw::errc::invalid_config) return err_invalid(e.what());
    return err_unavailable(e.what());
  }
  return err_internal(e.what());
}

// ---- configuration (JSON) ----------------------------------------------------

// The string field `name` of `j`, or `fallback` when it is absent or null.
std::string string_field(const json& j, const char* name, const std::string& fallback) {
  if (!j.contains(name) || j.at(name).is_null()) return fallback;
  const json& v = j.at(name);
  if (!v.is_string()) throw std::invalid_argument(std::string(name) + " " + v.dump() + ": must be a string");
  return v.get<std::string>();
}

// The transport `j` names ("transport", "auto" when absent), refused before
// anything is built when this build or machine cannot run it: the message
// names it, says why and lists the names that can run (as with_transport's).
std::string parse_transport(const json& j) {
  std::string name = string_field(j, "transport", "auto");
  if (std::optional<std::string> problem = fw::transport_problem(name))
    throw std::invalid_argument("transport '" + name + "': " + *problem);
  return name;
}

json parse_json(const std::string& text) {
  json j = json::parse(text);
  if (!j.is_object()) throw std::invalid_argument("the configuration must be a JSON object, not " + text);
  return j;
}

fw::ps::initializer parse_init(const json& j) {
  if (j.is_null()) return {};
  const std::string type = j.value("type", "zeros");
  const auto a = j.value("a", 0.0f);
  const auto b = j.value("b", 0.0f);
  const auto seed = j.value("seed", std::uint64_t{0});
  if (type == "zeros") return fw::ps::initializer::zeros();
  if (type == "constant") return fw::ps::initializer::constant(a);
  if (type == "uniform") return fw::ps::initializer::uniform(a, b, seed);
  if (type == "normal") return fw::ps::initializer::normal(a, b, seed);
  throw std::invalid_argument("initializer type '" + type + "' (allowed: zeros, constant, uniform, normal)");
}

fw::ps::optimizer_config parse_optimizer(const json& j) {
  if (j.is_null()) return {};
  fw::ps::optimizer_config o = fw::ps::optimizer_config::from_name(
      j.value("kind", "sgd"), j.value("learning_rate", fw::ps::optimizer_config{}.learning_rate));
  o.momentum = j.value("momentum", o.momentum);
  o.nesterov = j.value("nesterov", o.nesterov);
  o.initial_accumulator = j.value("initial_accumulator", o.initial_accumulator);
  o.beta1 = j.value("beta1", o.beta1);
  o.beta2 = j.value("beta2", o.beta2);
  o.epsilon = j.value("epsilon", o.epsilon);
  o.validate();
  return o;
}

fw::ps::model_spec parse_model(const json& j) {
  fw::ps::model_spec m;
  m.optimizer = parse_optimizer(j.value("optimizer", json()));
  m.min_slice_bytes = j.value("min_slice_bytes", m.min_slice_bytes);
  for (const json& v : j.at("variables")) {
    const std::string name = v.at("name").get<std::string>();
    const std::string kind = v.value("kind", "dense");
    std::optional<fw::ps::optimizer_config> opt;
    if (v.contains("optimizer")) opt = parse_optimizer(v.at("optimizer"));
    if (kind == "dense") {
      m.add_dense(name, v.at("shape").get<std::vector<std::int64_t>>(), parse_init(v.value("init", json())), opt);
    } else if (kind == "embedding") {
      m.add_embedding(name, v.at("dim").get<std::int64_t>(), parse_init(v.value("init", json())),
                      v.value("num_ids", std::int64_t{0}), opt);
    } else {
      throw std::invalid_argument("variable '" + name + "': kind '" + kind + "' (allowed: dense, embedding)");
    }
  }
  m.validate();
  return m;
}

fw::ps::training_mode parse_mode(const json& j) {
  const std::string mode = j.value("mode", "async");
  if (mode == "async") return fw::ps::training_mode::async;
  if (mode == "sync") return fw::ps::training_mode::sync;
  throw std::invalid_argument("mode '" + mode + "' (allowed: async, sync)");
}

fw::cluster_spec parse_cluster(const json& j) {
  const json& c = j.at("cluster");
  if (c.is_string()) return fw::cluster_spec::from_string(c.get<std::string>());
  return fw::cluster_spec::from_tf_config(json{{"cluster", c}}.dump());
}

// ---- the per-process runtime ---------------------------------------------------

using send_done = fw::util::unique_function<void(std::error_code)>;
using recv_done = fw::util::unique_function<void(std::error_code, fw::tensor_buffer)>;
using fw::rendezvous::clock;

// A configure() call's JSON, parsed and checked before anything is built: a
// configuration refused here leaves the earlier runtime in place.
struct settings {
  fw::task_id self;
  fw::cluster_spec spec;
  std::optional<fw::ps::model_spec> model;  // set: the process is a PS client
  fw::ps::training_mode mode = fw::ps::training_mode::async;
  std::chrono::milliseconds step_timeout{30000};
  std::string ps_job = "ps";
  std::chrono::milliseconds rendezvous_timeout{600000};
  std::string transport = "auto";
  fw::options options;
};

settings parse_settings(const std::string& text) {
  const json j = parse_json(text);
  settings s;
  s.self = fw::task_id::parse(j.at("task").get<std::string>());
  s.spec = parse_cluster(j);
  if (j.contains("model") && !j.at("model").is_null()) s.model = parse_model(j.at("model"));
  s.mode = parse_mode(j);
  s.step_timeout = std::chrono::milliseconds(j.value("step_timeout_ms", std::int64_t{30000}));
  s.ps_job = string_field(j, "ps_job", "ps");
  const std::int64_t rdv_ms = j.value("rendezvous_timeout_ms", std::int64_t{600000});
  if (rdv_ms <= 0)
    throw std::invalid_argument("rendezvous_timeout_ms " + std::to_string(rdv_ms) +
                                ": must be > 0 (a send or recv never waits forever)");
  s.rendezvous_timeout = std::chrono::milliseconds(rdv_ms);
  s.transport = parse_transport(j);
  s.options = fw::options::from_env(fw::role::worker);
  return s;
}

// The name with_transport() knows `Transport` by, as a configuration names
// it: the transport's own name without "_tcp" ("uring_tcp" is "uring",
// "shm+asio_tcp" is "shm+asio").
template <class Transport>
std::string name_of() {
  std::string_view n = Transport::name();
  if (n.ends_with("_tcp")) n.remove_suffix(4);
  return std::string(n);
}

// What the kernels and the C interface call, whatever the transport: the
// rendezvous endpoint's send and recv, and the ps::client's step, barrier and
// shutdown. runtime_on<Transport> implements it.
class runtime {
 public:
  runtime(const settings& s, std::string transport)
      : self_(s.self),
        transport_(std::move(transport)),
        has_model_(s.model.has_value()),
        rendezvous_timeout_(s.rendezvous_timeout) {}
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  virtual ~runtime() = default;

  const fw::task_id& self() const { return self_; }
  // A with_transport name (transport/select.hpp): what "auto" chose, or the name given.
  const std::string& transport() const { return transport_; }
  // The deadline of a send or recv whose timeout_ms attr is 0.
  std::chrono::milliseconds rendezvous_timeout() const { return rendezvous_timeout_; }

  // rendezvous::endpoint's send and recv (the handler runs on a reactor thread).
  virtual void send(const fw::task_id& peer, std::string key, fw::tensor_buffer data, send_done h,
                    clock::duration timeout) = 0;
  virtual void recv(const fw::task_id& peer, std::string key, recv_done h, clock::duration timeout) = 0;
  virtual void recv(const fw::task_id& peer, std::string key, fw::tensor_buffer destination, recv_done h,
                    clock::duration timeout) = 0;

  // The ps::client, when a model was configured. Its members are called by
  // one thread at a time: under ps_mutex (with_ps).
  bool has_model() const { return has_model_; }
  virtual const fw::ps::model_spec& model() const = 0;
  virtual void run(fw::ps::batch& b) = 0;
  virtual void barrier(std::chrono::milliseconds timeout) = 0;
  virtual void shutdown_servers() = 0;

  std::mutex ps_mutex;

 private:
  fw::task_id self_;
  std::string transport_;
  bool has_model_;
  std::chrono::milliseconds rendezvous_timeout_;
};

template <class Transport>
class runtime_on final : public runtime {
 public:
  using endpoint_type = fw::rendezvous::endpoint<Transport>;
  using client_type = fw::ps::client<Transport>;

  runtime_on(const settings& s, Transport t) : runtime(s, name_of<Transport>()) {
    if (s.model) {
      fw::ps::client_config<Transport> cfg;
      cfg.options = s.options;
      cfg.mode = s.mode;
      cfg.step_timeout = s.step_timeout;
      cfg.ps_job = s.ps_job;
      cfg.transport = std::move(t);
      client_ = std::make_unique<client_type>(s.self, s.spec, *s.model, std::move(cfg));
      ep_ = &client_->endpoint();
    } else {
      own_ep_ = std::make_unique<endpoint_type>(
          s.self, s.spec, fw::rendezvous::endpoint_config<Transport>{.options = s.options, .transport = std::move(t)});
      ep_ = own_ep_.get();
    }
  }

  // The endpoint goes in the destructor's body, while this object is whole:
  // its destructor completes every pending handler first, and a recv's
  // handler calls this object back (recv() for the tensor's bytes; that
  // recv fails at once, as the endpoint is closing).
  ~runtime_on() override {
    client_.reset();
    own_ep_.reset();
  }

  void send(const fw::task_id& peer, std::string key, fw::tensor_buffer data, send_done h,
            clock::duration timeout) override {
    ep_->send(peer, std::move(key), std::move(data), std::move(h), timeout);
  }
  void recv(const fw::task_id& peer, std::string key, recv_done h, clock::duration timeout) override {
    ep_->recv(peer, std::move(key), std::move(h), timeout);
  }
  void recv(const fw::task_id& peer, std::string key, fw::tensor_buffer destination, recv_done h,
            clock::duration timeout) override {
    ep_->recv(peer, std::move(key), std::move(destination), std::move(h), timeout);
  }

  const fw::ps::model_spec& model() const override { return client_->model(); }
  void run(fw::ps::batch& b) override { client_->run(b); }
  void barrier(std::chrono::milliseconds timeout) override { client_->barrier(timeout); }
  void shutdown_servers() override { client_->shutdown_servers(); }

 private:
  std::unique_ptr<client_type> client_;    // set when a model was configured
  std::unique_ptr<endpoint_type> own_ep_;  // else: rendezvous only
  endpoint_type* ep_ = nullptr;            // the one of the two that is set
};

std::mutex g_mutex;
std::shared_ptr<runtime> g_runtime;

std::shared_ptr<runtime> current_runtime() {
  std::lock_guard lock(g_mutex);
  return g_runtime;
}

void configure(const std::string& text) {
  const settings s = parse_settings(text);
  {
    // Drop the previous runtime first: the new endpoint listens on the same port.
    std::lock_guard lock(g_mutex);
    g_runtime.reset();
  }
  std::shared_ptr<runtime> rt = fw::with_transport(s.transport, s.options, s.spec, [&]<class T>(T t) {
    return std::shared_ptr<runtime>(std::make_shared<runtime_on<T>>(s, std::move(t)));
  });
  std::lock_guard lock(g_mutex);
  g_runtime = std::move(rt);
}

std::atomic<bool> g_stop_serving{false};

void serve(const std::string& text) {
  const json j = parse_json(text);
  const fw::task_id self = fw::task_id::parse(j.at("task").get<std::string>());
  const fw::cluster_spec spec = parse_cluster(j);
  const fw::ps::model_spec model = parse_model(j.at("model"));
  const fw::ps::training_mode mode = parse_mode(j);
  const std::string worker_job = string_field(j, "worker_job", "worker");
  const std::string transport = parse_transport(j);
  const fw::options opts = fw::options::from_env(fw::role::ps);
  fw::with_transport(transport, opts, spec, [&]<class T>(T t) {
    fw::ps::server_config<T> cfg;
    cfg.options = opts;
    cfg.mode = mode;
    cfg.worker_job = worker_job;
    cfg.transport = std::move(t);
    fw::ps::server<T> srv(self, spec, model, std::move(cfg));
    g_stop_serving = false;
    while (!srv.wait_for(std::chrono::milliseconds(50)) && !g_stop_serving.load()) {
    }
    srv.stop();
  });
}

// Writes `s`'s message into `err` (`n` bytes) and returns its code, which is
// never 0: the Python side raises the exception class of that code.
int report(const absl::Status& s, char* err, std::size_t n) {
  if (err != nullptr && n > 0) std::snprintf(err, n, "%s", std::string(s.message()).c_str());
  return static_cast<int>(s.code());
}

// Runs `f()` for a C interface function: 0, or report()'s code of what it threw.
template <class F>
int c_call(char* err, std::size_t n, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    return report(status_of(e), err, n);
  } catch (...) {
    return report(err_internal("an exception that is not a std::exception"), err, n);
  }
}

// ---- dtypes ---------------------------------------------------------------------

// fusewire's dtype values are TensorFlow's DataType numbers.
bool to_fw_dtype(tfw::DataType t, fw::dtype& out) {
  const int v = static_cast<int>(t);
  if (v <= 0 || v > 255) return false;
  out = static_cast<fw::dtype>(v);
  return fw::is_valid(out);
}

std::string supported_dtypes() {
  std::string s;
  for (fw::dtype t : fw::all_dtypes) s += (s.empty() ? "" : ", ") + std::string(fw::to_string(t));
  return s;
}

absl::Status unsupported(tfw::DataType t) {
  return err_invalid("fusewire cannot carry dtype ", tfw::DataTypeString(t), " (supported: ", supported_dtypes(), ")");
}

// ---- rendezvous header -------------------------------------------------------------

constexpr char kMagic[4] = {'F', 'W', 'T', 'F'};
constexpr std::uint8_t kVersion = 1;
constexpr const char* kDataSuffix = ";fusewire-data";

struct header {
  bool dead = false;
  fw::dtype type = fw::dtype::invalid;
  std::vector<std::int64_t> dims;
  std::uint64_t bytes = 0;
};

fw::tensor_buffer encode(const header& h) {
  const std::size_t n = 8 + 8 * h.dims.size() + 8;
  fw::tensor_buffer b = fw::tensor_buffer::allocate(n);
  auto* p = reinterpret_cast<unsigned char*>(b.data());
  std::memcpy(p, kMagic, 4);
  p[4] = kVersion;
  p[5] = h.dead ? 1 : 0;
  p[6] = static_cast<unsigned char>(h.type);
  p[7] = static_cast<unsigned char>(h.dims.size());
  std::memcpy(p + 8, h.dims.data(), 8 * h.dims.size());
  std::memcpy(p + 8 + 8 * h.dims.size(), &h.bytes, 8);
  return b;
}

// What is wrong with the header in `b`, or "" (then `out` is filled).
std::string decode(const fw::tensor_buffer& b, header& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < 16 || std::memcmp(p, kMagic, 4) != 0) return "not a fusewire_tf tensor header";
  if (p[4] != kVersion) return "header version " + std::to_string(p[4]) + " (this library reads 1)";
  const std::size_t rank = p[7];
  if (rank > fw::max_rank) return "rank " + std::to_string(rank) + " above " + std::to_string(fw::max_rank);
  if (b.size() != 16 + 8 * rank)
    return "header of " + std::to_string(b.size()) + " bytes for rank " + std::to_string(rank);
  out.dead = p[5] != 0;
  out.type = static_cast<fw::dtype>(p[6]);
  out.dims.resize(rank);
  std::memcpy(out.dims.data(), p + 8, 8 * rank);
  std::memcpy(&out.bytes, p + 8 + 8 * rank, 8);
  return {};
}

// Parses `key` and checks that this process is `side` ("src" or "dst") of it.
absl::Status route_of(runtime& rt, const std::string& key, bool sending, fw::tf::rendezvous_route& out) {
  std::error_code ec;
  auto parsed = fw::tf::parse_rendezvous_key(key, ec);
  if (!parsed) {
    try {
      (void)fw::tf::parse_rendezvous_key(key);
    } catch (const std::exception& e) {
      return err_invalid(e.what());
    }
  }
  try {
    out = fw::tf::route(*parsed);
  } catch (const std::exception& e) {
    return err_invalid("rendezvous key '", key, "': ", e.what());
  }
  const fw::task_id& me = sending ? out.src : out.dst;
  if (!(me == rt.self())) {
    return err_invalid("rendezvous key '", key, "': its ", sending ? "src" : "dst", " device is task ", me.to_string(),
                       " but this process is ", rt.self().to_string());
  }
  return absl::OkStatus();
}

absl::Status no_runtime() {
  return err_precondition("fusewire is not configured in this process: call fusewire_tf.configure()");
}

std::string ec_text(const std::error_code& ec) { return ec.message(); }

// The TensorFlow status of a failed send or recv: a deadline is
// DeadlineExceeded, close() Cancelled, a bad peer or size InvalidArgument,
// a peer that is gone or unreachable Unavailable.
absl::Status status_of(const std::error_code& ec, const std::string& where) {
  const std::string text = where + ": " + ec_text(ec);
  if (ec == fw::errc::timed_out) return absl::DeadlineExceededError(text);
  if (ec == fw::errc::cancelled) return absl::CancelledError(text);
  if (ec == fw::errc::invalid_argument || ec == fw::errc::frame_too_large || ec == fw::errc::size_mismatch)
    return absl::InvalidArgumentError(text);
  return absl::UnavailableError(text);
}

// ---- completing an async op exactly once ----------------------------------------------

// An AsyncOpKernel's completion, exactly once, by whichever comes first: the
// endpoint's handlers, or TensorFlow cancelling the step (the op's
// CancellationManager: a session's timeout_in_ms, a cancelled function call,
// an error elsewhere in the step). A cancelled op completes at once with
// Cancelled. Its endpoint operation stays posted until it completes or its
// deadline passes (the endpoint cannot withdraw one); its handler then finds
// the op done and touches neither the op's context nor its outputs.
class completion {
 public:
  completion(tfw::OpKernelContext* ctx, tfw::AsyncOpKernel::DoneCallback done, std::string where)
      : ctx_(ctx), done_(std::move(done)), where_(std::move(where)) {}

  // Registers with the step's cancellation. False when the step is already
  // cancelled: the op then completed with Cancelled.
  static bool watch(const std::shared_ptr<completion>& self) {
    self->cm_ = self->ctx_->cancellation_manager();
    if (self->cm_ == nullptr) return true;
    self->token_ = self->cm_->get_cancellation_token();
    if (self->cm_->RegisterCallback(self->token_, [self] { self->finish(self->cancelled(), true); })) return true;
    self->cm_ = nullptr;
    self->finish(self->cancelled());
    return false;
  }

  // Runs f(ctx) unless the op already completed (a cancel waits meanwhile);
  // false if it had.
  template <class F>
  bool live(F&& f) {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    f(ctx_);
    return true;
  }

  void finish(const absl::Status& s, bool from_cancel = false) {
    {
      std::lock_guard lock(mutex_);
      if (finished_) return;
      finished_ = true;
    }
    // Before done(): the step, and its CancellationManager, may end with it.
    if (cm_ != nullptr && !from_cancel) cm_->DeregisterCallback(token_);
    if (!s.ok()) ctx_->SetStatus(s);
    auto done = std::move(done_);
    done();
  }

  void finish(const std::error_code& ec) { finish(ec ? status_of(ec, where_) : absl::OkStatus()); }

  const std::string& where() const { return where_; }

 private:
  absl::Status cancelled() const { return absl::CancelledError(where_ + ": the step was cancelled"); }

  std::mutex mutex_;
  bool finished_ = false;
  tfw::OpKernelContext* ctx_;
  tfw::AsyncOpKernel::DoneCallback done_;
  std::string where_;
  tfw::CancellationManager* cm_ = nullptr;
  tfw::CancellationToken token_ = tfw::CancellationManager::kInvalidToken;
};

absl::Status timeout_attr(tfw::OpKernelConstruction* c, std::int64_t& ms) {
  TF_RETURN_IF_ERROR(c->GetAttr("timeout_ms", &ms));
  if (ms < 0) return err_invalid("timeout_ms ", ms, ": must be >= 0 (0: configure()'s rendezvous_timeout_ms)");
  return absl::OkStatus();
}

// An op's deadline: its timeout_ms attr, or 0 for the runtime's default.
fw::rendezvous::clock::duration deadline_of(const runtime& rt, std::int64_t ms) {
  return ms > 0 ? std::chrono::milliseconds(ms) : rt.rendezvous_timeout();
}

// ---- rendezvous kernels -------------------------------------------------------------

// What every rendezvous kernel looks up first: the runtime, the key (scalar
// input `key_input`) and its route, this process being its src (sending) or dst.
absl::Status rendezvous_args(tfw::OpKernelContext* ctx, int key_input, bool sending, std::shared_ptr<runtime>& rt,
                             std::string& key, fw::tf::rendezvous_route& r) {
  rt = current_runtime();
  if (rt == nullptr) return no_runtime();
  const tfw::Tensor& k = ctx->input(key_input);
  if (!tfw::TensorShapeUtils::IsScalar(k.shape()))
    return err_invalid("key must be a scalar string, not of shape ", k.shape().DebugString());
  key = std::string(k.scalar<tfw::tstring>()());
  return route_of(*rt, key, sending, r);
}

class SendOp : public tfw::AsyncOpKernel {
 public:
  explicit SendOp(tfw::OpKernelConstruction* c) : AsyncOpKernel(c) { OP_REQUIRES_OK(c, timeout_attr(c, timeout_ms_)); }

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<runtime> rt;
    std::string key;
    fw::tf::rendezvous_route r;
    OP_REQUIRES_OK_ASYNC(ctx, rendezvous_args(ctx, 1, true, rt, key, r), done);
    OP_REQUIRES_ASYNC(ctx, tfw::TensorShapeUtils::IsScalar(ctx->input(2).shape()),
                      err_invalid("is_dead must be a scalar bool, not of shape ", ctx->input(2).shape().DebugString()),
                      done);
    const tfw::Tensor& value = ctx->input(0);
    const bool dead = ctx->input(2).scalar<bool>()();
    header h;
    h.dead = dead;
    OP_REQUIRES_ASYNC(ctx, to_fw_dtype(value.dtype(), h.type), unsupported(value.dtype()), done);
    OP_REQUIRES_ASYNC(ctx, static_cast<std::size_t>(value.dims()) <= fw::max_rank,
                      err_invalid("fusewire carries tensors of rank up to ", fw::max_rank, ", not ", value.dims()),
                      done);
    for (int i = 0; i < value.dims(); ++i) h.dims.push_back(value.dim_size(i));
    const auto data = value.tensor_data();
    h.bytes = dead ? 0 : data.size();

    auto op =
        std::make_shared<completion>(ctx, std::move(done), "fusewire send of '" + key + "' to " + r.dst.to_string());
    if (!completion::watch(op)) return;
    // The op completes once both sends (header, bytes) completed; the first error wins.
    struct pair {
      std::atomic<int> left{0};
      std::mutex mutex;
      std::error_code error;
    };
    auto both = std::make_shared<pair>();
    both->left = h.bytes > 0 ? 2 : 1;
    auto sent = [op, both](std::error_code ec) {
      if (ec) {
        std::lock_guard lock(both->mutex);
        if (!both->error) both->error = ec;
      }
      if (both->left.fetch_sub(1) == 1) op->finish(both->error);
    };
    const auto timeout = deadline_of(*rt, timeout_ms_);
    rt->send(r.dst, r.channel_key, encode(h), sent, timeout);
    if (h.bytes > 0) {
      // Zero copy: the endpoint sends from the tensor's own buffer; the
      // deleter's Tensor copy keeps that buffer alive until the send is done.
      auto hold = std::make_shared<tfw::Tensor>(value);
      auto* bytes = reinterpret_cast<std::byte*>(const_cast<char*>(data.data()));
      fw::tensor_buffer payload = fw::tensor_buffer::wrap(bytes, data.size(), [hold]() mutable { hold.reset(); });
      rt->send(r.dst, r.channel_key + kDataSuffix, std::move(payload), sent, timeout);
    }
  }

 private:
  std::int64_t timeout_ms_ = 0;
};

// Allocates a recv's outputs for header `h` (of the op's dtype). `payload`
// gets a reference to the output the bytes go into, or stays empty when none
// follow (a dead or empty tensor).
absl::Status allocate_recv_outputs(tfw::OpKernelContext* ctx, const header& h, const std::string& where,
                                   std::shared_ptr<tfw::Tensor>& payload) {
  tfw::Tensor* dead_out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, tfw::TensorShape({}), &dead_out));
  dead_out->scalar<bool>()() = h.dead;
  tfw::TensorShape shape;
  if (h.dead) {
    shape = tfw::TensorShape({0});  // a dead value has no bytes
  } else {
    for (std::int64_t d : h.dims) {
      if (d < 0 || !shape.AddDimWithStatus(d).ok()) return err_data_loss(where, ": bad dimension ", d);
    }
  }
  tfw::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &out));
  const std::size_t size = out->tensor_data().size();
  if (h.dead || size == 0) {
    if (!h.dead && h.bytes != 0) return err_data_loss(where, ": header says ", h.bytes, " bytes for an empty tensor");
    return absl::OkStatus();
  }
  if (h.bytes != size) return err_data_loss(where, ": header says ", h.bytes, " bytes, its shape needs ", size);
  payload = std::make_shared<tfw::Tensor>(*out);
  return absl::OkStatus();
}

class RecvOp : public tfw::AsyncOpKernel {
 public:
  explicit RecvOp(tfw::OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dtype", &dtype_));
    OP_REQUIRES_OK(c, timeout_attr(c, timeout_ms_));
    fw::dtype t;
    OP_REQUIRES(c, to_fw_dtype(dtype_, t), unsupported(dtype_));
  }

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<runtime> rt;
    std::string key;
    fw::tf::rendezvous_route r;
    OP_REQUIRES_OK_ASYNC(ctx, rendezvous_args(ctx, 0, false, rt, key, r), done);
    auto op =
        std::make_shared<completion>(ctx, std::move(done), "fusewire recv of '" + key + "' from " + r.src.to_string());
    if (!completion::watch(op)) return;
    const auto timeout = deadline_of(*rt, timeout_ms_);
    const tfw::DataType want = dtype_;
    // The handlers run on the endpoint's reactor thread and hold only the
    // runtime's address, never a reference: dropping the last reference to
    // the runtime there would destroy the endpoint on its own reactor thread.
    // The runtime outlives the handlers (its destructor destroys the
    // endpoint, which fails pending operations, then joins the reactors), and
    // a recv posted while the endpoint closes fails at once.
    runtime* net = rt.get();
    net->recv(
        r.src, r.channel_key,
        [net, op, want, r, timeout](std::error_code ec, fw::tensor_buffer buf) {
          if (ec) return op->finish(ec);
          header h;
          if (std::string why = decode(buf, h); !why.empty()) return op->finish(err_data_loss(op->where(), ": ", why));
          if (static_cast<int>(h.type) != static_cast<int>(want)) {
            return op->finish(err_invalid(op->where(), ": the sender sent ", fw::to_string(h.type),
                                          ", this op expects ", tfw::DataTypeString(want)));
          }
          absl::Status s;
          std::shared_ptr<tfw::Tensor> payload;
          if (!op->live([&](tfw::OpKernelContext* ctx) { s = allocate_recv_outputs(ctx, h, op->where(), payload); }))
            return;  // cancelled: the bytes, if any, stay with the endpoint until dropped
          if (!s.ok() || payload == nullptr) return op->finish(s);
          // The bytes land in the output TensorFlow allocated (no copy when
          // the recv is posted before they arrive); `payload` keeps it alive
          // even if the op is cancelled meanwhile.
          const auto data = payload->tensor_data();
          auto* bytes = reinterpret_cast<std::byte*>(const_cast<char*>(data.data()));
          fw::tensor_buffer dest =
              fw::tensor_buffer::wrap(bytes, data.size(), [payload]() mutable { payload.reset(); });
          net->recv(
              r.src, r.channel_key + kDataSuffix, std::move(dest),
              [op](std::error_code ec2, fw::tensor_buffer) { op->finish(ec2); }, timeout);
        },
        timeout);
  }

 private:
  tfw::DataType dtype_ = tfw::DT_INVALID;
  std::int64_t timeout_ms_ = 0;
};

// ---- PS kernels -------------------------------------------------------------------

// A TensorFlow error raised inside a PS kernel's step (an output that could not
// be allocated): with_ps returns its status as is.
struct tf_failure {
  absl::Status status;
};

// Runs `f(runtime)` under the runtime's PS lock when it has a ps::client,
// turning exceptions into a status.
template <class F>
absl::Status with_ps(F&& f) {
  auto rt = current_runtime();
  if (rt == nullptr) return no_runtime();
  if (!rt->has_model())
    return err_precondition(
        "fusewire is configured without a model in this process: pass model= to fusewire_tf.configure() to use "
        "the PS ops");
  try {
    std::lock_guard lock(rt->ps_mutex);
    f(*rt);
  } catch (const tf_failure& e) {
    return e.status;
  } catch (const std::exception& e) {
    return status_of(e);
  }
  return absl::OkStatus();
}

std::span<const float> floats(const tfw::Tensor& t) {
  const auto f = t.flat<float>();
  return {f.data(), static_cast<std::size_t>(f.size())};
}

std::span<const std::int64_t> ids_of(const tfw::Tensor& t) {
  const auto f = t.flat<std::int64_t>();
  return {f.data(), static_cast<std::size_t>(f.size())};
}

// One PS kernel's step, for every PS kernel: looks each variable up (it
// must exist and be of the kind the op needs), checks each argument against
// it, allocates the outputs, adds the pulls and pushes to one ps::batch (one
// request per PS), runs it and copies the pulled values into the outputs.
class ps_step {
 public:
  ps_step(runtime& c, tfw::OpKernelContext* ctx) : c_(c), ctx_(ctx) {}

  // Dense `var` into output `out`, of the variable's shape.
  void pull(const std::string& var, int out) {
    const auto* v = find(var, fw::ps::variable_kind::dense);
    tfw::TensorShape shape;
    for (std::int64_t d : v->shape) shape.AddDim(d);
    pulls_.emplace_back(b_.pull(var), allocate(out, shape));
  }

  // Rows `ids` (any shape) of embedding `var` into output `out`: ids.shape + [dim].
  void pull_rows(const std::string& var, const tfw::Tensor& ids, int out) {
    const auto* v = find(var, fw::ps::variable_kind::embedding);
    tfw::TensorShape shape = ids.shape();
    shape.AddDim(v->row_size());
    tfw::Tensor* t = allocate(out, shape);
    if (ids.NumElements() > 0) pulls_.emplace_back(b_.pull_rows(var, ids_of(ids)), t);
  }

  void push(const std::string& var, const tfw::Tensor& grad) {
    const auto* v = find(var, fw::ps::variable_kind::dense);
    if (grad.NumElements() != v->num_elements())
      fw::throw_error(fw::errc::invalid_argument, "push of '" + var + "': gradient of " +
                                                      std::to_string(grad.NumElements()) +
                                                      " values, the variable has " + std::to_string(v->num_elements()));
    b_.push(var, floats(grad));
  }

  void push_rows(const std::string& var, const tfw::Tensor& ids, const tfw::Tensor& grads) {
    const auto* v = find(var, fw::ps::variable_kind::embedding);
    if (grads.NumElements() != ids.NumElements() * v->row_size())
      fw::throw_error(fw::errc::invalid_argument, "push_rows of '" + var + "': " + std::to_string(grads.NumElements()) +
                                                      " gradient values for " + std::to_string(ids.NumElements()) +
                                                      " ids of dim " + std::to_string(v->row_size()));
    if (ids.NumElements() > 0) b_.push_rows(var, ids_of(ids), floats(grads));
  }

  void run() {
    if (b_.empty()) return;
    c_.run(b_);
    for (const auto& [h, out] : pulls_) {
      const auto vals = b_.result(h);
      if (!vals.empty()) std::memcpy(out->flat<float>().data(), vals.data(), vals.size() * sizeof(float));
    }
  }

 private:
  const fw::ps::variable_spec* find(const std::string& name, fw::ps::variable_kind kind) {
    const auto& v = c_.model().variables[c_.model().index_of(name)];
    if (v.kind != kind)
      fw::throw_error(fw::errc::invalid_argument,
                      "variable '" + name + "' is " +
                          (v.kind == fw::ps::variable_kind::dense ? "dense" : "an embedding") +
                          (kind == fw::ps::variable_kind::dense ? "; this op needs a dense variable"
                                                                : "; this op needs an embedding"));
    return &v;
  }

  tfw::Tensor* allocate(int index, const tfw::TensorShape& shape) {
    tfw::Tensor* out = nullptr;
    if (absl::Status s = ctx_->allocate_output(index, shape, &out); !s.ok()) throw tf_failure{s};
    return out;
  }

  runtime& c_;
  tfw::OpKernelContext* ctx_;
  fw::ps::batch b_;
  std::vector<std::pair<fw::ps::batch::handle, tfw::Tensor*>> pulls_;
};

// Every PS kernel: its variable names from the attrs ("var", or "dense_vars"
// and "table_vars"), and one ps_step that add() fills.
class PSKernel : public tfw::OpKernel {
 public:
  explicit PSKernel(tfw::OpKernelConstruction* c) : OpKernel(c) {
    if (c->HasAttr("var")) {
      std::string var;
      OP_REQUIRES_OK(c, c->GetAttr("var", &var));
      dense_ = tables_ = {var};
    } else {
      OP_REQUIRES_OK(c, c->GetAttr("dense_vars", &dense_));
      OP_REQUIRES_OK(c, c->GetAttr("table_vars", &tables_));
      int nd = 0;
      int nt = 0;
      OP_REQUIRES_OK(c, c->GetAttr("num_dense", &nd));
      OP_REQUIRES_OK(c, c->GetAttr("num_tables", &nt));
      OP_REQUIRES(c, static_cast<std::size_t>(nd) == dense_.size() && static_cast<std::size_t>(nt) == tables_.size(),
                  err_invalid(type_string(), ": dense_vars names ", dense_.size(), " variables and table_vars ",
                              tables_.size(), " tables, for ", nd, " dense and ", nt, " table inputs"));
    }
  }

  void Compute(tfw::OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, with_ps([&](runtime& c) {
                     ps_step step(c, ctx);
                     add(step, ctx);
                     step.run();
                   }));
  }

 protected:
  virtual void add(ps_step& step, tfw::OpKernelContext* ctx) = 0;
  const std::string& var() const { return dense_[0]; }

  std::vector<std::string> dense_;
  std::vector<std::string> tables_;
};

class PullOp : public PSKernel {
 public:
  using PSKernel::PSKernel;
  void add(ps_step& s, tfw::OpKernelContext*) override { s.pull(var(), 0); }
};

class PushOp : public PSKernel {
 public:
  using PSKernel::PSKernel;
  void add(ps_step& s, tfw::OpKernelContext* ctx) override { s.push(var(), ctx->input(0)); }
};

class PullRowsOp : public PSKernel {
 public:
  using PSKernel::PSKernel;
  void add(ps_step& s, tfw::OpKernelContext* ctx) override { s.pull_rows(var(), ctx->input(0), 0); }
};

class PushRowsOp : public PSKernel {
 public:
  using PSKernel::PSKernel;
  void add(ps_step& s, tfw::OpKernelContext* ctx) override { s.push_rows(var(), ctx->input(0), ctx->input(1)); }
};

// One request per PS for a whole step's pulls: every dense variable and the
// rows of every table (inputs: the tables' ids; outputs: dense, then rows).
class PullManyOp : public PSKernel {
 public:
  using PSKernel::PSKernel;
  void add(ps_step& s, tfw::OpKernelContext* ctx) override {
    const int nd = static_cast<int>(dense_.size());
    for (int i = 0; i < nd; ++i) s.pull(dense_[static_cast<std::size_t>(i)], i);
    for (std::size_t j = 0; j < tables_.size(); ++j)
      s.pull_rows(tables_[j], ctx->input(static_cast<int>(j)), nd + static_cast<int>(j));
  }
};

// The gradients of a PullMany, every push of the step in one request per PS
// (inputs: dense gradients, the tables' ids, their row gradients).
class PushManyOp : public PSKernel {
 public:
  using PSKernel::PSKernel;
  void add(ps_step& s, tfw::OpKernelContext* ctx) override {
    const std::size_t nd = dense_.size();
    const std::size_t nt = tables_.size();
    for (std::size_t i = 0; i < nd; ++i) s.push(dense_[i], ctx->input(static_cast<int>(i)));
    for (std::size_t j = 0; j < nt; ++j)
      s.push_rows(tables_[j], ctx->input(static_cast<int>(nd + j)), ctx->input(static_cast<int>(nd + nt + j)));
  }
};

}  // namespace fwtf

// ---- registration -------------------------------------------------------------------

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("FusewireSend")
    .Input("tensor: T")
    .Input("key: string")
    .Input("is_dead: bool")
    .Attr("T: type")
    .Attr("timeout_ms: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Sends `tensor` under TensorFlow rendezvous key `key` to the key's dst task.");

REGISTER_OP("FusewireRecv")
    .Input("key: string")
    .Output("tensor: dtype")
    .Output("is_dead: bool")
    .Attr("dtype: type")
    .Attr("timeout_ms: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->UnknownShape());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Receives the tensor the key's src task sends under `key` (either side may come first).");

REGISTER_OP("FusewirePull")
    .Input("trigger: float")
    .Output("value: float")
    .Attr("var: string")
    .Attr("shape: shape")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

REGISTER_OP("FusewirePush")
    .Input("grad: float")
    .Attr("var: string")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("FusewirePullRows")
    .Input("ids: int64")
    .Input("trigger: float")
    .Output("rows: float")
    .Attr("var: string")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(0), c->Vector(dim), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

REGISTER_OP("FusewirePushRows")
    .Input("ids: int64")
    .Input("grads: float")
    .Attr("var: string")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("FusewirePullMany")
    .Input("ids: num_tables * int64")
    .Input("trigger: float")
    .Output("dense: num_dense * float")
    .Output("rows: num_tables * float")
    .Attr("dense_vars: list(string) >= 0")
    .Attr("dense_shapes: list(shape) >= 0")
    .Attr("table_vars: list(string) >= 0")
    .Attr("dims: list(int) >= 0")
    .Attr("num_dense: int >= 0")
    .Attr("num_tables: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("dense_shapes", &shapes));
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      const int nd = static_cast<int>(shapes.size());
      const int nt = static_cast<int>(dims.size());
      if (c->num_outputs() != nd + nt || c->num_inputs() != nt + 1)
        return absl::InvalidArgumentError(
            "FusewirePullMany: dense_shapes and dims must match num_dense and num_tables");
      for (int i = 0; i < nd; ++i) {
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[static_cast<std::size_t>(i)], &out));
        c->set_output(i, out);
      }
      for (int j = 0; j < nt; ++j) {
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->Concatenate(c->input(j), c->Vector(dims[static_cast<std::size_t>(j)]), &out));
        c->set_output(nd + j, out);
      }
      return absl::OkStatus();
    });

REGISTER_OP("FusewirePushMany")
    .Input("dense_grads: num_dense * float")
    .Input("ids: num_tables * int64")
    .Input("row_grads: num_tables * float")
    .Attr("dense_vars: list(string) >= 0")
    .Attr("table_vars: list(string) >= 0")
    .Attr("num_dense: int >= 0")
    .Attr("num_tables: int >= 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("FusewireSend").Device(DEVICE_CPU), fwtf::SendOp);
REGISTER_KERNEL_BUILDER(Name("FusewireRecv").Device(DEVICE_CPU), fwtf::RecvOp);
REGISTER_KERNEL_BUILDER(Name("FusewirePull").Device(DEVICE_CPU), fwtf::PullOp);
REGISTER_KERNEL_BUILDER(Name("FusewirePush").Device(DEVICE_CPU), fwtf::PushOp);
REGISTER_KERNEL_BUILDER(Name("FusewirePullRows").Device(DEVICE_CPU), fwtf::PullRowsOp);
REGISTER_KERNEL_BUILDER(Name("FusewirePushRows").Device(DEVICE_CPU), fwtf::PushRowsOp);
REGISTER_KERNEL_BUILDER(Name("FusewirePullMany").Device(DEVICE_CPU), fwtf::PullManyOp);
REGISTER_KERNEL_BUILDER(Name("FusewirePushMany").Device(DEVICE_CPU), fwtf::PushManyOp);

}  // namespace tensorflow

// ---- C interface (ctypes) ------------------------------------------------------------
//
// Each function returns 0, or the absl status code of what failed with its
// message in `err` (`errlen` bytes).

extern "C" {

__attribute__((visibility("default"))) int fusewire_tf_configure(const char* config_json, char* err,
                                                                 std::size_t errlen) {
  return fwtf::c_call(err, errlen, [&] { fwtf::configure(config_json); });
}

__attribute__((visibility("default"))) int fusewire_tf_reset() {
  std::lock_guard lock(fwtf::g_mutex);
  fwtf::g_runtime.reset();
  return 0;
}

__attribute__((visibility("default"))) int fusewire_tf_serve(const char* config_json, char* err, std::size_t errlen) {
  return fwtf::c_call(err, errlen, [&] { fwtf::serve(config_json); });
}

__attribute__((visibility("default"))) void fusewire_tf_stop_serving() { fwtf::g_stop_serving = true; }

__attribute__((visibility("default"))) int fusewire_tf_shutdown_ps(char* err, std::size_t errlen) {
  const absl::Status s = fwtf::with_ps([](fwtf::runtime& c) { c.shutdown_servers(); });
  return s.ok() ? 0 : fwtf::report(s, err, errlen);
}

__attribute__((visibility("default"))) int fusewire_tf_barrier(std::int64_t timeout_ms, char* err, std::size_t errlen) {
  const absl::Status s = fwtf::with_ps([&](fwtf::runtime& c) { c.barrier(std::chrono::milliseconds(timeout_ms)); });
  return s.ok() ? 0 : fwtf::report(s, err, errlen);
}

// The transport of this process's runtime (a with_transport name, as
// runtime::transport()) into `out`; "" when it is not configured.
__attribute__((visibility("default"))) int fusewire_tf_transport(char* out, std::size_t outlen, char* err,
                                                                 std::size_t errlen) {
  return fwtf::c_call(err, errlen, [&] {
    const std::shared_ptr<fwtf::runtime> rt = fwtf::current_runtime();
    std::snprintf(out, outlen, "%s", rt ? rt->transport().c_str() : "");
  });
}

// The transports this build and machine can run, comma-separated, into
// `out` (fusewire::available_transports; "auto" picks among them).
__attribute__((visibility("default"))) int fusewire_tf_available_transports(char* out, std::size_t outlen, char* err,
                                                                            std::size_t errlen) {
  return fwtf::c_call(err, errlen, [&] {
    std::string names;
    for (const std::string& n : fusewire::available_transports()) names += (names.empty() ? "" : ",") + n;
    std::snprintf(out, outlen, "%s", names.c_str());
  });
}

}  // extern "C"
