// gRPC (C++, libgrpc++), asynchronous completion queues on both sides.
// Non-serialized: the generic API (GenericStub / AsyncGenericService), one
// slice per iovec buffer, no protobuf. Serialized: the generated
// fwbench.Bench service, whose Payload carries the buffers as repeated bytes.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <mutex>
#include <thread>

#include "backend.hpp"
#include "fwbench.grpc.pb.h"
#include "fwbench.pb.h"

namespace fusewire::bench {
namespace {

const std::string echo_method = "/fwbench.Raw/Echo";
const std::string ack_method = "/fwbench.Raw/Ack";

std::string grpc_address(const endpoint& ep) {
  const bool v6 = ep.host.find(':') != std::string::npos;
  return (v6 ? "[" + ep.host + "]" : ep.host) + ":" + std::to_string(ep.port);
}

class grpc_server;

/// One RPC in progress on the PS; a completion-queue tag.
class call_base {
 public:
  virtual ~call_base() = default;
  /// Advances the call after its last operation completed with `ok`.
  virtual void proceed(bool ok) = 0;
};

class grpc_server final : public server {
 public:
  explicit grpc_server(const server_config& config) : config_(config) {
    grpc::ServerBuilder builder;
    int selected = 0;
    builder.AddListeningPort(grpc_address(config.listen), grpc::InsecureServerCredentials(), &selected);
    builder.SetMaxReceiveMessageSize(INT_MAX);
    builder.SetMaxSendMessageSize(INT_MAX);
    // One PS per port: a second one must fail to bind, not share the port.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    if (config.mode == wire_mode::raw) {
      builder.RegisterAsyncGenericService(&generic_);
    } else {
      builder.RegisterService(&service_);
    }
    const unsigned threads = std::max(1u, config.transport.grpc_threads);
    for (unsigned i = 0; i < threads; ++i) queues_.push_back(builder.AddCompletionQueue());
    server_ = builder.BuildAndStart();
    if (!server_ || selected == 0) {
      throw_error(errc::invalid_argument, "grpc: cannot listen on " + config.listen.to_string());
    }
    port_ = static_cast<std::uint16_t>(selected);
  }

  ~grpc_server() override {
    stop();
    if (!drained_) {
      for (auto& cq : queues_) drain(*cq);
    }
  }

  std::uint16_t port() const override { return port_; }

  void run() override {
    for (auto& cq : queues_) arm(cq.get());
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < queues_.size(); ++i) threads.emplace_back([this, i] { drain(*queues_[i]); });
    drain(*queues_[0]);
    for (auto& t : threads) t.join();
    drained_ = true;
  }

  void stop() override {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    server_->Shutdown(std::chrono::system_clock::now());
    for (auto& cq : queues_) cq->Shutdown();
  }

  /// Runs `start` (which begins an operation on a call) unless the server is
  /// stopping; false means the caller must delete the call instead.
  template <typename Start>
  bool start_op(Start&& start) {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    start();
    return true;
  }

  void arm(grpc::ServerCompletionQueue* cq);

  const server_config& config() const noexcept { return config_; }
  grpc::AsyncGenericService& generic() noexcept { return generic_; }
  fwbench::Bench::AsyncService& service() noexcept { return service_; }

 private:
  static void drain(grpc::ServerCompletionQueue& cq) {
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) static_cast<call_base*>(tag)->proceed(ok);
  }

  server_config config_;
  grpc::AsyncGenericService generic_;
  fwbench::Bench::AsyncService service_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::unique_ptr<grpc::Server> server_;
  std::uint16_t port_ = 0;
  std::mutex mutex_;
  bool stopping_ = false;
  bool drained_ = false;
};

/// Non-serialized: a generic call; the request arrives as a ByteBuffer of slices.
class generic_call final : public call_base {
 public:
  generic_call(grpc_server& owner, grpc::ServerCompletionQueue* cq) : owner_(owner), cq_(cq), stream_(&context_) {
    if (!owner_.start_op([&] { owner_.generic().RequestCall(&context_, &stream_, cq_, cq_, this); })) delete this;
  }

  void proceed(bool ok) override {
    switch (state_) {
      case state::requested:
        if (!ok) break;
        new generic_call(owner_, cq_);
        state_ = state::reading;
        if (!owner_.start_op([&] { stream_.Read(&request_, this); })) break;
        return;
      case state::reading: {
        if (!ok) break;
        state_ = state::finishing;
        const bool echo = owner_.config().reply == reply_kind::echo;
        const std::string& expected = echo ? echo_method : ack_method;
        grpc::Status status = grpc::Status::OK;
        if (context_.method() != expected) {
          status = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                "this PS serves " + expected + ", not " + context_.method() +
                                    "; start it with the same --benchmark and --mode");
        } else if (echo) {
          reply_ = request_;  // shares the slices, no copy
        } else {
          const std::uint64_t bytes = request_.Length();
          grpc::Slice slice(&bytes, sizeof bytes);
          reply_ = grpc::ByteBuffer(&slice, 1);
        }
        if (!owner_.start_op([&] {
              if (status.ok()) {
                stream_.WriteAndFinish(reply_, grpc::WriteOptions(), status, this);
              } else {
                stream_.Finish(status, this);
              }
            })) {
          break;
        }
        return;
      }
      case state::finishing:
        break;
    }
    delete this;
  }

 private:
  enum class state { requested, reading, finishing };
  grpc_server& owner_;
  grpc::ServerCompletionQueue* cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
  state state_ = state::requested;
};

/// Serialized: a call of the generated service; gRPC decodes the Payload.
template <bool Echo>
class proto_call final : public call_base {
  using reply_type = std::conditional_t<Echo, fwbench::Payload, fwbench::Ack>;

 public:
  proto_call(grpc_server& owner, grpc::ServerCompletionQueue* cq) : owner_(owner), cq_(cq), responder_(&context_) {
    const bool started = owner_.start_op([&] {
      if constexpr (Echo) {
        owner_.service().RequestEcho(&context_, &request_, &responder_, cq_, cq_, this);
      } else {
        owner_.service().RequestPush(&context_, &request_, &responder_, cq_, cq_, this);
      }
    });
    if (!started) delete this;
  }

  void proceed(bool ok) override {
    if (requested_ && ok) {
      requested_ = false;
      new proto_call(owner_, cq_);
      const bool wanted = (owner_.config().reply == reply_kind::echo) == Echo;
      const bool started = owner_.start_op([&] {
        if (!wanted) {
          responder_.FinishWithError(
              grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                           "this PS serves the other method; start it with the same --benchmark and --mode"),
              this);
        } else if constexpr (Echo) {
          reply_.Swap(&request_);
          responder_.Finish(reply_, grpc::Status::OK, this);
        } else {
          std::uint64_t bytes = 0;
          for (const std::string& b : request_.buffers()) bytes += b.size();
          reply_.set_bytes(bytes);
          responder_.Finish(reply_, grpc::Status::OK, this);
        }
      });
      if (started) return;
    }
    delete this;
  }

 private:
  grpc_server& owner_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  fwbench::Payload request_;
  reply_type reply_;
  grpc::ServerAsyncResponseWriter<reply_type> responder_;
  bool requested_ = true;
};

void grpc_server::arm(grpc::ServerCompletionQueue* cq) {
  // A few calls requested ahead so several workers are served without waiting.
  for (int i = 0; i < 4; ++i) {
    if (config_.mode == wire_mode::raw) {
      new generic_call(*this, cq);
    } else {
      new proto_call<true>(*this, cq);
      new proto_call<false>(*this, cq);
    }
  }
}

class grpc_client final : public client {
 public:
  explicit grpc_client(const client_config& config) : config_(config) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<long>(config.transport.connect_timeout_s * 1000));
    for (const endpoint& ep : config.ps) {
      auto channel = grpc::CreateCustomChannel(grpc_address(ep), grpc::InsecureChannelCredentials(), args);
      if (!channel->WaitForConnected(deadline)) {
        throw_error(errc::connection_refused, "grpc: cannot connect to PS " + ep.to_string() + " within " +
                                                  std::to_string(static_cast<int>(config.transport.connect_timeout_s)) +
                                                  " s");
      }
      generic_.push_back(std::make_unique<grpc::GenericStub>(channel));
      stubs_.push_back(fwbench::Bench::NewStub(channel));
      channels_.push_back(std::move(channel));
    }
    slots_.resize(config.ps.size());
  }

  ~grpc_client() override {
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    const bool echo = config_.reply == reply_kind::echo;
    if (config_.mode == wire_mode::raw) {
      slices_.clear();
      for (const_buffer b : payload) slices_.emplace_back(b.data(), b.size(), grpc::Slice::STATIC_SLICE);
      grpc::ByteBuffer request(slices_.data(), slices_.size());
      for (std::size_t p = 0; p < slots_.size(); ++p) {
        slot& s = slots_[p];
        s.context = std::make_unique<grpc::ClientContext>();
        s.raw_reader = generic_[p]->PrepareUnaryCall(s.context.get(), echo ? echo_method : ack_method, request, &cq_);
        s.raw_reader->StartCall();
        s.raw_reader->Finish(&s.raw_reply, &s.status, tag_of(p));
      }
    } else {
      request_.Clear();
      for (const_buffer b : payload) request_.add_buffers(reinterpret_cast<const char*>(b.data()), b.size());
      for (std::size_t p = 0; p < slots_.size(); ++p) {
        slot& s = slots_[p];
        s.context = std::make_unique<grpc::ClientContext>();
        if (echo) {
          s.echo_reader = stubs_[p]->PrepareAsyncEcho(s.context.get(), request_, &cq_);
          s.echo_reader->StartCall();
          s.echo_reader->Finish(&s.echo_reply, &s.status, tag_of(p));
        } else {
          s.ack_reader = stubs_[p]->PrepareAsyncPush(s.context.get(), request_, &cq_);
          s.ack_reader->StartCall();
          s.ack_reader->Finish(&s.ack_reply, &s.status, tag_of(p));
        }
      }
    }
    std::size_t replied = 0;
    for (std::size_t done = 0; done < slots_.size(); ++done) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq_.Next(&tag, &ok)) throw_error(errc::cancelled, "grpc: completion queue shut down");
      const std::size_t p = reinterpret_cast<std::uintptr_t>(tag) - 1;
      replied += check_reply(p, ok, payload, verify);
    }
    return replied;
  }

 private:
  struct slot {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> raw_reader;
    std::unique_ptr<grpc::ClientAsyncResponseReader<fwbench::Payload>> echo_reader;
    std::unique_ptr<grpc::ClientAsyncResponseReader<fwbench::Ack>> ack_reader;
    grpc::ByteBuffer raw_reply;
    fwbench::Payload echo_reply;
    fwbench::Ack ack_reply;
    grpc::Status status;
  };

  static void* tag_of(std::size_t p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p + 1)); }

  std::size_t check_reply(std::size_t p, bool ok, std::span<const const_buffer> payload, bool verify) {
    slot& s = slots_[p];
    const std::string who = "grpc: PS " + std::to_string(p) + " (" + config_.ps[p].to_string() + ")";
    if (!ok || !s.status.ok()) {
      throw_error(errc::connection_reset, who + " failed the call: " + s.status.error_message());
    }
    auto mismatch = [&](const std::string& what) {
      throw_error(errc::malformed_frame, who + " " + what + "; does the PS run the same --benchmark and --mode?");
    };
    const bool echo = config_.reply == reply_kind::echo;
    if (config_.mode == wire_mode::serialized) {
      if (!echo) return s.ack_reply.bytes();
      std::size_t bytes = 0;
      for (const std::string& b : s.echo_reply.buffers()) bytes += b.size();
      if (verify) {
        if (static_cast<std::size_t>(s.echo_reply.buffers_size()) != payload.size()) mismatch("echoed another payload");
        for (std::size_t i = 0; i < payload.size(); ++i) {
          const std::string& got = s.echo_reply.buffers(static_cast<int>(i));
          if (got.size() != payload[i].size() || std::memcmp(got.data(), payload[i].data(), got.size()) != 0) {
            mismatch("echoed different bytes in buffer " + std::to_string(i));
          }
        }
      }
      return bytes;
    }
    if (!echo) {
      grpc::Slice flat;
      std::uint64_t bytes = 0;
      if (!s.raw_reply.TrySingleSlice(&flat).ok() && !s.raw_reply.DumpToSingleSlice(&flat).ok())
        mismatch("sent no ack");
      if (flat.size() != sizeof bytes) mismatch("sent something other than an ack");
      std::memcpy(&bytes, flat.begin(), sizeof bytes);
      return bytes;
    }
    const std::size_t length = s.raw_reply.Length();
    if (verify) {
      std::vector<grpc::Slice> got;
      if (!s.raw_reply.Dump(&got).ok()) mismatch("sent an unreadable reply");
      std::string echoed;
      for (const grpc::Slice& slice : got) echoed.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      std::string sent;
      for (const_buffer b : payload) sent.append(reinterpret_cast<const char*>(b.data()), b.size());
      if (echoed != sent) mismatch("echoed different bytes");
    }
    return length;
  }

  client_config config_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_;
  std::vector<std::unique_ptr<fwbench::Bench::Stub>> stubs_;
  grpc::CompletionQueue cq_;
  std::vector<slot> slots_;
  std::vector<grpc::Slice> slices_;
  fwbench::Payload request_;
};

}  // namespace

backend_info grpc_backend() {
  backend_info info;
  info.name = "grpc";
  info.summary = "gRPC " + grpc::Version() +
                 " C++: async completion queues; generic API with a slice per buffer, or a generated service";
  info.available = true;
  info.make_server = [](const server_config& c) -> std::unique_ptr<server> { return std::make_unique<grpc_server>(c); };
  info.make_client = [](const client_config& c) -> std::unique_ptr<client> { return std::make_unique<grpc_client>(c); };
  return info;
}

}  // namespace fusewire::bench
