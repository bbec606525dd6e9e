#pragma once
/// A listening rdmacm id (`verbs_listener`, a model of fusewire::listener)
/// and the state it shares with pending accepts.

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/transport/verbs/connection.hpp>
#include <fusewire/transport/verbs/connection_state.hpp>
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// Lets the listener wrap accepted states in handles.
class verbs_listener_state_access {
 public:
  static verbs_connection make(ref_ptr<verbs_conn_state> s) noexcept { return verbs_connection(std::move(s)); }
};

/// A listening rdmacm id, shared by its handle and pending work.
class verbs_listener_state final : public ref_counted, public closable, public verbs_cm_target {
 public:
  using handler_type = util::unique_function<void(std::error_code, verbs_connection)>;

  verbs_listener_state(verbs_context& ctx, rdma_cm_id* id, std::uint16_t port)
      : ctx_(&ctx), reactor_(&ctx.reactor()), id_(id), port_(port) {
    id_->context = static_cast<verbs_cm_target*>(this);
    reactor_->add_closable(*this);
  }
  ~verbs_listener_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
    destroy_id();
  }

  verbs_reactor& reactor() const noexcept { return *reactor_; }
  std::uint16_t port() const noexcept { return port_; }
  bool is_open() const noexcept { return open_; }

  void async_accept(handler_type handler) {
    reactor_->work_started();
    pending_.push_back(std::move(handler));
    schedule();
  }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    destroy_id();
    for (auto& c : ready_) c->close();
    ready_.clear();
    schedule();  // completes the pending accepts with errc::cancelled
  }

  void shutdown() noexcept override { close(); }

  void on_cm_event(const event& e) override {
    if (e.type != RDMA_CM_EVENT_CONNECT_REQUEST) return;
    if (!open_ || reactor_->stopping()) {
      rdma_reject(e.id, nullptr, 0);
      rdma_destroy_id(e.id);
      return;
    }
    ref_ptr<verbs_conn_state> conn(new verbs_conn_state(*ctx_, e.id, verbs_conn_state::phase::connecting));
    std::error_code ec;
    if (!conn->take_hello(e.private_data)) {
      reactor_->report("verbs: refused a connection request without a valid fusewire hello");
      ec = make_error_code(errc::handshake_failed);
    } else {
      conn->create_qp(ec);
    }
    if (ec) {
      rdma_reject(e.id, nullptr, 0);
      conn->detach();
      return;
    }
    conn->on_established([self = ref_ptr<verbs_listener_state>(this), conn](std::error_code err) {
      if (err) return;
      if (!self->open_) {
        conn->close();
        return;
      }
      self->ready_.push_back(conn);
      self->schedule();
    });
    const auto pdata = conn->hello();
    rdma_conn_param param{};
    param.private_data = pdata.data();
    param.private_data_len = static_cast<std::uint8_t>(pdata.size());
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_accept(e.id, &param) != 0) {
      reactor_->report("verbs: rdma_accept failed: " + std::system_category().message(errno));
      conn->close();
    }
  }

 private:
  void destroy_id() noexcept {
    if (id_ != nullptr) {
      rdma_destroy_id(id_);
      id_ = nullptr;
    }
  }

  void schedule() noexcept { pump_task_.schedule(*reactor_); }

  void pump() {
    while (!pending_.empty()) {
      if (!open_) {
        handler_type h = std::move(pending_.front());
        pending_.pop_front();
        reactor_->work_finished();
        reactor_->invoke(h, make_error_code(errc::cancelled), verbs_connection());
        continue;
      }
      if (ready_.empty()) break;
      handler_type h = std::move(pending_.front());
      pending_.pop_front();
      ref_ptr<verbs_conn_state> c = std::move(ready_.front());
      ready_.pop_front();
      reactor_->work_finished();
      reactor_->invoke(h, std::error_code(), verbs_listener_state_access::make(std::move(c)));
    }
  }

  verbs_context* ctx_;
  verbs_reactor* reactor_;
  rdma_cm_id* id_;
  std::uint16_t port_;
  bool open_ = true;
  member_task<verbs_listener_state> pump_task_{*this, &verbs_listener_state::pump};  ///< pump, posted
  std::deque<handler_type> pending_;
  std::deque<ref_ptr<verbs_conn_state>> ready_;
};

}  // namespace detail

/// A listening rdmacm id on a verbs_reactor; a model of fusewire::listener.
class verbs_listener : public detail::basic_listener_handle<detail::verbs_listener_state, verbs_connection,
                                                            detail::verbs_listener_name> {
 public:
  verbs_listener() noexcept = default;

 private:
  friend class verbs;
  explicit verbs_listener(detail::ref_ptr<detail::verbs_listener_state> s) noexcept
      : basic_listener_handle(std::move(s)) {}
};

}  // namespace v0
}  // namespace fusewire
